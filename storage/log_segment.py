"""One segment of an offset-addressed log: Kafka's `.log`, `.index`, `.timeindex`.

Files, all named after the segment's base offset (20 digits):
- `<base>.log`: records `record.encode(_HEAD + payload)`, `_HEAD` = offset,
  timestamp (ms since the epoch). Offsets are stored in the records, so a
  record dropped as corrupt leaves a gap and never shifts its successors.
- `<base>.index`: sparse offset index, entries (offset - base: u32, byte
  position: u32), one for the segment's first record and then one per
  INDEX_INTERVAL bytes of records (Kafka's index.interval.bytes).
- `<base>.timeindex`: entries (timestamp: u64, offset - base: u32), written
  with an offset-index entry when the greatest timestamp seen in the segment
  has grown since the last one: timestamps of entries only increase, so a
  binary search finds where records of a given age start (as Kafka's).

Invariants:
- An index entry names the start of a valid record; every record past a
  corrupt region found at recovery has an index entry at its start, so a
  reader that finds a record not checking out jumps to the next entry after
  it and loses only what was damaged (or, for damage that appeared after
  recovery, at most INDEX_INTERVAL bytes).
- `durable_size` (advanced on the loop by the log once the writer has synced)
  bounds every read: a reader never sees bytes that a crash could replace.
- Recovery: a segment whose indexes check out (entries increasing, inside
  the file, and the bytes after the last entry a run of valid records to the
  end of the file) is loaded from its indexes and that short tail, so a
  restart costs O(index entries), not O(bytes); a torn tail (a write cut
  short by a crash) fails the tail check. Any other segment is scanned record
  by record (a torn tail is truncated and logged, a corrupt region skipped
  and logged) and its index files rewritten. Recovery reads the `.log`
  through `_Recovery`: positional reads in windows of SCAN_CHUNK bytes, at
  most two held at once, so its memory does not follow the segment's size
  (nor a record's: a long record's CRC is computed piece by piece); after
  damage it looks for the next record start with a regular expression over
  a window, not a Python step per byte. An index entry never
  names a record that was not written: a batch writes the `.log` before the
  `.index` (the writer writes files in the order they were first appended
  to, and a record is appended before its index entry). File changes go
  through the group-commit writer (`run` jobs, ahead of any later append).
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import zlib
from array import array
from typing import Iterator

from storage import files, record
from storage.writer import AppendFile, GroupCommitWriter

log = logging.getLogger("hutch.storage")

HEAD = struct.Struct(">QQ")  # offset, timestamp (ms)
_LENGTH = struct.Struct(">I")
_TRAILER = struct.Struct(">IB")
_INDEX_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">QI")
INDEX_INTERVAL = 4096
READ_BUFFER = 65536  # bytes per read system call of a segment reader
SCAN_CHUNK = 1 << 20  # bytes of a segment recovery holds at once


def file_name(base: int, suffix: str) -> str:
    return "%020d%s" % (base, suffix)


class Segment:
    __slots__ = ("base", "directory", "log_file", "index_file", "time_file", "index_offsets",
                 "index_positions", "time_stamps", "time_offsets", "next", "max_timestamp",
                 "durable_size", "_since_index")

    def __init__(self, directory: str, base: int, sync: bool, sizes: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.base = base
        self.directory = directory
        self.log_file = AppendFile(self.path(".log"), sizes[0], sync)
        self.index_file = AppendFile(self.path(".index"), sizes[1], sync)
        self.time_file = AppendFile(self.path(".timeindex"), sizes[2], sync)
        # The indexes in RAM, as arrays of machine integers (8 bytes an entry).
        self.index_offsets = array("q")
        self.index_positions = array("q")
        self.time_stamps = array("q")
        self.time_offsets = array("q")
        self.next = base  # offset after the newest record
        self.max_timestamp = -1  # greatest timestamp in the segment (ms), -1: none
        self.durable_size = sizes[0]
        self._since_index = 0  # record bytes since the last index entry

    def path(self, suffix: str) -> str:
        return os.path.join(self.directory, file_name(self.base, suffix))

    @property
    def size(self) -> int:
        return self.log_file.size

    @property
    def empty(self) -> bool:
        return self.next == self.base

    # -- appends (event loop) ------------------------------------------------

    def note(self, offset: int, position: int, timestamp: int, size: int, writer: GroupCommitWriter | None,
             force: bool = False) -> None:
        """Account for the record `offset` written at `position`; adds index
        entries (through `writer`; None at recovery, which rewrites the files)."""
        if force or not self.index_offsets or self._since_index >= INDEX_INTERVAL:
            self._index(offset, position, timestamp, writer)
            self._since_index = 0
        self._since_index += size
        self.next = offset + 1
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    @property
    def since_index(self) -> int:
        """Record bytes since the last index entry, as a run of appends
        continues it (INDEX_INTERVAL when the segment has none: its first
        record gets one)."""
        return self._since_index if self.index_offsets else INDEX_INTERVAL

    def note_run(self, first: int, count: int, position: int, timestamp: int, entries, since_index: int,
                 writer: GroupCommitWriter) -> None:
        """Account for `count` records from offset `first` written at once
        from `position`, all with `timestamp`: `entries` are the index
        entries due among them [(offset, position relative to the run)] by
        the rule of `note`, `since_index` the bytes after the last."""
        for offset, relative in entries:
            self._index(offset, position + relative, timestamp, writer)
        self._since_index = since_index
        self.next = first + count
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    def _index(self, offset: int, position: int, timestamp: int, writer: GroupCommitWriter | None) -> None:
        self.index_offsets.append(offset)
        self.index_positions.append(position)
        if writer is not None:
            writer.append(self.index_file, _INDEX_ENTRY.pack(offset - self.base, position))
        if timestamp > (self.time_stamps[-1] if self.time_stamps else -1):
            self.time_stamps.append(timestamp)
            self.time_offsets.append(offset)
            if writer is not None:
                writer.append(self.time_file, _TIME_ENTRY.pack(timestamp, offset - self.base))

    # -- look-ups (any thread) -----------------------------------------------

    def position_of(self, offset: int) -> int:
        """Byte position of the index entry at or before `offset`."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[max(i, 0)] if self.index_positions else 0

    def offset_before_time(self, timestamp: int) -> int:
        """An offset at or before the first record with a timestamp >= `timestamp`."""
        i = bisect.bisect_left(self.time_stamps, timestamp) - 1
        return self.time_offsets[i] if i >= 0 else self.base

    def records(self, start: int, end: int) -> Iterator[tuple[int, int, bytes]]:
        """(offset, timestamp, payload) of the records with offsets >= `start`
        in bytes [index position of start, end): read in READ_BUFFER chunks,
        never the whole file. A record that does not check out is logged and
        skipped up to the next index entry."""
        position = self.position_of(start)
        try:
            f = open(self.log_file.path, "rb", buffering=READ_BUFFER)
        except FileNotFoundError:
            return  # deleted by retention meanwhile
        with f:
            f.seek(position)
            while position + record.OVERHEAD <= end:
                head = f.read(_LENGTH.size)
                length = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else -1
                blob = f.read(length + _TRAILER.size) if 0 <= length <= end - position - record.OVERHEAD else b""
                if len(blob) == length + _TRAILER.size and _valid(blob, length):
                    position += record.OVERHEAD + length
                    offset, timestamp = HEAD.unpack_from(blob)
                    if offset >= start:
                        yield offset, timestamp, blob[HEAD.size:length]
                    continue
                i = bisect.bisect_right(self.index_positions, position)
                log.error("%s: corrupt record at byte %d skipped", self.log_file.path, position)
                if i >= len(self.index_positions):
                    return
                position = self.index_positions[i]
                f.seek(position)

    def raw(self, start: int, end: int, max_bytes: int) -> bytes:
        """The bytes of whole records from the index entry at or before
        `start` up to `end` (a durable size): about `max_bytes` of them (more
        when the first record is longer), possibly cut inside the last
        record; b"" when the file is gone. Unchecked: the caller checks each
        record (chunks.chunks_python does) and reads damaged ones with
        `records`."""
        position = self.position_of(start)
        try:
            fd = os.open(self.log_file.path, os.O_RDONLY)
        except FileNotFoundError:
            return b""  # deleted by retention meanwhile
        try:
            count = min(end - position, max_bytes)
            data = os.pread(fd, count, position)
            if len(data) >= _LENGTH.size:
                whole = record.OVERHEAD + _LENGTH.unpack_from(data)[0]
                if len(data) < whole <= end - position:
                    data = os.pread(fd, whole, position)
            return data
        finally:
            os.close(fd)

    # -- recovery (blocking, before the broker serves) -----------------------

    @classmethod
    def recover(cls, directory: str, base: int, sync: bool, writer: GroupCommitWriter) -> "Segment":
        segment = cls(directory, base, sync, _sizes(directory, base))
        fd = os.open(segment.log_file.path, os.O_RDONLY)
        try:
            log_file = _Recovery(fd, segment.log_file.size)
            if not segment._load_indexes(log_file):
                segment._scan(log_file, writer)
        finally:
            os.close(fd)
        return segment

    def _load_indexes(self, log_file: _Recovery) -> bool:
        """Load a sealed segment from its index files and its tail; False
        when they do not check out (the caller scans instead)."""
        size = self.log_file.size
        try:
            with open(self.index_file.path, "rb") as f:
                index = f.read()
            with open(self.time_file.path, "rb") as f:
                times = f.read()
        except FileNotFoundError:
            return False
        if not size or len(index) % _INDEX_ENTRY.size or len(times) % _TIME_ENTRY.size:
            return False
        for relative, position in _INDEX_ENTRY.iter_unpack(index):
            if (self.index_positions and position <= self.index_positions[-1]) or position >= size:
                return False
            self.index_offsets.append(self.base + relative)
            self.index_positions.append(position)
        if self.index_positions[0] != 0:
            return False
        for timestamp, relative in _TIME_ENTRY.iter_unpack(times):
            if self.time_stamps and timestamp <= self.time_stamps[-1]:
                return False
            self.time_stamps.append(timestamp)
            self.time_offsets.append(self.base + relative)
        end, last, max_timestamp = self.index_positions[-1], -1, self.time_stamps[-1] if self.time_stamps else -1
        for _position, offset, timestamp, end in log_file.valid_records(end):
            last, max_timestamp = offset, max(max_timestamp, timestamp)
        if end != size or last < self.index_offsets[-1] or (self.time_offsets and self.time_offsets[-1] > last):
            return False
        self.next, self.max_timestamp = last + 1, max_timestamp
        self._since_index = size - self.index_positions[-1]
        return True

    def _scan(self, log_file: _Recovery, writer: GroupCommitWriter) -> None:
        """Rebuild everything from the `.log` (bounded windows); repair through `writer`."""
        self.index_offsets, self.index_positions = array("q"), array("q")
        self.time_stamps, self.time_offsets = array("q"), array("q")
        self.next, self.max_timestamp, self._since_index = self.base, -1, 0
        path, size = self.log_file.path, self.log_file.size
        end, gap, corrupt = 0, False, []
        while True:
            for position, offset, timestamp, after in log_file.valid_records(end):
                if offset < self.next:  # not after its predecessor: damage that checks out
                    break
                self.note(offset, position, timestamp, after - position, None, force=gap)
                gap, end = False, after
            if end >= size:
                break
            resume = log_file.next_valid(end, self.next)
            if resume < 0:
                break
            corrupt.append(end)
            gap, end = True, resume
        if corrupt:
            log.error("%s: skipped %d corrupt region(s) at bytes %s", path, len(corrupt), corrupt[:10])
        if end < size:
            log.error("%s: torn tail of %d bytes after byte %d truncated", path, size - end, end)
            writer.run(_truncater(path, end))
        self.log_file.size = self.durable_size = end
        index = b"".join(_INDEX_ENTRY.pack(o - self.base, p) for o, p in zip(self.index_offsets, self.index_positions))
        times = b"".join(_TIME_ENTRY.pack(t, o - self.base) for t, o in zip(self.time_stamps, self.time_offsets))
        writer.run(_rewriter(self.index_file, index))
        writer.run(_rewriter(self.time_file, times))
        self.index_file.size, self.time_file.size = len(index), len(times)

    def close(self) -> None:
        """Writer thread only (through `run`)."""
        self.log_file.close()
        self.index_file.close()
        self.time_file.close()

    def delete(self) -> None:
        """Writer thread only (through `run`)."""
        self.close()
        for suffix in (".log", ".index", ".timeindex"):
            try:
                files.remove(self.path(suffix))
            except FileNotFoundError:
                pass


def _valid(blob: bytes, length: int) -> bool:
    crc, marker = _TRAILER.unpack_from(blob, length)
    return marker == record.END_MARKER and length >= HEAD.size and crc == zlib.crc32(memoryview(blob)[:length])


class _Recovery:
    """Positional reads of one `.log` for recovery, in bounded windows: at
    most two windows of about SCAN_CHUNK bytes are held at once (the one
    searched for a record start and the one a candidate is checked in),
    whatever the size of the segment or of a record (the CRC of a record
    longer than a window is computed READ_BUFFER bytes at a time)."""

    __slots__ = ("fd", "size", "_start", "_window", "_candidates")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self._start, self._window = 0, b""
        self._candidates = _candidate_pattern(size)

    def _view(self, position: int, n: int) -> memoryview:
        """Bytes [position, position + n) (fewer at the end of the file); n is
        at most SCAN_CHUNK + 3."""
        if not (self._start <= position and position + n <= self._start + len(self._window)):
            self._window = b""  # let go of the old window before reading the next
            self._window, self._start = os.pread(self.fd, max(n, SCAN_CHUNK), position), position
        i = position - self._start
        return memoryview(self._window)[i:i + n]

    def record_at(self, position: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, end) of the valid record at `position`, or None."""
        head = bytes(self._view(position, _LENGTH.size + HEAD.size))  # a copy: keeps no window alive
        if len(head) < _LENGTH.size + HEAD.size:
            return None
        length = _LENGTH.unpack_from(head)[0]
        end = position + record.OVERHEAD + length
        if length < HEAD.size or end > self.size:
            return None
        offset, timestamp = HEAD.unpack_from(head, _LENGTH.size)
        if record.OVERHEAD + length <= SCAN_CHUNK:
            blob = self._view(position + _LENGTH.size, length + _TRAILER.size)
            return (offset, timestamp, end) if _valid(blob, length) else None
        crc, marker = _TRAILER.unpack_from(os.pread(self.fd, _TRAILER.size, end - _TRAILER.size))
        if marker != record.END_MARKER or crc != self._crc(position + _LENGTH.size, length):
            return None
        return offset, timestamp, end

    def _crc(self, position: int, length: int) -> int:
        value = 0
        while length > 0:
            piece = os.pread(self.fd, min(length, READ_BUFFER), position)
            if not piece:
                return -1
            value = zlib.crc32(piece, value)
            position, length = position + len(piece), length - len(piece)
        return value

    def valid_records(self, position: int) -> Iterator[tuple[int, int, int, int]]:
        """(position, offset, timestamp, end) of the valid records from
        `position` on, until the first that does not check out."""
        while True:
            found = self.record_at(position)
            if found is None:
                return
            offset, timestamp, end = found
            yield position, offset, timestamp, end
            position = end

    def next_valid(self, position: int, after: int) -> int:
        """The first byte position past `position` where a valid record with
        an offset >= `after` starts, or -1 (then the rest is a torn tail).
        Only when recovery found damage. Each window of candidates is
        searched with a regular expression (in C) for the positions whose
        length field could be a record's (at least a record head, at most the
        rest of the file: zero runs and most garbage are passed over without
        a Python step); those are then checked one by one."""
        last = self.size - record.OVERHEAD - HEAD.size  # the last position a record fits at
        start = position + 1
        while start <= last:
            count = min(SCAN_CHUNK, last + 1 - start)
            for i in self._lengths_at(os.pread(self.fd, count + _LENGTH.size - 1, start), count):
                found = self.record_at(start + i)
                if found is not None and found[0] >= after:
                    return start + i
            start += count
        return -1

    def _lengths_at(self, window: bytes, count: int) -> Iterator[int]:
        """Positions below `count` in `window` where a length field could
        start (the window and its matches go with the exhausted generator)."""
        for match in self._candidates.finditer(window):
            if match.start() >= count:
                return
            yield match.start()


def _candidate_pattern(size: int) -> "re.Pattern[bytes]":
    """Positions whose big-endian u32 is in [HEAD.size, 2**24 * (top + 1)),
    top = the greatest first byte a length within a file of `size` bytes has."""
    top = min(size >> 24, 0xFF)
    choices = [rb"\x00\x00\x00[\x10-\xff]", rb"\x00\x00[\x01-\xff].", rb"\x00[\x01-\xff].."]
    if top:
        choices.append(b"[\\x01-" + re.escape(bytes([top])) + b"]...")
    return re.compile(b"(?=" + b"|".join(choices) + b")", re.DOTALL)


def _sizes(directory: str, base: int) -> tuple[int, int, int]:
    sizes = []
    for suffix in (".log", ".index", ".timeindex"):
        try:
            sizes.append(os.path.getsize(os.path.join(directory, file_name(base, suffix))))
        except FileNotFoundError:
            sizes.append(0)
    return sizes[0], sizes[1], sizes[2]


def _truncater(path: str, size: int):
    def truncate() -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            os.fsync(f.fileno())
    return truncate


def _rewriter(file: AppendFile, data: bytes):
    """Replace an index file's content (write aside, fsync, rename)."""
    def rewrite() -> None:
        file.close()
        temporary = file.path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(data)
            if file.sync:
                os.fsync(f.fileno())
        files.replace(temporary, file.path)
    return rewrite
