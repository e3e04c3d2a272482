"""The dead-letter log of one vhost: every message that died, by offset.

A dead-letter queue is consumed destructively; analytics (spark_sink) want
what Kafka offers instead: records addressed by a monotonically increasing
offset, readable again from any offset. So the broker appends a record for
every dying message here (docs/analytics.md), whether or not its queue has a
dead-letter exchange.

Theory of operation
- The records live in a `storage.stream_log.StreamLog` (segments with offset
  and time indexes, retention by size and age, recovery; its invariants are
  this log's): each record's payload is `_HEAD` (death count, body size,
  metadata length, flags), the metadata as JSON, then the message body when
  bodies are kept; the log's timestamp is when the message died, so
  `retention_seconds` counts from the death.
- `append` runs on the event loop and never blocks; its `on_durable` runs
  once the record is on disk. The dead-letter path waits for it before the
  message leaves its queue, so a record of a message that left survives
  kill -9.
"""
from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import struct
import time
from dataclasses import dataclass
from typing import Callable

from storage import files
from storage.message import Message
from storage.stream_log import LogSettings, StreamLog
from storage.writer import GroupCommitWriter

# death count, body size, metadata length, flags (offset and time are the log's)
_HEAD = struct.Struct(">IIIB")
_HAS_BODY = 1


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


def _encode(dead: DeadLetter, include_body: bool) -> bytes:
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
    return b"".join((_HEAD.pack(dead.death_count, dead.body_size, len(meta), flags), meta, body))


def _decode(offset: int, time_ms: int, data: bytes) -> DeadLetter:
    death_count, body_size, meta_len, flags = _HEAD.unpack_from(data)
    start = _HEAD.size
    meta = json.loads(data[start:start + meta_len])
    body = data[start + meta_len:] if flags & _HAS_BODY else None
    return DeadLetter(time=time_ms / 1000, death_count=death_count, body_size=body_size, body=body,
                      offset=offset, **meta)


class DeadLetterLog:
    """The dead-letter records of one vhost in a `StreamLog`."""

    def __init__(self, directory: str, writer: GroupCommitWriter, settings: DeadLetterLogSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.settings = settings
        self._log = StreamLog(directory, writer, LogSettings(settings.segment_bytes, settings.retention_bytes,
                                                             settings.retention_seconds), clock)

    def recover(self) -> None:
        """Load the log from disk (blocking, before the broker serves).
        Segments of hutch's first dead-letter log format (`<offset>.dlog`)
        are taken over by renaming them: their records are byte for byte
        the engine's (offset and time first), and their indexes are built
        by the engine's recovery (a rename at start-up, before the writer
        has anything of this log queued)."""
        if os.path.isdir(self.directory):
            for name in os.listdir(self.directory):
                if name.endswith(".dlog"):
                    path = os.path.join(self.directory, name)
                    files.rename(path, path[:-len(".dlog")] + ".log")
        self._log.recover()

    def close(self) -> None:
        """Close the files (after what is queued); its vhost is being deleted."""
        self._log.close()

    def delete(self) -> None:
        """Remove the log and its directory (after what is queued): its
        records are kept elsewhere now (amqp_server.shards.dead_letters)."""
        self._log.delete()

    @property
    def first_offset(self) -> int:
        """The oldest offset still kept (== next_offset when the log is empty)."""
        return self._log.first_offset

    @property
    def next_offset(self) -> int:
        """Offsets below are on disk and readable."""
        return self._log.next_offset

    @property
    def size(self) -> int:
        return self._log.size

    @property
    def deleted_segments(self) -> int:
        return self._log.deleted_segments

    def append(self, dead: DeadLetter, on_durable: Callable[[], None] | None = None) -> int:
        """Queue `dead` for the log, stamped with when it died; returns its
        offset. `on_durable` runs on the loop once the record is on disk."""
        dead.offset = self._log.append(_encode(dead, self.settings.include_bodies), dead.time, on_durable)
        return dead.offset

    def read(self, start: int, max_records: int, done: Callable[[list[DeadLetter] | Exception], None],
             max_bytes: int = 0) -> None:
        """Records from offset `start` on (at most `max_records`, and once
        past `max_bytes` no more; 0: no byte limit), read on the reader
        thread; `done` gets them (or an exception) on the loop."""
        def decoded(records: list | Exception) -> None:
            done(records if isinstance(records, Exception) else [_decode(*r) for r in records])
        self._log.read(start, max_records, decoded, max_bytes)
