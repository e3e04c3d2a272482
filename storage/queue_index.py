"""The per-queue index, after RabbitMQ's classic queue index (docs/storage.md).

Layout: one directory per queue holding segment files `N.idx`; segment N
covers the seq ids `N*segment_entries .. (N+1)*segment_entries - 1`. A file is
an append-only sequence of `record.encode(body)` records, the body being one
of (big-endian):

    PUBLISH  u8 1 | u64 seq | u8 flags | u64 expiry | u32 size | 16B msg_id [| payload]
             flags: bit 0 persistent, bit 1 embedded (the payload follows),
                    bit 2 delivered (published straight to a consumer)
    DELIVER  u8 2 | u64 seq * n      (n >= 1: every seq of one call that falls
    ACK      u8 3 | u64 seq * n       in this segment, in the order given)

Recovery applies a file's records in file order: PUBLISH makes a seq live
(delivered only with its flag), DELIVER marks a live seq delivered, ACK
forgets it.

In memory, per segment: one bit per slot ("published and not acked") and the
count of set bits, i.e. segment_entries/8 bytes per segment (2 KiB by default,
~1.2 MiB for 10,000,000 messages), plus the segment's AppendFile, and a second
bitmap of the live non-persistent entries once the segment holds one (a
restart drops those). Nothing is kept per message; entries are read back from
disk (`recover`, `read_segment`).

Clean stop and start (storage/summary.py): `write_summary` saves those
bitmaps, the file stamps and the seq bounds; `recover_summary` rebuilds the
index from them without reading a segment, when they match the files.

Invariants:
- every segment in `_segments` has live entries, or is the head (the highest
  segment published into): a segment whose last live entry is acked is
  deleted (its file removed on the writer thread) unless it is the head; the
  head is deleted once publishing moves past it with nothing live in it. This
  keeps a consumer that keeps up from creating and deleting a file per
  message, and leaves at most one fully-acked file on disk.
- every mutation of the files goes through the writer thread, in submission
  order (appends, segment deletion, closing files), so a record queued after
  a deletion lands in a fresh file.
- reads (`read_segment`) are queued behind every write handed over before the
  call (`writer.run(noop)` first, then `writer.read`), and return only the
  seqs live in memory at the call.
"""
from __future__ import annotations

import logging
import os
import struct
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from storage import files as data_files, record, summary
from storage.writer import AppendFile, GroupCommitWriter

log = logging.getLogger("hutch.storage")

PUBLISH, DELIVER, ACK = 1, 2, 3
PERSISTENT, EMBEDDED, DELIVERED = 0x01, 0x02, 0x04

_PUB = struct.Struct(">BQBQI16s")
_PUB_SIZE = _PUB.size  # 38
_ONE = struct.Struct(">BQ")
SUFFIX = ".idx"

# At most this many segment files of one queue are kept open; writing to
# another one first closes the least recently written (on the writer thread).
MAX_OPEN_FILES = 4


@dataclass(slots=True)
class IndexEntry:
    seq: int
    msg_id: bytes  # 16 bytes
    size: int  # body size in bytes
    expiry: int  # ms since epoch, 0 = none
    persistent: bool
    delivered: bool
    payload: bytes | None  # the serialized message when embedded, else None (message store)


@dataclass
class RecoveryReport:
    directory: str = ""
    segments: int = 0  # files scanned
    records: int = 0  # valid records read
    corrupt_regions: int = 0  # regions skipped by record.scan (bad crc/marker/length)
    truncated_bytes: int = 0  # torn tails cut off
    invalid_records: int = 0  # framed fine but not a record of this index (bad kind/length/seq)
    entries: int = 0  # unacked entries on disk after recovery (loaded or not)
    dropped_transient: int = 0  # non-persistent entries forgotten (acked) at recovery
    deleted_segments: list[int] = field(default_factory=list)  # fully acked, removed
    unloaded_segments: list[int] = field(default_factory=list)  # live but not returned (max_entries)
    next_seq: int = 0  # max seq seen + 1 (0 when nothing is on disk)
    first_seq: int = -1  # lowest unacked seq (-1 when none)
    entry_bytes: int = 0  # body bytes of the unacked entries
    segment_expiry: dict = field(default_factory=dict)  # segment -> earliest expiry of its unacked entries
    store_refs: Counter = field(default_factory=Counter)  # msg_id -> live non-embedded entries
    from_summary: bool = False  # loaded from the clean stop's summary: no file was read

    @property
    def damaged(self) -> bool:
        return bool(self.corrupt_regions or self.truncated_bytes or self.invalid_records)


class _Segment:
    __slots__ = ("number", "file", "live", "count", "transient", "expiry")

    def __init__(self, number: int, file: AppendFile, slots: int) -> None:
        self.number = number
        self.file = file
        self.live = bytearray((slots + 7) >> 3)  # bit set = published, not acked
        self.count = 0  # bits set in `live`
        self.transient: bytearray | None = None  # bit set = live and not persistent
        # A lower bound of the earliest expiry of its live entries (0: none):
        # acks never raise it, which only makes an expiry scan come early.
        self.expiry = 0


# Summary (storage/summary.py) body: head, then per segment in ascending order
# SEG, the file's stamp, the live bitmap and, when flagged, the transient one.
_SUMMARY_MAGIC = b"HQIS"
_SUMMARY_VERSION = 2
_SUMMARY_HEAD = struct.Struct(">4sBIQqQI")  # magic, version, segment_entries, next_seq, head, entry bytes, segments
_SUMMARY_SEG = struct.Struct(">QIBQ")  # number, live count, has a transient bitmap, expiry bound


def _noop() -> None:
    return None


class QueueIndex:
    def __init__(self, directory: str, writer: GroupCommitWriter, embed_below: int = 4096,
                 segment_entries: int = 4096, durable: bool = True) -> None:
        """`durable`: False for the index of a queue that is not recovered
        at start (its files only hold paged-out messages): never fsynced."""
        if segment_entries < 1:
            raise ValueError("segment_entries must be at least 1")
        self.directory = directory
        self.next_seq = 0  # max seq published or recovered + 1
        self._writer = writer
        self._fsync = writer.durability == "fsync" and durable
        self._durable = durable
        self.embed_below = embed_below
        self.segment_entries = segment_entries
        self._segments: dict[int, _Segment] = {}
        self._head = -1  # highest segment published into
        self._entries = 0  # live entries, all segments
        self._open: dict[int, _Segment] = {}  # recently written segments, oldest first
        self._last: _Segment | None = None  # the most recently written one
        self._deleted = False
        # The directory is made before the first segment file, not here: a
        # queue that never writes (most exclusive and auto-delete ones) costs
        # the disk nothing, and a declare/delete flood queues no directory
        # jobs for a slow disk to fall behind on. True once it exists or is
        # queued to be made.
        self._directory_made = False
        self.ignored = 0  # deliver/ack of seqs that were not live (caller bugs; metrics)
        # Seqs delivered this loop turn, recorded at its end (`deliver`).
        self._delivered: list[int] = []

    # -- startup (blocking) -------------------------------------------------

    def recover(self, *, max_entries: int | None = None, drop_transient: bool = True
                ) -> tuple[list[IndexEntry], RecoveryReport]:
        """Rebuild the index from its files (blocking, once, before serving).

        Returns the unacked entries in seq order and a report. With
        `max_entries`, whole segments are loaded from the lowest until at
        least that many entries are returned; the others stay on disk
        (`report.unloaded_segments`, read them back with `read_segment`).
        With `drop_transient` (RabbitMQ's behaviour) non-persistent entries
        do not survive a restart: they are acked on disk and not returned."""
        if self._segments or self._deleted:
            raise RuntimeError("recover() must be called once, before any other use")
        self._directory_made = os.path.isdir(self.directory)
        report = RecoveryReport(self.directory)
        summary.discard(self.directory)  # left by a clean stop, but this start scans
        numbers = self._segment_numbers()
        n = self.segment_entries
        max_seq = -1
        loaded: list[IndexEntry] = []
        parsed: list[tuple[_Segment, list[int]]] = []
        for number in numbers:
            path = self._path(number)
            records, scan_report = record.scan_file(path)
            report.segments += 1
            report.records += len(records)
            report.corrupt_regions += len(scan_report.corrupt_records)
            report.truncated_bytes += scan_report.truncated_bytes
            pubs, delivered, invalid, seg_max = _apply(records, number * n, n)
            if invalid:
                report.invalid_records += invalid
                log.error("%s: %d record(s) that are not index records of segment %d skipped",
                          path, invalid, number)
            max_seq = max(max_seq, seg_max)
            seg = _Segment(number, AppendFile(path, sync=self._fsync, kept=self._durable), n)
            dropped = []
            live = seg.live
            base = number * n
            for seq in sorted(pubs):
                flags, expiry, size, msg_id, payload = pubs[seq]
                i = seq - base
                if not flags & PERSISTENT:
                    if drop_transient:
                        dropped.append(seq)
                        continue
                    _set_transient(seg, i)
                live[i >> 3] |= 1 << (i & 7)
                seg.count += 1
                report.entry_bytes += size
                if expiry and expiry < report.segment_expiry.get(number, expiry + 1):
                    report.segment_expiry[number] = seg.expiry = expiry
                if report.first_seq < 0 or seq < report.first_seq:
                    report.first_seq = seq
                if payload is None:
                    report.store_refs[msg_id] += 1
                if max_entries is None or len(loaded) < max_entries or (
                        loaded and loaded[-1].seq >= base):  # finish the segment begun
                    loaded.append(IndexEntry(seq, msg_id, size, expiry, bool(flags & PERSISTENT),
                                             seq in delivered, payload))
                elif not report.unloaded_segments or report.unloaded_segments[-1] != number:
                    report.unloaded_segments.append(number)
            report.dropped_transient += len(dropped)
            parsed.append((seg, dropped))
            del pubs, delivered, records
        head = max_seq // n if max_seq >= 0 else -1
        self._head = head
        self.next_seq = max_seq + 1
        for seg, dropped in parsed:
            if seg.count == 0 and seg.number != head:
                report.deleted_segments.append(seg.number)
                self._writer.run(self._delete_job(seg.file))
                continue
            self._segments[seg.number] = seg
            self._entries += seg.count
            if dropped:
                self._append(seg, _seqs_body(ACK, dropped))
        report.entries = self._entries
        report.next_seq = self.next_seq
        (log.warning if report.damaged else log.info)(
            "queue index %s: %d entries in %d segment(s), %d records, %d corrupt region(s), "
            "%d torn bytes, %d invalid record(s), %d transient dropped", self.directory,
            report.entries, report.segments, report.records, report.corrupt_regions,
            report.truncated_bytes, report.invalid_records, report.dropped_transient)
        return loaded, report

    def recover_summary(self) -> RecoveryReport | None:
        """At a clean start, instead of `recover(max_entries=0)` (blocking,
        once, before serving): the index as the clean stop's summary
        describes it, reading no segment; non-persistent entries are dropped
        as `recover` drops them. The summary is removed as it is read. None
        (logged) when it is missing or does not match the files: then call
        `recover`. `report.store_refs` stays empty (see `store_refs`)."""
        if self._segments or self._deleted:
            raise RuntimeError("recover_summary() must be called once, before any other use")
        self._directory_made = os.path.isdir(self.directory)
        body, why = summary.take(self.directory)
        loaded = self._parse_summary(body) if body is not None else why
        if isinstance(loaded, str):
            if body is not None or self._segment_numbers():
                log.warning("queue index %s: recovery summary not used (%s): scanning", self.directory, loaded)
            return None
        head, next_seq, entry_bytes, segments = loaded
        report = RecoveryReport(self.directory, segments=len(segments), next_seq=next_seq,
                                entry_bytes=entry_bytes, from_summary=True)
        self._head, self.next_seq = head, next_seq
        n = self.segment_entries
        for number, size, live, count, transient, expiry in segments:
            seg = _Segment(number, AppendFile(self._path(number), size=size, sync=self._fsync, kept=self._durable), n)
            seg.live, seg.count, seg.expiry = live, count, expiry
            dropped = []
            if transient is not None:
                for byte_no, byte in enumerate(transient):
                    for bit in range(8) if byte else ():
                        if byte >> bit & 1:
                            dropped.append(number * n + byte_no * 8 + bit)
                            live[byte_no] &= ~(1 << bit)
                seg.count -= len(dropped)
                report.dropped_transient += len(dropped)
            if seg.count == 0 and number != head:
                report.deleted_segments.append(number)
                self._writer.run(self._delete_job(seg.file))
                continue
            self._segments[number] = seg
            self._entries += seg.count
            if expiry:
                report.segment_expiry[number] = expiry
            if report.first_seq < 0 and seg.count:
                byte_no = next(i for i, byte in enumerate(live) if byte)
                report.first_seq = number * n + byte_no * 8 + (live[byte_no] & -live[byte_no]).bit_length() - 1
            if dropped:
                self._append(seg, _seqs_body(ACK, dropped))
        report.entries = self._entries
        log.info("queue index %s: %d entries in %d segment(s) loaded from its recovery summary (no scan), "
                 "%d transient dropped", self.directory, report.entries, report.segments, report.dropped_transient)
        return report

    def _parse_summary(self, body: bytes):
        """(head, next_seq, entry bytes, [(number, size, live, count,
        transient or None, expiry bound)]) from a summary that matches the
        files, else why not."""
        try:
            magic, version, n, next_seq, head, entry_bytes, count = _SUMMARY_HEAD.unpack_from(body)
        except struct.error:
            return "the summary is cut short"
        if magic != _SUMMARY_MAGIC or version != _SUMMARY_VERSION:
            return "not a queue index summary of version %d" % _SUMMARY_VERSION
        if n != self.segment_entries:
            return "it was written with segment_entries %d" % n
        width = (n + 7) >> 3
        pos = _SUMMARY_HEAD.size
        segments = []
        stamps = {}
        try:
            for _ in range(count):
                number, live_count, has_transient, expiry = _SUMMARY_SEG.unpack_from(body, pos)
                pos += _SUMMARY_SEG.size
                if number in stamps:
                    return "segment %d twice in the summary" % number
                stamps[number] = body[pos:pos + summary.STAMP.size]
                size = summary.stamp_size(stamps[number])
                pos += summary.STAMP.size
                bitmaps = []
                for _bitmap in range(2 if has_transient else 1):
                    bitmaps.append(bytearray(body[pos:pos + width]))
                    pos += width
                    if len(bitmaps[-1]) != width:
                        return "the summary is cut short"
                live = int.from_bytes(bitmaps[0], "big")
                if live.bit_count() != live_count:
                    return "segment %d: the count does not match the bitmap" % number
                if has_transient and int.from_bytes(bitmaps[1], "big") & ~live:
                    return "segment %d: transient entries that are not live" % number
                segments.append((number, size, bitmaps[0], live_count, bitmaps[1] if has_transient else None, expiry))
        except struct.error:
            return "the summary is cut short"
        if pos != len(body):
            return "the summary has trailing bytes"
        if stamps and (head < max(stamps) or next_seq <= max(stamps) * n):
            return "its seq bounds do not cover its segments"
        on_disk = set(self._segment_numbers())
        if on_disk != set(stamps):
            return "segment files %s on disk, %s in the summary" % (sorted(on_disk), sorted(stamps))
        for number, recorded in stamps.items():
            if summary.stamp(self._path(number)) != recorded:
                return "segment %d changed since the stop" % number
        return head, next_seq, entry_bytes, segments

    def write_summary(self, entry_bytes: int) -> None:
        """At a clean stop, after the writer has stopped (blocking): save what
        `recover` would find, for `recover_summary`. `entry_bytes`: the body
        bytes of the live persistent entries (the caller keeps that count).
        Raises OSError when a file is not as the index believes it is."""
        n = self.segment_entries
        parts = [_SUMMARY_HEAD.pack(_SUMMARY_MAGIC, _SUMMARY_VERSION, n, self.next_seq, self._head,
                                    entry_bytes, len(self._segments))]
        for number in sorted(self._segments):
            seg = self._segments[number]
            parts += [_SUMMARY_SEG.pack(number, seg.count, seg.transient is not None, seg.expiry),
                      summary.stamp(seg.file.path, seg.file.size), seg.live]
            if seg.transient is not None:
                parts.append(seg.transient)
        summary.write(self.directory, b"".join(parts))

    def store_refs(self) -> Counter:
        """msg_id -> live persistent entries whose message is in the message
        store, read from the segment files (blocking, at start): what
        `recover` reports, for an index that came from its summary when the
        message store must be scanned after all."""
        refs: Counter = Counter()
        n = self.segment_entries
        for number, seg in self._segments.items():
            if seg.count:
                for entry in _read_segment_file(seg.file.path, seg.file.size, number * n, n, bytes(seg.live)):
                    if entry.payload is None and entry.persistent:
                        refs[entry.msg_id] += 1
        return refs

    @property
    def deleted(self) -> bool:
        return self._deleted

    @property
    def segments_on_disk(self) -> int:
        """Segment files of this index (live, or the head)."""
        return len(self._segments)

    # -- on the event loop: the hot path ------------------------------------

    def publish(self, seq: int, msg_id: bytes, size: int, payload: bytes, expiry: int = 0,
                persistent: bool = True, done: Callable[[], None] | None = None, delivered: bool = False) -> bool:
        """Record a publish; True when `payload` was embedded in the index
        (then it need not go to the message store). `done` runs on the loop
        once the record is durable (writer semantics). `delivered`: the
        message went to a consumer as it was published; the record says so
        itself, instead of a DELIVER record after it."""
        n = self.segment_entries
        number = seq // n
        seg = self._segments.get(number)
        if seg is None:
            if self._deleted:
                raise RuntimeError("queue index %s was deleted" % self.directory)
            if seq < 0 or len(msg_id) != 16:
                raise ValueError("seq must be >= 0 and msg_id 16 bytes")
            if not self._directory_made:
                self._directory_made = True
                self._writer.run(self._make_directory)
            seg = self._segments[number] = _Segment(number, AppendFile(self._path(number), size=0, sync=self._fsync, kept=self._durable), n)
        elif len(msg_id) != 16:
            raise ValueError("msg_id must be 16 bytes")
        i = seq - number * n
        bit = 1 << (i & 7)
        live = seg.live
        if live[i >> 3] & bit:
            raise ValueError("seq %d is already published and not acked" % seq)
        embed = len(payload) < self.embed_below
        flags = (PERSISTENT if persistent else 0) | (DELIVERED if delivered else 0)
        if embed:
            body = _PUB.pack(PUBLISH, seq, flags | EMBEDDED, expiry, size, msg_id) + payload
        else:
            body = _PUB.pack(PUBLISH, seq, flags, expiry, size, msg_id)
        live[i >> 3] |= bit
        seg.count += 1
        self._entries += 1
        if expiry and (not seg.expiry or expiry < seg.expiry):
            seg.expiry = expiry
        if not persistent:
            _set_transient(seg, i)
        if seq >= self.next_seq:
            self.next_seq = seq + 1
        self._append(seg, body, done)
        if number > self._head:
            old = self._segments.get(self._head)
            self._head = number
            if old is not None and old.count == 0:
                self._drop(old)
        return embed

    def deliver(self, seqs: Sequence[int]) -> None:
        """Mark live seqs delivered: recorded with the other deliveries of
        this loop turn at its end (GroupCommitWriter.soon; a clean stop, or
        a read of the index, records them first), one DELIVER record per
        segment touched, without those acked meanwhile. A delivery costs the
        disk nothing then when its ack follows within the turn, and one
        record per turn otherwise (per message, the records were a tenth of
        a persistent message's cost). Nothing waits for them: after a crash
        every message comes back redelivered anyway (docs/storage.md)."""
        live = [seq for seq in seqs if self.is_live(seq)]
        self.ignored += len(seqs) - len(live)
        if live:
            if not self._delivered:
                self._writer.soon(self._record_delivered)
            self._delivered += live

    def _record_delivered(self) -> None:
        seqs, self._delivered = self._delivered, []
        if seqs and not self._deleted:
            self._mark(seqs, DELIVER, acked_meanwhile=True)

    def ack(self, seqs: Iterable[int]) -> None:
        """Forget live seqs (one ACK record per segment touched); a segment
        left with nothing live is deleted unless it is the head."""
        self._mark(seqs, ACK)

    def read_segment(self, segment: int, done: Callable[[list[IndexEntry] | Exception], None]) -> None:
        """The entries of `segment` live at this call, in seq order, read off
        the loop; `done(list or exception)` runs on the loop. The read is
        queued behind every write handed to the writer before this call, so
        no precondition on durability; deliveries recorded after the call may
        show up in the delivered flags."""
        self._record_delivered()
        seg = self._segments.get(segment)
        if seg is None or seg.count == 0:
            self._writer.loop.call_soon(done, [])
            return
        snapshot = bytes(seg.live)
        path, limit, n = seg.file.path, seg.file.size, self.segment_entries
        writer = self._writer

        def read() -> list[IndexEntry]:
            return _read_segment_file(path, limit, segment * n, n, snapshot)

        writer.run(_noop, lambda _result: writer.read(read, done))

    def is_live(self, seq: int) -> bool:
        """Whether `seq` is published and not acked."""
        n = self.segment_entries
        seg = self._segments.get(seq // n)
        if seg is None:
            return False
        i = seq - seg.number * n
        return bool(seg.live[i >> 3] & (1 << (i & 7)))

    def segments(self) -> list[int]:
        """Segment numbers holding live entries, ascending."""
        return sorted(number for number, seg in self._segments.items() if seg.count)

    def delete(self) -> None:
        """The queue is gone: close and remove every file (writer thread),
        then the directory. The object is unusable afterwards."""
        if self._deleted:
            return
        self._deleted = True
        segment_files = [seg.file for seg in self._segments.values()]
        self._segments.clear()
        self._open.clear()
        self._last = None
        self._entries = 0
        if not self._directory_made:
            return
        directory = self.directory

        def job() -> None:
            data_files.removed(directory)  # a follower removes the whole directory
            for file in segment_files:
                file.close()
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return
            for name in names:
                if name.endswith(SUFFIX) or summary.is_summary(name):
                    try:
                        os.unlink(os.path.join(directory, name))
                    except FileNotFoundError:
                        pass
            try:
                os.rmdir(directory)
            except OSError as exc:
                log.warning("queue index directory %s not removed: %s", directory, exc)

        self._writer.run(job)

    def close(self) -> None:
        """Close the open files (on the writer thread, after what is queued);
        for a clean stop. Files reopen on the next write."""
        files = [seg.file for seg in self._open.values()]
        self._open.clear()
        self._last = None
        for file in files:
            self._writer.run(self._close_job(file))

    def stats(self) -> dict:
        segments = self._segments.values()
        return {
            "segments": len(self._segments),
            "bytes_on_disk": sum(seg.file.size for seg in segments),
            "entries": self._entries,
            # RAM the index keeps for its entries: per segment a bitmap and two small objects
            "bookkeeping_bytes": sum(sys.getsizeof(seg) + sys.getsizeof(seg.live) + sys.getsizeof(seg.file)
                                     for seg in segments),
        }

    # -- internals -----------------------------------------------------------

    def _segment_numbers(self) -> list[int]:
        """The numbers of the segment files on disk, ascending (blocking)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        numbers = []
        for name in names:
            stem = name[:-len(SUFFIX)]
            if name.endswith(SUFFIX) and stem.isdigit() and str(int(stem)) == stem:
                numbers.append(int(stem))
            elif not summary.is_summary(name):
                log.warning("%s: ignoring unexpected file %r", self.directory, name)
        numbers.sort()
        return numbers

    def _path(self, number: int) -> str:
        return os.path.join(self.directory, "%d%s" % (number, SUFFIX))

    def _mark(self, seqs: Iterable[int], kind: int, acked_meanwhile: bool = False) -> None:
        """`acked_meanwhile`: seqs no longer live were acked after they were
        delivered (`deliver`), not given by mistake (`ignored`)."""
        n = self.segment_entries
        segments = self._segments
        ack = kind == ACK
        groups: dict[int, list[int]] = {}
        cur_no = -1
        seg = None
        group: list[int] = []
        for seq in seqs:
            number = seq // n
            if number != cur_no:
                seg = segments.get(number)
                cur_no = number
                if seg is not None:
                    group = groups.get(number)
                    if group is None:
                        group = groups[number] = []
            if seg is None:
                self.ignored += not acked_meanwhile
                continue
            i = seq - number * n
            bit = 1 << (i & 7)
            live = seg.live
            if not live[i >> 3] & bit:
                self.ignored += not acked_meanwhile
                continue
            if ack:
                live[i >> 3] ^= bit
                seg.count -= 1
                self._entries -= 1
                if seg.transient is not None:
                    seg.transient[i >> 3] &= ~bit
            group.append(seq)
        for number, group in groups.items():
            if not group:
                continue
            seg = segments[number]
            self._append(seg, _ONE.pack(kind, group[0]) if len(group) == 1 else _seqs_body(kind, group))
            if ack and seg.count == 0 and number != self._head:
                self._drop(seg)

    def _append(self, seg: _Segment, body: bytes, done: Callable[[], None] | None = None) -> None:
        """Hand one record to the writer, keeping at most MAX_OPEN_FILES of
        this queue's files open. In fsync mode the directory is synced after
        a file's first record, so the new name is as durable as the record."""
        if seg is not self._last:
            opened = self._open
            opened.pop(seg.number, None)
            opened[seg.number] = seg
            self._last = seg
            if len(opened) > MAX_OPEN_FILES:
                oldest = next(iter(opened))
                self._writer.run(self._close_job(opened.pop(oldest).file))
        first = self._fsync and seg.file.size == 0
        self._writer.append(seg.file, record.encode(body), done)
        if first:
            self._writer.run(self._sync_directory)

    def _drop(self, seg: _Segment) -> None:
        """`seg` has nothing live: forget it and delete its file."""
        del self._segments[seg.number]
        self._open.pop(seg.number, None)
        if self._last is seg:
            self._last = None
        self._writer.run(self._delete_job(seg.file))

    # -- jobs for the writer thread -------------------------------------------

    def _make_directory(self) -> None:
        if not os.path.isdir(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            if self._fsync:
                _fsync_dir(os.path.dirname(os.path.abspath(self.directory)))

    def _sync_directory(self) -> None:
        _fsync_dir(self.directory)

    def _close_job(self, file: AppendFile) -> Callable[[], None]:
        fsync = self._fsync

        def job() -> None:
            # The batch's sync skips closed files: sync what this batch wrote first.
            if fsync:
                file._sync()
            file.close()
        return job

    def _delete_job(self, file: AppendFile) -> Callable[[], None]:
        fsync, directory = self._fsync, self.directory

        def job() -> None:
            file.close()
            try:
                data_files.remove(file.path)
            except FileNotFoundError:
                return
            if fsync:  # so a crash cannot bring the acked segment back
                _fsync_dir(directory)
        return job


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _set_transient(seg: _Segment, i: int) -> None:
    if seg.transient is None:
        seg.transient = bytearray(len(seg.live))
    seg.transient[i >> 3] |= 1 << (i & 7)


def _seqs_body(kind: int, seqs: list[int]) -> bytes:
    return struct.pack(">B%dQ" % len(seqs), kind, *seqs)


def _apply(records: list[tuple[int, bytes]], base: int, n: int):
    """Replay one segment's records in file order: (publishes by seq as
    (flags, expiry, size, msg_id, payload or None), delivered seqs, invalid
    record count, max seq seen or -1)."""
    pubs: dict[int, tuple] = {}
    delivered: set[int] = set()
    invalid = 0
    max_seq = -1
    end = base + n
    for _offset, body in records:
        kind = body[0] if body else 0
        if kind == PUBLISH and len(body) >= _PUB_SIZE:
            _, seq, flags, expiry, size, msg_id = _PUB.unpack_from(body)
            embedded = flags & EMBEDDED
            if not base <= seq < end or (not embedded and len(body) != _PUB_SIZE):
                invalid += 1
                continue
            pubs[seq] = (flags, expiry, size, msg_id, body[_PUB_SIZE:] if embedded else None)
            if flags & DELIVERED:
                delivered.add(seq)
            else:
                delivered.discard(seq)
            if seq > max_seq:
                max_seq = seq
        elif (kind == DELIVER or kind == ACK) and len(body) > 1 and (len(body) - 1) % 8 == 0:
            seqs = struct.unpack_from(">%dQ" % ((len(body) - 1) // 8), body, 1)
            if not all(base <= seq < end for seq in seqs):
                invalid += 1
                continue
            if kind == ACK:
                for seq in seqs:
                    pubs.pop(seq, None)
                    delivered.discard(seq)
            else:
                delivered.update(seq for seq in seqs if seq in pubs)
            top = max(seqs)
            if top > max_seq:
                max_seq = top
        else:
            invalid += 1
    return pubs, delivered, invalid, max_seq


def _read_segment_file(path: str, limit: int, base: int, n: int, live: bytes) -> list[IndexEntry]:
    """On the reader thread: the entries of one segment file whose bit is set
    in `live`, in seq order; reads at most `limit` bytes (what was handed to
    the writer before the read was asked for)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except FileNotFoundError:
        return []
    records, report = record.scan(data, path)
    if report.corrupt_records:
        report.log()
    pubs, delivered, invalid, _ = _apply(records, base, n)
    if invalid:
        log.error("%s: %d record(s) that are not index records skipped", path, invalid)
    entries = []
    for seq in sorted(pubs):
        i = seq - base
        if live[i >> 3] & (1 << (i & 7)):
            flags, expiry, size, msg_id, payload = pubs[seq]
            entries.append(IndexEntry(seq, msg_id, size, expiry, bool(flags & PERSISTENT),
                                      seq in delivered, payload))
    missing = int.from_bytes(live, "big").bit_count() - len(entries)
    if missing > 0:
        log.error("%s: %d live entries have no publish record", path, missing)
    return entries
