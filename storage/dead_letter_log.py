"""The dead-letter log of one vhost: every message that died, by offset.

A dead-letter queue is consumed destructively; analytics (spark_sink) want
what Kafka offers instead: records addressed by a monotonically increasing
offset, readable again from any offset. So the broker appends a record for
every dying message here (docs/analytics.md), whether or not its queue has a
dead-letter exchange.

Theory of operation
- Segment files `<first offset, 20 digits>.dlog` in `directory`, each a run
  of `record.encode(body)` frames; a body is `_HEAD` (offset, time in ms,
  death count, body size, metadata length, flags), the metadata as JSON, then
  the message body when bodies are kept. Only the newest segment (`_active`)
  is appended to; it rolls when the next record would take it past
  `segment_bytes`.
- `append` runs on the event loop: it encodes, hands the bytes to the
  group-commit writer (never blocks) and returns the record's offset. Its
  `on_durable` runs on the loop once the writer has written and synced the
  batch holding the record; the dead-letter path waits for it before the
  message leaves its queue, so a record of a message that left survives
  kill -9.
- Invariant 1: offsets are assigned on the loop in append order, so they
  increase by one per record; across restarts `recover` continues after the
  newest record found, and never below the newest segment's first offset
  (a segment file is created, by a writer job, before its first record, and
  older segments are deleted only by writer jobs queued after that record:
  the newest file on disk always names where to continue).
- Invariant 2: readers only see offsets below `next_offset`, which advances
  in the writer's completion callbacks (submission order) together with the
  segment's `durable_size`: what a reader gets is on disk and can never be
  replaced by a different record after a crash (deterministic replay).
- Reads run on the writer's reader thread (`read`) or any thread
  (`read_records`): each segment keeps a sparse index (every SPARSE-th
  record's byte position) so a read seeks near its start. Segment lists are
  replaced, never mutated in place, so a reader works on a consistent list;
  a file deleted under a reader only ends that reader's segment early.
- Retention (`retain`, run on every append and read): whole non-active
  segments are deleted, oldest first, while the log is over
  `retention_bytes`, or while the oldest segment's newest record is older
  than `retention_seconds` (0 disables either limit). The active segment is
  never deleted, as in RabbitMQ streams.
- Recovery scans every segment (`record.scan_file`): a torn tail is
  truncated and logged, a corrupt record in the middle is skipped and logged
  (its offset becomes a gap; offsets are stored in the records).
"""
from __future__ import annotations

import base64
import bisect
import datetime
import decimal
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from typing import Callable

from storage import files, record
from storage.message import Message
from storage.msg_store import _fsync_dir
from storage.writer import AppendFile, GroupCommitWriter

log = logging.getLogger("hutch.storage")

# offset, time (ms since the epoch), death count, body size, metadata length, flags
_HEAD = struct.Struct(">QQIIIB")
_LENGTH = struct.Struct(">I")
_HAS_BODY = 1
SPARSE = 64
_NAME = re.compile(r"^(\d{20})\.dlog$")


@dataclass
class DeadLetterLogSettings:
    include_bodies: bool = True
    retention_bytes: int = 268435456
    retention_seconds: int = 604800
    segment_bytes: int = 16777216


@dataclass(slots=True)
class DeadLetter:
    """One dead message; `offset` is -1 until it has been appended.

    `headers` holds JSON values only (`json_value`); `timestamp` is seconds
    since the epoch; `time` is when the message died."""

    time: float
    vhost: str
    queue: str
    reason: str
    exchange: str
    routing_keys: list
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    death_count: int = 1
    delivery_count: int = 0  # times it was given back after a delivery (x-delivery-count)
    content_type: str | None = None
    message_id: str | None = None
    correlation_id: str | None = None
    app_id: str | None = None
    timestamp: int | None = None
    headers: dict | None = None
    body_size: int = 0
    body: bytes | None = None
    offset: int = -1

    def to_json(self) -> dict:
        """The wire shape of the HTTP API (docs/analytics.md): the body in base64."""
        return {
            "offset": self.offset,
            "time": self.time,
            "vhost": self.vhost,
            "queue": self.queue,
            "reason": self.reason,
            "exchange": self.exchange,
            "routing_keys": self.routing_keys,
            "dead_letter_exchange": self.dead_letter_exchange,
            "dead_letter_routing_key": self.dead_letter_routing_key,
            "death_count": self.death_count,
            "delivery_count": self.delivery_count,
            "properties": {
                "content_type": self.content_type,
                "message_id": self.message_id,
                "correlation_id": self.correlation_id,
                "app_id": self.app_id,
                "timestamp": self.timestamp,
                "headers": self.headers,
            },
            "body_size": self.body_size,
            "body": None if self.body is None else base64.b64encode(self.body).decode("ascii"),
        }


def json_value(value: object) -> object:
    """An AMQP field value as JSON: timestamps as seconds since the epoch,
    byte strings as text (UTF-8, undecodable bytes replaced), decimals as
    numbers, tables and arrays recursively."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    return str(value)


def from_message(message: Message, vhost: str, queue: str, reason: str, when: float, routing_keys: list[str],
                 dead_letter_exchange: str | None = None, dead_letter_routing_key: str | None = None,
                 death_count: int = 1, delivery_count: int = 0) -> DeadLetter:
    """The record of `message` dying in `queue` at `when` (decodes its properties)."""
    props = message.properties
    return DeadLetter(
        time=when, vhost=vhost, queue=queue, reason=reason, exchange=message.exchange, routing_keys=routing_keys,
        dead_letter_exchange=dead_letter_exchange, dead_letter_routing_key=dead_letter_routing_key,
        death_count=death_count, delivery_count=delivery_count, content_type=props.content_type, message_id=props.message_id,
        correlation_id=props.correlation_id, app_id=props.app_id,
        timestamp=json_value(props.timestamp) if props.timestamp is not None else None,
        headers=json_value(props.headers) if props.headers else None,
        body_size=len(message.body), body=message.body,
    )


def _encode(dead: DeadLetter, offset: int, include_body: bool) -> bytes:
    meta = json.dumps({
        "vhost": dead.vhost,
        "queue": dead.queue,
        "reason": dead.reason,
        "exchange": dead.exchange,
        "routing_keys": dead.routing_keys,
        "dead_letter_exchange": dead.dead_letter_exchange,
        "dead_letter_routing_key": dead.dead_letter_routing_key,
        "delivery_count": dead.delivery_count,
        "content_type": dead.content_type,
        "message_id": dead.message_id,
        "correlation_id": dead.correlation_id,
        "app_id": dead.app_id,
        "timestamp": dead.timestamp,
        "headers": dead.headers,
    }, separators=(",", ":")).encode("utf-8")
    body = dead.body if include_body and dead.body is not None else b""
    flags = _HAS_BODY if include_body and dead.body is not None else 0
    head = _HEAD.pack(offset, round(dead.time * 1000), dead.death_count, dead.body_size, len(meta), flags)
    return record.encode(b"".join((head, meta, body)))


def _decode(data: bytes) -> DeadLetter:
    offset, time_ms, death_count, body_size, meta_len, flags = _HEAD.unpack_from(data)
    start = _HEAD.size
    meta = json.loads(data[start:start + meta_len])
    body = data[start + meta_len:] if flags & _HAS_BODY else None
    return DeadLetter(time=time_ms / 1000, death_count=death_count, body_size=body_size, body=body,
                      offset=offset, **meta)


class _Segment:
    __slots__ = ("first", "file", "mark_offsets", "mark_positions", "next", "durable_size", "last_time")

    def __init__(self, first: int, file: AppendFile) -> None:
        self.first = first
        self.file = file
        # Sparse index: every SPARSE-th record's offset and byte position.
        self.mark_offsets: list[int] = []
        self.mark_positions: list[int] = []
        self.next = first  # offset after the last record appended
        self.durable_size = file.size  # bytes on disk (the reader's limit)
        self.last_time = 0.0  # when the newest record died

    def note(self, offset: int, position: int, when: float) -> None:
        if not self.mark_offsets or offset - self.mark_offsets[-1] >= SPARSE:
            self.mark_offsets.append(offset)
            self.mark_positions.append(position)
        self.next = offset + 1
        self.last_time = max(self.last_time, when)


class DeadLetterLog:
    def __init__(self, directory: str, writer: GroupCommitWriter, settings: DeadLetterLogSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.settings = settings
        self._writer = writer
        self._clock = clock
        self._segments: list[_Segment] = []
        self._next_offset = 0  # the next offset to assign (loop only)
        self.next_offset = 0  # offsets below are on disk (invariant 2)
        self.deleted_segments = 0

    # -- start-up (blocking) -------------------------------------------------

    def recover(self) -> None:
        """Scan the segments on disk (before the broker serves)."""
        os.makedirs(self.directory, exist_ok=True)
        names = sorted(n for n in os.listdir(self.directory) if _NAME.match(n))
        segments = []
        for name in names:
            path = os.path.join(self.directory, name)
            records, _report = record.scan_file(path)
            segment = _Segment(int(name[:20]), AppendFile(path))
            for position, body in records:
                offset, time_ms = _HEAD.unpack_from(body)[:2]
                segment.note(offset, position, time_ms / 1000)
            segments.append(segment)
        self._segments = segments
        if segments:
            self._next_offset = self.next_offset = segments[-1].next

    # -- on the event loop ---------------------------------------------------

    def close(self) -> None:
        """Close the segment files (writer thread, after what is queued); the
        log is not used afterwards (its vhost is being deleted)."""
        for segment in self._segments:
            self._writer.run(segment.file.close)
        self._segments = []

    @property
    def first_offset(self) -> int:
        """The oldest offset still kept (== next_offset when the log is empty)."""
        segments = self._segments
        for segment in segments:
            if segment.mark_offsets:
                return segment.mark_offsets[0]
        return self.next_offset

    @property
    def size(self) -> int:
        """Bytes in the log's files (what retention_bytes limits)."""
        return sum(s.file.size for s in self._segments)

    def append(self, dead: DeadLetter, on_durable: Callable[[], None] | None = None) -> int:
        """Queue `dead` for the log; returns its offset. `on_durable` runs on
        the loop once the record is on disk (never, if the write fails)."""
        offset = self._next_offset
        self._next_offset += 1
        dead.offset = offset
        data = _encode(dead, offset, self.settings.include_bodies)
        segment = self._segments[-1] if self._segments else None
        rolled = segment is None or (segment.next > segment.first
                                     and segment.file.size + len(data) > self.settings.segment_bytes)
        if rolled:
            segment = self._roll(offset)
        durable = _Durable(self, segment, offset + 1, segment.file.size + len(data), on_durable)
        position = self._writer.append(segment.file, data, durable)
        segment.note(offset, position, dead.time)
        if rolled or len(self._segments) > 1:
            self.retain()
        return offset

    def _durable(self, segment: _Segment, next_offset: int, size: int) -> None:
        segment.durable_size = size
        self.next_offset = next_offset

    def _roll(self, first: int) -> _Segment:
        path = os.path.join(self.directory, "%020d.dlog" % first)
        sync = self._writer.durability == "fsync"
        directory = self.directory
        old = self._segments[-1] if self._segments else None

        def create() -> None:
            files.create(path)
            if sync:
                _fsync_dir(directory)

        self._writer.run(create)
        if old is not None:
            self._writer.run(old.file.close)  # after its last append (writer order)
        segment = _Segment(first, AppendFile(path, 0))
        self._segments = self._segments + [segment]
        return segment

    def retain(self) -> None:
        """Delete whole old segments beyond the size or age limit (the
        active one stays)."""
        settings = self.settings
        segments = self._segments
        total = self.size
        cutoff = self._clock() - settings.retention_seconds
        drop = 0
        while drop < len(segments) - 1:
            oldest = segments[drop]
            over_size = settings.retention_bytes and total > settings.retention_bytes
            too_old = settings.retention_seconds and oldest.last_time < cutoff
            if not (over_size or too_old):
                break
            total -= oldest.file.size
            drop += 1
        if not drop:
            return
        self._segments = segments[drop:]
        for old in segments[:drop]:
            self._writer.run(_deleter(old.file), self._deleted)

    def _deleted(self, result: object) -> None:
        if isinstance(result, Exception):
            log.error("could not delete a dead-letter log segment: %s", result)
        else:
            self.deleted_segments += 1

    def read(self, start: int, max_records: int, done: Callable[[list[DeadLetter] | Exception], None],
             max_bytes: int = 0) -> None:
        """Records from offset `start` on (at most `max_records`, and once
        past `max_bytes` of bodies no more; 0: no byte limit), read on the
        reader thread; `done` gets them (or an exception) on the loop."""
        self.retain()
        segments, limit = self._segments, self.next_offset
        self._writer.read(lambda: read_records(segments, start, max_records, limit, max_bytes), done)


class _Durable:
    """The writer's `done` for one append (invariant 2)."""

    __slots__ = ("log", "segment", "next_offset", "size", "then")

    def __init__(self, log_: DeadLetterLog, segment: _Segment, next_offset: int, size: int,
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


def _deleter(file: AppendFile) -> Callable[[], None]:
    def delete() -> None:
        file.close()
        files.remove(file.path)
    return delete


def read_records(segments: list[_Segment], start: int, max_records: int, limit: int,
                 max_bytes: int = 0) -> list[DeadLetter]:
    """Blocking: records with offsets in [start, limit), at most `max_records`
    (fewer once their bodies pass `max_bytes`, when set)."""
    out = _Batch(max_records, max_bytes)
    firsts = [s.first for s in segments]
    index = max(bisect.bisect_right(firsts, start) - 1, 0)
    for segment in segments[index:]:
        if out.full or segment.first >= limit:
            break
        _read_segment(segment, start, limit, out)
    return out.records


class _Batch:
    """What one read has collected, and whether it is enough."""

    __slots__ = ("records", "max_records", "max_bytes", "bytes")

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.records: list[DeadLetter] = []
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.bytes = 0

    @property
    def full(self) -> bool:
        return len(self.records) >= self.max_records or bool(self.max_bytes) and self.bytes >= self.max_bytes

    def take(self, body: bytes, start: int, limit: int) -> bool:
        """Add the record if it is in range; False once past the range or full."""
        offset = _HEAD.unpack_from(body)[0]
        if offset >= limit or self.full:
            return False
        if offset >= start:
            self.records.append(_decode(body))
            self.bytes += len(body)
        return True


def _read_segment(segment: _Segment, start: int, limit: int, out: _Batch) -> None:
    """Read record by record from the sparse-index mark at or before `start`,
    up to the durable size; a record that does not check out (damage found
    at recovery) switches to `record.scan` of the rest, which skips it."""
    if not segment.mark_positions:
        return
    mark = max(bisect.bisect_right(segment.mark_offsets, start) - 1, 0)
    position, end = segment.mark_positions[mark], segment.durable_size
    try:
        with open(segment.file.path, "rb") as f:
            f.seek(position)
            while position + record.OVERHEAD <= end and not out.full:
                head = f.read(_LENGTH.size)
                size = _LENGTH.unpack(head)[0] + record.OVERHEAD
                blob = head + f.read(min(size, end - position) - len(head))
                records, _report = record.scan(blob)
                if size <= end - position and len(records) == 1 and records[0][0] == 0:
                    if not out.take(records[0][1], start, limit):
                        return
                    position += size
                    continue
                f.seek(position)
                for _pos, body in record.scan(f.read(end - position), segment.file.path)[0]:
                    if not out.take(body, start, limit):
                        return
                return
    except FileNotFoundError:
        return  # deleted by retention meanwhile

