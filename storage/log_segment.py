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
  by record in chunks (a torn tail is truncated and logged, a corrupt region
  skipped and logged) and its index files rewritten. An index entry never
  names a record that was not written: a batch writes the `.log` before the
  `.index` (the writer writes files in the order they were first appended
  to, and a record is appended before its index entry). File changes go
  through the group-commit writer (`run` jobs, ahead of any later append).
"""
from __future__ import annotations

import bisect
import logging
import os
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
            self.index_offsets.append(offset)
            self.index_positions.append(position)
            self._since_index = 0
            if writer is not None:
                writer.append(self.index_file, _INDEX_ENTRY.pack(offset - self.base, position))
            if timestamp > (self.time_stamps[-1] if self.time_stamps else -1):
                self.time_stamps.append(timestamp)
                self.time_offsets.append(offset)
                if writer is not None:
                    writer.append(self.time_file, _TIME_ENTRY.pack(timestamp, offset - self.base))
        self._since_index += size
        self.next = offset + 1
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

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

    # -- recovery (blocking, before the broker serves) -----------------------

    @classmethod
    def recover(cls, directory: str, base: int, sync: bool, writer: GroupCommitWriter) -> "Segment":
        segment = cls(directory, base, sync, _sizes(directory, base))
        if not segment._load_indexes():
            segment._scan(writer)
        return segment

    def _load_indexes(self) -> bool:
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
        position, last, max_timestamp = self.index_positions[-1], -1, self.time_stamps[-1] if self.time_stamps else -1
        for position, offset, timestamp, _payload in _valid_records(self.log_file.path, position):
            last, max_timestamp = offset, max(max_timestamp, timestamp)
        if position != size or last < self.index_offsets[-1] or (self.time_offsets and self.time_offsets[-1] > last):
            return False
        self.next, self.max_timestamp = last + 1, max_timestamp
        self._since_index = size - self.index_positions[-1]
        return True

    def _scan(self, writer: GroupCommitWriter) -> None:
        """Rebuild everything from the `.log` (chunked); repair through `writer`."""
        self.index_offsets, self.index_positions = array("q"), array("q")
        self.time_stamps, self.time_offsets = array("q"), array("q")
        self.next, self.max_timestamp, self._since_index = self.base, -1, 0
        path, size = self.log_file.path, self.log_file.size
        end, gap, corrupt = 0, False, []
        while True:
            for position, offset, timestamp, payload in _valid_records(path, end):
                if offset < self.next:  # not after its predecessor: damage that checks out
                    break
                size_of = _record_size(payload)
                self.note(offset, position, timestamp, size_of, None, force=gap)
                gap, end = False, position + size_of
            if end >= size:
                break
            resume = _next_valid(path, end, self.next)
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


def _record_size(payload: bytes) -> int:
    return record.OVERHEAD + HEAD.size + len(payload)


def _valid_records(path: str, position: int) -> Iterator[tuple[int, int, int, bytes]]:
    """(position, offset, timestamp, payload) of the valid records from
    `position` on, until the first that does not check out (chunked reads)."""
    with open(path, "rb", buffering=READ_BUFFER) as f:
        f.seek(position)
        while True:
            head = f.read(_LENGTH.size)
            if len(head) < _LENGTH.size:
                return
            length = _LENGTH.unpack(head)[0]
            blob = f.read(length + _TRAILER.size)
            if len(blob) < length + _TRAILER.size or not _valid(blob, length):
                return
            offset, timestamp = HEAD.unpack_from(blob)
            yield position, offset, timestamp, blob[HEAD.size:length]
            position += record.OVERHEAD + length


def _next_valid(path: str, position: int, after: int) -> int:
    """The first byte position past `position` where a valid record with an
    offset >= `after` starts, or -1 (then the rest is a torn tail). Reads the
    rest of the segment: only when recovery found damage."""
    with open(path, "rb") as f:
        f.seek(position + 1)
        data = f.read()
    for i in range(len(data) - record.OVERHEAD + 1):
        length = _LENGTH.unpack_from(data, i)[0]
        end = i + record.OVERHEAD + length
        if end <= len(data) and _valid(data[i + _LENGTH.size:end], length) \
                and HEAD.unpack_from(data, i + _LENGTH.size)[0] >= after:
            return position + 1 + i
    return -1


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
