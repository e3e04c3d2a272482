"""The shared message store of one vhost (RabbitMQ's `rabbit_msg_store`).

One copy of each message body however many queues hold it, in append-only
files `N.rdq` of `directory`; each record is `record.encode(msg_id + payload)`
(16-byte id, then the serialized message). An in-memory index maps each id
to an `_Entry` (file, offset, record size, reference count).

Threads and callbacks
- Every public method is called on the event loop thread (`writer.loop`),
  except `recover` and `wipe`, which block and are meant for startup, before
  anything is written.
- Appends go through `writer.append`; compaction, file creation and deletion
  through `writer.run` (the writer thread, in submission order); disk reads
  through `writer.read` (the reader thread). Every `done` callback runs on the
  loop: `write`'s after the group commit holding the bytes (or, for a
  duplicate of an id already durable, after the next writer batch), `read`'s
  with the payload or an exception object.

Invariants
1. An id is in `_index` iff its refcount is > 0. An entry whose refcount
   reached 0 is dropped from the index and from its file's `entries` and is
   never revived (a later `write` of the same id makes a new entry).
   `_Entry.refs` is written only on the loop.
2. `_File.live` = sum of the sizes of the entries in `_File.entries`;
   `_File.total` = the size of the file (what was appended, or what the last
   compaction wrote). Dead bytes = total - live.
3. Only the current file (`_cur`) is appended to. It is never compacted or
   deleted while current; a file stops being current on roll (when the next
   record would take it past `file_size_limit`) or when it is retired (all
   of it dead and at least half the limit big), and its append fd is closed
   by a writer job queued after its last append.
4. A non-current file with live == 0 is deleted; one with live < total / 2 is
   compacted. At most one compaction per file is in flight (`compacting`),
   and a file being compacted is not deleted; both are re-checked when the
   compaction completes.
5. While an entry's payload is not None its bytes may not be on disk yet:
   `read` answers from that (the pending cache). The writer's done for the
   append (the entry itself, being callable) clears it, so a read that goes
   to disk only ever targets bytes already written.
6. `_Entry.offset` is written on the loop only when the entry is created (before
   anyone else can see it), and afterwards only by the compaction of its file,
   on the writer thread, while holding `_lock`, in the same critical section
   as the `os.replace` that swaps the compacted file in. The reader thread
   takes `_lock` to check the entry is alive, read its offset and open the
   file: the fd it gets and the offset always belong to the same version of
   the file (the pread itself runs outside the lock: an fd keeps its inode
   alive through a later rename or unlink). File deletion also unlinks under
   `_lock`.
7. Compaction copies the entries of a snapshot taken on the loop (the file's
   live entries when it is scheduled). Entries removed meanwhile are still
   copied (their bytes count as dead in the new file, their refs are 0 so
   readers refuse them); a new file never gains entries (not current).
   The compacted file is written to `N.rdq.compact`, fsynced, renamed over
   `N.rdq`, then the directory is fsynced; a crash leaves either the old or
   the new file complete, and recovery deletes a leftover `.compact`.
8. New files are created by a writer job queued before their first append,
   which also fsyncs the directory (durability "fsync"), so a confirmed
   record's file entry survives a power loss.
"""
from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable

from storage import files as data_files, summary
from storage.record import OVERHEAD, scan_file
from storage.writer import AppendFile, GroupCommitWriter

log = logging.getLogger("hutch.storage")

ID_SIZE = 16
_LENGTH = struct.Struct(">I")  # record.py framing: u32 length | body | u32 crc | u8 0xFF
_TRAILER = struct.Struct(">IB")
_END_MARKER = 0xFF
_FILE_NAME = re.compile(r"^(\d+)\.rdq$")
_BY_OFFSET = attrgetter("offset")

# Summary (storage/summary.py) body: head, the referrers (32 ASCII characters
# each), per file FILE and its stamp, then one ENTRY per message id.
_SUMMARY_MAGIC = b"HMSS"
_SUMMARY_VERSION = 1
_SUMMARY_HEAD = struct.Struct(">4sBQIII")  # magic, version, next file number, files, entries, referrers
_REFERRER = 32
_SUMMARY_FILE = struct.Struct(">Q")  # file number
_SUMMARY_ENTRY = struct.Struct(">16sQQII")  # msg id, file number, offset, record size, references


def _encode(msg_id: bytes, payload: bytes) -> bytes:
    """`record.encode(msg_id + payload)` without building msg_id + payload."""
    return b"".join((_LENGTH.pack(ID_SIZE + len(payload)), msg_id, payload,
                     _TRAILER.pack(zlib.crc32(payload, zlib.crc32(msg_id)), _END_MARKER)))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StoreError(Exception):
    """A message could not be read back (missing, removed, or damaged)."""


class _File:
    __slots__ = ("num", "path", "af", "total", "live", "entries", "compacting")

    def __init__(self, num: int, path: str, af: AppendFile | None) -> None:
        self.num = num
        self.path = path
        self.af = af  # only while current
        self.total = 0
        self.live = 0
        self.entries: set[_Entry] = set()
        self.compacting = False


class _Entry:
    """Where one message lives. Callable: it is the writer's `done` for its
    own append (the bytes are written: drop the cached payload, fire waiters)."""

    __slots__ = ("file", "offset", "size", "refs", "payload", "waiters")

    def __init__(self, file: _File, offset: int, size: int, payload: bytes | None,
                 waiters: object) -> None:
        self.file = file
        self.offset = offset
        self.size = size
        self.refs = 1
        self.payload = payload  # not None while the append is pending
        self.waiters = waiters  # None, one callable, or a list of them

    def __call__(self) -> None:
        self.payload = None
        waiters = self.waiters
        if waiters is not None:
            self.waiters = None
            if type(waiters) is list:
                for done in waiters:
                    done()
            else:
                waiters()


@dataclass
class RecoveryReport:
    files_scanned: int = 0
    records: int = 0  # valid records found
    corrupt_regions: int = 0  # regions skipped because they did not check out
    truncated_bytes: int = 0  # torn tails cut off
    missing: set[bytes] = field(default_factory=set)  # ids in refcounts found in no file
    garbage_records: int = 0  # records nobody references (dead bytes)
    duplicates: int = 0  # second copies of an id already found (dead bytes)
    files_deleted: int = 0  # files with nothing live, deleted at once


def _noop() -> None:
    return None


def _after_batch(done: Callable[[], None]) -> Callable[[object], None]:
    return lambda _result: done()


class MessageStore:
    def __init__(self, directory: str, writer: GroupCommitWriter,
                 file_size_limit: int = 16 * 1024 * 1024, durable: bool = True) -> None:
        """`durable`: False for the transient store (wiped at start): its
        files are never fsynced."""
        self.directory = directory
        self._writer = writer
        self._durable = durable
        self._sync = writer.durability == "fsync" and durable
        self._limit = file_size_limit
        self._index: dict[bytes, _Entry] = {}
        self._files: dict[int, _File] = {}
        self._cur: _File | None = None
        self._next_num: int | None = None  # set by recover / wipe
        self._lock = threading.Lock()  # invariant 6
        self._busy = 0  # compactions and deletions queued on the writer, not yet done
        self.compactions = 0
        self.deletions = 0

    # -- startup (blocking) --------------------------------------------------

    def wipe(self) -> None:
        """Delete every file of the store (the transient store, at start)."""
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if os.path.isfile(path):
                os.unlink(path)
        self._reset()
        self._next_num = 0

    def recover(self, refcounts: dict[bytes, int]) -> RecoveryReport:
        """Rebuild the index from the files (blocking; at start, before any
        write). `refcounts`: how many references each id should have, from
        the queue indexes; records of other ids are garbage."""
        os.makedirs(self.directory, exist_ok=True)
        self._reset()
        summary.discard(self.directory)  # left by a clean stop, but this start scans
        report = RecoveryReport()
        nums = []
        for name in os.listdir(self.directory):
            if name.endswith(".rdq.compact"):  # a compaction cut short: N.rdq is intact
                os.unlink(os.path.join(self.directory, name))
                continue
            match = _FILE_NAME.match(name)
            if match:
                nums.append(int(match.group(1)))
        nums.sort()
        index = self._index
        for num in nums:
            path = self._path(num)
            records, scan = scan_file(path)
            report.files_scanned += 1
            report.corrupt_regions += len(scan.corrupt_records)
            report.truncated_bytes += scan.truncated_bytes
            file = _File(num, path, None)
            file.total = scan.valid_end
            self._files[num] = file
            for offset, body in records:
                report.records += 1
                msg_id = body[:ID_SIZE]
                if len(body) < ID_SIZE:
                    report.garbage_records += 1
                elif msg_id in index:
                    report.duplicates += 1
                elif refcounts.get(msg_id, 0) > 0:
                    entry = _Entry(file, offset, len(body) + OVERHEAD, None, None)
                    entry.refs = refcounts[msg_id]
                    index[msg_id] = entry
                    file.entries.add(entry)
                    file.live += entry.size
                else:
                    report.garbage_records += 1
        report.missing = {msg_id for msg_id, refs in refcounts.items()
                          if refs > 0 and msg_id not in index}
        self._settle(nums[-1] + 1 if nums else 0, report)
        if report.missing:
            log.error("message store %s: %d message(s) referenced by queues are missing",
                      self.directory, len(report.missing))
        log.info("message store %s recovered: %d file(s), %d message(s), %d garbage record(s), "
                 "%d corrupt region(s), %d byte(s) of torn tail", self.directory,
                 report.files_scanned, len(index), report.garbage_records,
                 report.corrupt_regions, report.truncated_bytes)
        return report

    def _settle(self, next_num: int, report: RecoveryReport) -> None:
        """End of recovery: choose the file to append to, delete the files
        with nothing live, compact the sparse ones."""
        self._next_num = next_num
        if self._files:  # keep appending to the last file while it has live data and room
            last = self._files[max(self._files)]
            if last.live and last.total < self._limit:
                last.af = AppendFile(last.path, sync=self._sync, bodies=True, kept=self._durable)
                last.total = last.af.size
                self._cur = last
        for file in list(self._files.values()):
            if file is not self._cur and file.live == 0:
                os.unlink(file.path)
                del self._files[file.num]
                report.files_deleted += 1
        if report.files_deleted:
            _fsync_dir(self.directory)
        for file in list(self._files.values()):
            self._check(file)

    def write_summary(self, referrers: list[str]) -> None:
        """At a clean stop, after the writer has stopped (blocking): save the
        index (id -> file, offset, size, references) and the files' stamps
        for `recover_summary`. `referrers`: names of whoever holds the
        references counted (the queue indexes summarized with it). Raises
        OSError when a file is not as the store believes it is."""
        files = sorted(self._files.values(), key=attrgetter("num"))
        parts = [_SUMMARY_HEAD.pack(_SUMMARY_MAGIC, _SUMMARY_VERSION, self._next_num or 0,
                                    len(files), len(self._index), len(referrers))]
        for name in referrers:
            if len(name.encode()) != _REFERRER:
                raise ValueError("a referrer name must be %d ASCII characters" % _REFERRER)
            parts.append(name.encode())
        for file in files:
            parts += [_SUMMARY_FILE.pack(file.num), summary.stamp(file.path, file.total)]
        pack = _SUMMARY_ENTRY.pack
        parts += [pack(msg_id, entry.file.num, entry.offset, entry.size, entry.refs)
                  for msg_id, entry in self._index.items()]
        summary.write(self.directory, b"".join(parts))

    def recover_summary(self, referrers: set[str]) -> RecoveryReport | None:
        """At a clean start, instead of `recover` (blocking, before any
        write): the index as the clean stop's summary describes it, reading
        no message. The summary is removed as it is read. Its reference
        counts hold only if the same `referrers` were summarized with it
        (and those recovered from their summaries). None (logged) when it is
        missing or does not match: then call `recover`."""
        os.makedirs(self.directory, exist_ok=True)
        self._reset()
        body, why = summary.take(self.directory)
        if body is not None:
            why = self._load_summary(body, referrers)
        elif not any(map(_FILE_NAME.match, os.listdir(self.directory))):
            return None  # nothing stored (a new vhost): nothing to scan either
        if why:
            self._reset()
            log.warning("message store %s: recovery summary not used (%s): scanning", self.directory, why)
            return None
        report = RecoveryReport()
        self._settle(self._next_num, report)
        log.info("message store %s: %d message(s) in %d file(s) loaded from its recovery summary (no scan)",
                 self.directory, len(self._index), len(self._files))
        return report

    def _load_summary(self, body: bytes, referrers: set[str]) -> str:
        """Fill the index from a summary; "" or why it cannot be used."""
        try:
            magic, version, next_num, nfiles, nentries, nreferrers = _SUMMARY_HEAD.unpack_from(body)
        except struct.error:
            return "the summary is cut short"
        if magic != _SUMMARY_MAGIC or version != _SUMMARY_VERSION:
            return "not a message store summary of version %d" % _SUMMARY_VERSION
        pos = _SUMMARY_HEAD.size
        recorded = {body[at:at + _REFERRER].decode("ascii", "replace")
                    for at in range(pos, pos + nreferrers * _REFERRER, _REFERRER)}
        pos += nreferrers * _REFERRER
        if recorded != referrers:
            return "its reference counts are from queues %s, recovered from summaries %s" % (
                sorted(recorded - referrers), sorted(referrers - recorded))
        file_size = _SUMMARY_FILE.size + summary.STAMP.size
        if len(body) != pos + nfiles * file_size + nentries * _SUMMARY_ENTRY.size:
            return "the summary is cut short"
        stamps = {}
        for at in range(pos, pos + nfiles * file_size, file_size):
            stamps[_SUMMARY_FILE.unpack_from(body, at)[0]] = body[at + _SUMMARY_FILE.size:at + file_size]
        pos += nfiles * file_size
        names = os.listdir(self.directory)
        on_disk = {int(m.group(1)) for m in map(_FILE_NAME.match, names) if m}
        if on_disk != set(stamps) or any(name.endswith(".rdq.compact") for name in names):
            return "files %s on disk, %s in the summary" % (sorted(on_disk), sorted(stamps))
        files = self._files
        for num, stamp in stamps.items():
            path = self._path(num)
            if summary.stamp(path) != stamp:
                return "%s changed since the stop" % path
            file = files[num] = _File(num, path, None)
            file.total = summary.stamp_size(stamp)
        index = self._index
        for msg_id, num, offset, size, refs in _SUMMARY_ENTRY.iter_unpack(memoryview(body)[pos:]):
            file = files.get(num)
            if file is None or offset + size > file.total or refs < 1:
                return "an entry points outside the files"
            entry = _Entry(file, offset, size, None, None)
            entry.refs = refs
            index[bytes(msg_id)] = entry
            file.entries.add(entry)
            file.live += size
        if len(index) != nentries:
            return "an id appears twice"
        self._next_num = max(next_num, max(files) + 1 if files else 0)
        return ""

    def _reset(self) -> None:
        self._index.clear()
        self._files.clear()
        self._cur = None

    # -- on the loop ---------------------------------------------------------

    def write(self, msg_id: bytes, payload: bytes, done: Callable[[], None] | None = None) -> None:
        """Store a message, or add a reference to it if `msg_id` is known.
        `done` runs on the loop once its bytes are durable."""
        entry = self._index.get(msg_id)
        if entry is not None:
            entry.refs += 1
            if done is not None:
                if entry.payload is None:  # already durable: after the next batch
                    self._writer.run(_noop, _after_batch(done))
                elif entry.waiters is None:
                    entry.waiters = done
                elif type(entry.waiters) is list:
                    entry.waiters.append(done)
                else:
                    entry.waiters = [entry.waiters, done]
            return
        data = _encode(msg_id, payload)
        size = len(data)
        file = self._cur
        if file is None or (file.total + size > self._limit and file.total):
            file = self._roll()
        entry = _Entry(file, file.total, size, payload, done)
        file.total += size
        file.live += size
        file.entries.add(entry)
        self._index[msg_id] = entry
        self._writer.append(file.af, data, entry)

    def remove(self, msg_id: bytes) -> None:
        """Drop one reference (unknown ids are ignored: e.g. reported missing
        at recovery)."""
        entry = self._index.get(msg_id)
        if entry is None:
            return
        entry.refs -= 1
        if entry.refs > 0:
            return
        del self._index[msg_id]
        file = entry.file
        file.entries.discard(entry)
        file.live -= entry.size
        if file.live * 2 < file.total:
            if file is self._cur:
                if file.live == 0 and file.total * 2 >= self._limit:
                    self._retire()
            else:
                self._check(file)

    def read(self, msg_id: bytes, done: Callable[[bytes | Exception], None]) -> None:
        """`done(payload)` on the loop, or `done(exception)` (`StoreError`)."""
        entry = self._index.get(msg_id)
        if entry is None:
            self._writer.loop.call_soon(done, StoreError("message %s not in store" % msg_id.hex()))
        elif entry.payload is not None:
            self._writer.loop.call_soon(done, entry.payload)
        else:
            self._writer.read(lambda: self._read_entry(msg_id, entry), done)

    def contains(self, msg_id: bytes) -> bool:
        return msg_id in self._index

    def refcount(self, msg_id: bytes) -> int:
        entry = self._index.get(msg_id)
        return 0 if entry is None else entry.refs

    def stats(self) -> dict:
        files = self._files.values()
        return {
            "files": len(self._files),
            "bytes_on_disk": sum(f.total for f in files),
            "live_bytes": sum(f.live for f in files),
            "messages": len(self._index),
            "compactions": self.compactions,
            "file_deletions": self.deletions,
            "jobs_in_flight": self._busy,
        }

    # -- files (loop side) ---------------------------------------------------

    def _path(self, num: int) -> str:
        return os.path.join(self.directory, "%d.rdq" % num)

    def _roll(self) -> _File:
        if self._next_num is None:
            raise RuntimeError("MessageStore: call recover() or wipe() before use")
        old = self._cur
        num = self._next_num
        self._next_num += 1
        path = self._path(num)
        sync = self._sync
        directory = self.directory

        def create() -> None:
            data_files.create(path)
            if sync:
                _fsync_dir(directory)

        self._writer.run(create)  # before the first append to it (invariant 8)
        # AppendFile stats a path that does not exist yet: no disk I/O to speak of.
        file = _File(num, path, AppendFile(path, sync=sync, bodies=True, kept=self._durable))
        self._files[num] = file
        self._cur = file
        if old is not None:
            self._release(old)
        return file

    def close(self) -> None:
        """Close the current file (writer thread, after what is queued); the
        store is not used afterwards (its vhost is being deleted)."""
        if self._cur is not None:
            self._writer.run(self._cur.af.close)
            self._cur = None

    def _retire(self) -> None:
        """The current file is all dead and big: the next write starts a new one."""
        old = self._cur
        self._cur = None
        self._release(old)

    def _release(self, old: _File) -> None:
        self._writer.run(old.af.close)  # after its last append (writer order)
        old.af = None
        self._check(old)

    def _check(self, file: _File) -> None:
        if file is self._cur or file.compacting:
            return
        if file.live == 0:
            self._delete(file)
        elif file.live * 2 < file.total:
            self._compact(file)

    def _delete(self, file: _File) -> None:
        del self._files[file.num]
        self._busy += 1
        path, lock = file.path, self._lock

        def delete() -> None:
            with lock:  # invariant 6
                data_files.remove(path)

        self._writer.run(delete, self._deleted)

    def _deleted(self, result: object) -> None:
        self._busy -= 1
        if isinstance(result, Exception):
            log.error("could not delete a message store file: %s", result)
        else:
            self.deletions += 1

    def _compact(self, file: _File) -> None:
        file.compacting = True
        self._busy += 1
        snapshot = list(file.entries)  # sorted by offset on the writer thread (invariant 7)
        sync = self._durable  # compaction rewrites live data: fsync before the rename

        def compact() -> int:
            return self._compact_file(file.path, snapshot, sync)

        self._writer.run(compact, lambda result: self._compacted(file, result))

    def _compacted(self, file: _File, result: object) -> None:
        self._busy -= 1
        file.compacting = False
        if isinstance(result, Exception):
            log.error("compaction of %s failed: %s", file.path, result)
            return
        self.compactions += 1
        file.total = result  # live already tracks removals made meanwhile
        self._check(file)

    # -- on the writer / reader threads --------------------------------------

    def _compact_file(self, path: str, snapshot: list[_Entry], sync: bool) -> int:
        snapshot.sort(key=_BY_OFFSET)
        tmp = path + ".compact"
        offsets = []
        position = 0
        try:
            src = os.open(path, os.O_RDONLY)
            try:
                with open(tmp, "wb") as dst:
                    for entry in snapshot:
                        data = os.pread(src, entry.size, entry.offset)
                        if len(data) != entry.size:
                            raise StoreError("%s: record at %d cut short" % (path, entry.offset))
                        dst.write(data)
                        offsets.append(position)
                        position += entry.size
                    dst.flush()
                    if sync:
                        os.fsync(dst.fileno())
            finally:
                os.close(src)
            with self._lock:  # invariant 6: swap file and offsets at once
                data_files.replace(tmp, path)
                for entry, offset in zip(snapshot, offsets):
                    entry.offset = offset
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if sync:
            try:  # the rename is done: a failure here must not undo the bookkeeping
                _fsync_dir(os.path.dirname(path) or ".")
            except OSError as exc:
                log.error("fsync of the directory of %s failed: %s", path, exc)
        return position

    def _read_entry(self, msg_id: bytes, entry: _Entry) -> bytes | Exception:
        """On the reader thread. Returns (not raises) errors: the writer would
        log expected ones (a message removed meanwhile) as failures."""
        try:
            with self._lock:  # invariant 6
                if entry.refs <= 0:
                    return StoreError("message %s removed" % msg_id.hex())
                offset, size, path = entry.offset, entry.size, entry.file.path
                fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, size, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("reading message %s from %s failed: %s", msg_id.hex(), entry.file.path, exc)
            return StoreError("message %s unreadable: %s" % (msg_id.hex(), exc))
        end = size - _TRAILER.size
        if (len(data) != size
                or _LENGTH.unpack_from(data)[0] != size - OVERHEAD
                or data[_LENGTH.size:_LENGTH.size + ID_SIZE] != msg_id
                or _TRAILER.unpack_from(data, end) != (zlib.crc32(memoryview(data)[_LENGTH.size:end]),
                                                       _END_MARKER)):
            log.error("message %s in %s at offset %d is corrupt", msg_id.hex(), path, offset)
            return StoreError("message %s corrupt on disk" % msg_id.hex())
        return data[_LENGTH.size + ID_SIZE:end]
