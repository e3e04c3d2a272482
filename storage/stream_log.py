"""The log engine: an append-only log of records addressed by offset, kept in
segments (storage/log_segment.py) and trimmed by size and age, as Kafka keeps
a partition and RabbitMQ a stream. Stream queues and the dead-letter log are
its users; a record's payload is theirs to encode.

Theory of operation
- `append` runs on the event loop and is O(1): it gives the record the next
  offset, hands its bytes (and any index entries) to the group-commit writer,
  and returns the offset. `on_durable` runs on the loop once the writer has
  written and synced the batch holding the record (`storage.durability`).
  The active (newest) segment rolls when the next record would take it past
  `segment_bytes`.
- Invariant 1: offsets increase by one per append, in append order; across
  restarts `recover` continues after the newest record found, and never
  below the newest segment's base offset (a segment's files are created by a
  writer job before its first record, and older segments are deleted only by
  jobs queued after that record: the newest `.log` always names where to go on).
- Invariant 2: readers see only offsets below `next_offset` and bytes below
  each segment's `durable_size`, both advanced in the writer's completion
  callbacks (submission order): what a reader gets is on disk and can never
  be replaced by a different record after a crash.
- Reads (`read`, on the writer's reader thread; `read_records` on any
  thread) binary-search the segment list, then the segment's sparse index,
  and stream the segment in chunks. The segment list is replaced, never
  mutated, so a reader works on a consistent snapshot; a segment deleted
  under a reader only ends that reader's segment early.
- Look-ups by time (`find_time`) binary-search the segments' greatest
  timestamps, then the segment's time index, then scan at most an index
  interval.
- Retention (`retain`, on appends that roll and on reads): whole segments,
  oldest first, are deleted while the log is over `max_bytes` or the oldest
  segment's newest record is older than `max_age` seconds (0: no limit).
  The active segment is never deleted (as in RabbitMQ streams and Kafka).
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Callable

from storage import files, record
from storage.log_segment import HEAD, Segment
from storage.msg_store import _fsync_dir
from storage.writer import GroupCommitWriter

log = logging.getLogger("hutch.storage")

_LOG_NAME = re.compile(r"^(\d{20})\.log$")


@dataclass
class LogSettings:
    segment_bytes: int = 500_000_000  # RabbitMQ's stream default
    max_bytes: int = 0  # 0: no size limit
    max_age: float = 0  # seconds; 0: no age limit


class StreamLog:
    def __init__(self, directory: str, writer: GroupCommitWriter, settings: LogSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.settings = settings
        self._writer = writer
        self._clock = clock
        self._sync = writer.durability == "fsync"
        self._segments: list[Segment] = []
        self._next_offset = 0  # the next offset to give (loop only)
        self.next_offset = 0  # offsets below are on disk (invariant 2)
        self.deleted_segments = 0
        self.closed = False

    # -- start-up (blocking) -------------------------------------------------

    def recover(self) -> None:
        """Load the segments on disk (before the broker serves)."""
        if not os.path.isdir(self.directory):
            return
        bases = sorted(int(m.group(1)) for m in map(_LOG_NAME.match, os.listdir(self.directory)) if m)
        self._segments = [Segment.recover(self.directory, base, self._sync, self._writer) for base in bases]
        if self._segments:
            self._next_offset = self.next_offset = self._segments[-1].next

    # -- state (event loop) --------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The oldest offset kept (== next_offset when the log is empty)."""
        for segment in self._segments:
            if not segment.empty:
                return segment.index_offsets[0]
        return self.next_offset

    @property
    def size(self) -> int:
        """Bytes of records in the log (what max_bytes limits)."""
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- appends (event loop) ------------------------------------------------

    def append(self, payload: bytes, timestamp: float | None = None,
               on_durable: Callable[[], None] | None = None) -> int:
        """Queue a record; returns its offset. `timestamp`: seconds since the
        epoch (default: now). `on_durable` runs on the loop once the record
        is on disk (never, if the write fails)."""
        offset = self._next_offset
        self._next_offset = offset + 1
        when = round((self._clock() if timestamp is None else timestamp) * 1000)
        data = record.encode(HEAD.pack(offset, when) + payload)
        segment = self._segments[-1] if self._segments else None
        rolled = segment is None or (not segment.empty and segment.size + len(data) > self.settings.segment_bytes)
        if rolled:
            segment = self._roll(offset)
        durable = _Durable(self, segment, offset + 1, segment.size + len(data), on_durable)
        position = self._writer.append(segment.log_file, data, durable)
        segment.note(offset, position, when, len(data), self._writer)
        if rolled and len(self._segments) > 1:
            self.retain()
        return offset

    def append_run(self, count: int, size: int, encode: Callable[[int, int, int], tuple[bytes, list, int]],
                   on_durable: Callable[[], None] | None = None) -> int:
        """Queue `count` records at once, `size` bytes framed, all with the
        time now; returns the first offset. `encode(first offset, timestamp
        ms, the segment's since_index)` gives their bytes (each framed as
        `append` frames one: `record.encode(HEAD.pack(offset, timestamp) +
        payload)`, offsets from the first), the index entries due among them
        (Segment.note_run) and the bytes after the last. The run goes into
        one segment (which may then pass `segment_bytes` by less than the
        run). `on_durable` runs on the loop once all are on disk."""
        offset = self._next_offset
        self._next_offset = offset + count
        when = round(self._clock() * 1000)
        segment = self._segments[-1] if self._segments else None
        rolled = segment is None or (not segment.empty and segment.size + size > self.settings.segment_bytes)
        if rolled:
            segment = self._roll(offset)
        data, entries, since_index = encode(offset, when, segment.since_index)
        durable = _Durable(self, segment, offset + count, segment.size + len(data), on_durable)
        position = self._writer.append(segment.log_file, data, durable)
        segment.note_run(offset, count, position, when, entries, since_index, self._writer)
        if rolled and len(self._segments) > 1:
            self.retain()
        return offset

    def _durable(self, segment: Segment, next_offset: int, size: int) -> None:
        segment.durable_size = size
        self.next_offset = next_offset

    def _roll(self, base: int) -> Segment:
        old = self._segments[-1] if self._segments else None
        segment = Segment(self.directory, base, self._sync)
        self._writer.run(_creator(self.directory, [segment.path(s) for s in (".log", ".index", ".timeindex")],
                                  self._sync))
        if old is not None:
            self._writer.run(old.close)  # after its last append (writer order)
        self._segments = self._segments + [segment]
        return segment

    def configure(self, settings: LogSettings) -> None:
        """New limits (a policy changed); applied at once."""
        self.settings = settings
        self.retain()

    def retain(self) -> None:
        """Delete whole old segments beyond the size or age limit (the active
        one stays)."""
        settings, segments = self.settings, self._segments
        total = self.size
        cutoff = (self._clock() - settings.max_age) * 1000
        drop = 0
        while drop < len(segments) - 1:
            oldest = segments[drop]
            over_size = settings.max_bytes and total > settings.max_bytes
            too_old = settings.max_age and oldest.max_timestamp < cutoff
            if not (over_size or too_old):
                break
            total -= oldest.size
            drop += 1
        if not drop:
            return
        self._segments = segments[drop:]
        for old in segments[:drop]:
            self._writer.run(old.delete, self._deleted)

    def _deleted(self, result: object) -> None:
        if isinstance(result, Exception):
            log.error("could not delete a log segment of %s: %s", self.directory, result)
        else:
            self.deleted_segments += 1

    def delete(self) -> None:
        """Remove the whole log (its queue was deleted), after what is queued."""
        self.closed = True
        segments, self._segments = self._segments, []
        directory = self.directory

        def remove() -> None:
            for segment in segments:
                segment.close()
            files.remove_tree(directory)
        self._writer.run(remove)

    def close(self) -> None:
        """Close the files (after what is queued); the log is not used afterwards."""
        self.closed = True
        for segment in self._segments:
            self._writer.run(segment.close)
        self._segments = []

    # -- reads ---------------------------------------------------------------

    def snapshot(self) -> tuple[list[Segment], int]:
        """What a reader on another thread may read: the segments and the
        offset limit (invariant 2)."""
        return self._segments, self.next_offset

    def read(self, start: int, max_records: int, done: Callable[[list | Exception], None],
             max_bytes: int = 0) -> None:
        """Records (offset, timestamp ms, payload) from offset `start` on, at
        most `max_records` (and none more once past `max_bytes` of payload;
        0: no byte limit), read on the reader thread; `done` gets the list
        (or an exception) on the loop."""
        self.retain()
        segments, limit = self.snapshot()
        self._writer.read(lambda: read_records(segments, start, max_records, limit, max_bytes), done)

    def read_raw(self, start: int, max_bytes: int, then: Callable[[bytes, int], object],
                 done: Callable[[object], None]) -> None:
        """The unchecked bytes of records from (at most an index interval
        before) offset `start` on, about `max_bytes` (`raw_records`), given
        with the offset limit to `then` on the reader thread; `done` gets
        what `then` returned (or an exception) on the loop. The bulk read of
        a consumer that turns records into its protocol's frames there."""
        self.retain()
        segments, limit = self.snapshot()
        self._writer.read(lambda: then(raw_records(segments, start, limit, max_bytes), limit), done)

    def find_time(self, timestamp: float, done: Callable[[int | Exception], None]) -> None:
        """The offset of the first record at or after `timestamp` (seconds),
        or next_offset if none, computed on the reader thread."""
        segments, limit = self.snapshot()
        self._writer.read(lambda: offset_at_time(segments, round(timestamp * 1000), limit), done)


class _Durable:
    """The writer's `done` for one append (invariant 2)."""

    __slots__ = ("log", "segment", "next_offset", "size", "then")

    def __init__(self, log_: StreamLog, segment: Segment, next_offset: int, size: int,
                 then: Callable[[], None] | None) -> None:
        self.log = log_
        self.segment = segment
        self.next_offset = next_offset
        self.size = size  # the segment's size with this record
        self.then = then

    def __call__(self) -> None:
        self.log._durable(self.segment, self.next_offset, self.size)
        if self.then is not None:
            self.then()


def _creator(directory: str, paths: list[str], sync: bool) -> Callable[[], None]:
    def create() -> None:
        for path in paths:
            files.create(path)
        if sync:
            _fsync_dir(directory)
    return create


def read_records(segments: list[Segment], start: int, max_records: int, limit: int,
                 max_bytes: int = 0) -> list[tuple[int, int, bytes]]:
    """Blocking: records with offsets in [max(start, first), limit), at most
    `max_records`, fewer once their payloads pass `max_bytes` (when set; at
    least one record is returned)."""
    out: list[tuple[int, int, bytes]] = []
    if max_records <= 0:
        return out
    taken = 0
    i = max(bisect.bisect_right([s.base for s in segments], start) - 1, 0)
    for segment in segments[i:]:
        if segment.base >= limit:
            break
        for item in segment.records(start, segment.durable_size):
            if item[0] >= limit:
                return out
            out.append(item)
            taken += len(item[2])
            if len(out) >= max_records or (max_bytes and taken >= max_bytes):
                return out
    return out


def raw_records(segments: list[Segment], start: int, limit: int, max_bytes: int) -> bytes:
    """Blocking: the bytes of the segment holding offset `start` (or of the
    next one, when `start` is past its last record), from the index entry at
    or before `start`, below its durable size (invariant 2; records at or
    past `limit` may follow and are the caller's to leave), about
    `max_bytes`. b"" when there is nothing at or after `start`."""
    i = max(bisect.bisect_right([s.base for s in segments], start) - 1, 0)
    while i < len(segments) and segments[i].base < limit:
        segment = segments[i]
        if start < segment.next:
            return segment.raw(start, segment.durable_size, max_bytes)
        i += 1
    return b""


def offset_at_time(segments: list[Segment], timestamp: int, limit: int) -> int:
    """Blocking: the offset of the first record (below `limit`) whose
    timestamp (ms) is >= `timestamp`, or `limit` if none."""
    i = bisect.bisect_left([s.max_timestamp for s in segments], timestamp)
    for segment in segments[i:]:
        for offset, stamp, _payload in segment.records(segment.offset_before_time(timestamp), segment.durable_size):
            if offset >= limit:
                return limit
            if stamp >= timestamp:
                return offset
    return limit


def segment_names(directory: str) -> list[str]:
    """The `.log` files of a log, oldest first (tests, tools)."""
    return sorted(n for n in os.listdir(directory) if _LOG_NAME.match(n))

