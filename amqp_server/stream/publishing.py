"""Publishing over the stream protocol: publishers, publish (batches, sub-
entry batches, filter values in version 2), confirms and errors, and
deduplication by publisher reference.

- A publisher (id 0-255) is declared on one stream, with an optional
  reference (write permission on the stream). Each message, and each
  message of a sub-entry batch, becomes one record (vhosts.stream_records);
  a frame's records are appended together and its publishing ids confirmed
  once the last is durable (the log makes records durable in order), in a
  PublishConfirm sent once per loop turn per publisher.
- The common frame (version 1, plain entries, a publisher without a
  reference) is appended in bulk: its records framed at once
  (stream.batches, C twins when built) as one run of the log, its ids kept
  packed as the confirm carries them; no Python step per message.
- With a reference, an id at or below the highest seen for it is confirmed
  without being stored (tracking.Tracking keeps the sequences, recovered
  from the records themselves); a declare with a reference is answered once
  the stream's tracking is loaded, so a publish never meets an unloaded one.
- Errors go out as PublishError with RabbitMQ's codes: an unknown publisher
  id, a stream deleted meanwhile, a sub-entry batch that cannot be unpacked.
"""
from __future__ import annotations

import logging
import struct

from amqp_server.amqp.framing import C_TWINS
from amqp_server.stream import batches, codes, frames
from amqp_server.stream.chunks import BadBatch, unpack_batch
from amqp_server.stream.frames import Fields
from storage.log_segment import INDEX_INTERVAL
from vhosts.stream_records import amqp10_prefix

log = logging.getLogger("hutch.stream")

_ENTRY = struct.Struct(">Qi")  # publishing id, message size
_ID = struct.Struct(">Q")

MAX_SUB_BATCH = 64 * 1024 * 1024  # RabbitMQ's max uncompressed sub-entry batch size
PLAIN_PREFIX = amqp10_prefix(b"", b"")  # the record payload's start for a message without filter or reference
CONFIRMS_PER_FRAME = 8192

# The bulk step's C twins when built (and of this layout), else the Python references.
scan = batches.scan_python if C_TWINS is None else C_TWINS.publish_scan
encode_records = batches.records_python if C_TWINS is None else C_TWINS.publish_records


class Publisher:
    consumes = False  # not one of the stream's consumers (StreamQueue.consumer_count)
    __slots__ = ("id", "queue", "reference", "confirmed", "connection")

    def __init__(self, connection, publisher_id: int, queue, reference: str | None) -> None:
        self.connection = connection
        self.id = publisher_id
        self.queue = queue
        self.reference = reference or None
        self.confirmed: list[bytes] = []  # publishing ids to confirm, packed (uint64s) as PublishConfirm has them

    def records_available(self) -> None:
        """Publishers read nothing."""

    def stream_deleted(self, queue) -> None:
        self.connection.stream_gone(queue.name)


class Confirm:
    """The durable callback of a Publish frame's records: its publishing ids
    (packed uint64s) are confirmed (and, with a reference, the highest,
    `highest`, becomes the durable sequence)."""

    __slots__ = ("connection", "publisher", "ids", "tracking", "highest")

    def __init__(self, connection, publisher: Publisher, ids: bytes, tracking, highest: int = 0) -> None:
        self.connection = connection
        self.publisher = publisher
        self.ids = ids
        self.tracking = tracking
        self.highest = highest

    def __call__(self) -> None:
        if self.tracking is not None:
            self.tracking.durable(self.publisher.reference, self.highest)
        self.publisher.confirmed.append(self.ids)
        _confirming(self.connection, self.publisher)


def confirm(conn, publisher: Publisher, publishing_id: int) -> None:
    publisher.confirmed.append(_ID.pack(publishing_id))
    _confirming(conn, publisher)


def _confirming(conn, publisher: Publisher) -> None:
    """Confirms go out once per loop turn, per publisher."""
    if not conn.confirming:
        conn.io.call_soon(lambda: send_confirms(conn))
    conn.confirming.add(publisher)


def send_confirms(conn) -> None:
    confirming, conn.confirming = conn.confirming, set()
    for publisher in confirming:
        ids, publisher.confirmed = b"".join(publisher.confirmed), []
        if conn.publishers.get(publisher.id) is not publisher:
            continue
        step = CONFIRMS_PER_FRAME * _ID.size
        for start in range(0, len(ids), step):
            part = ids[start:start + step]
            conn.send(frames.frame(codes.PUBLISH_CONFIRM, 1, frames.u8(publisher.id),
                                   frames.i32(len(part) // _ID.size), part))


def declare_publisher(conn, version: int, f: Fields) -> None:
    correlation, publisher_id, reference, stream = f.u32(), f.u8(), f.string(), f.text()
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.DECLARE_PUBLISHER, correlation, codes.STREAM_DOES_NOT_EXIST)
    code = conn.check("queue", stream, "write")
    if code != codes.OK:
        return conn.respond(codes.DECLARE_PUBLISHER, correlation, code)
    if publisher_id in conn.publishers or (reference and any(
            p.reference == reference and p.queue is queue for p in conn.publishers.values())):
        return conn.respond(codes.DECLARE_PUBLISHER, correlation, codes.PRECONDITION_FAILED)
    publisher = conn.publishers[publisher_id] = Publisher(conn, publisher_id, queue, reference)
    queue.watchers.add(publisher)
    if publisher.reference:
        # Deduplication needs the sequences: answered once they are loaded.
        conn.node.tracking(queue).when_loaded(
            lambda: conn.respond(codes.DECLARE_PUBLISHER, correlation, codes.OK))
    else:
        conn.respond(codes.DECLARE_PUBLISHER, correlation, codes.OK)


def delete_publisher(conn, version: int, f: Fields) -> None:
    correlation, publisher_id = f.u32(), f.u8()
    publisher = conn.publishers.pop(publisher_id, None)
    if publisher is None:
        return conn.respond(codes.DELETE_PUBLISHER, correlation, codes.PUBLISHER_DOES_NOT_EXIST)
    publisher.queue.watchers.discard(publisher)
    conn.respond(codes.DELETE_PUBLISHER, correlation, codes.OK)


def query_publisher_sequence(conn, version: int, f: Fields) -> None:
    correlation, reference, stream = f.u32(), f.text(), f.text()
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.QUERY_PUBLISHER_SEQUENCE, correlation, codes.STREAM_DOES_NOT_EXIST,
                            frames.u64(0))
    # The highest id on disk, not one still in flight: a client resuming from it may send a
    # pending id again, which deduplication then confirms without storing it twice.
    tracking = conn.node.tracking(queue)
    tracking.when_loaded(lambda: conn.respond(codes.QUERY_PUBLISHER_SEQUENCE, correlation, codes.OK,
                                              frames.u64(tracking.sequences.get(reference, 0))))


def publish(conn, version: int, f: Fields) -> None:
    """One Publish frame: its messages become records, appended together;
    the frame's publishing ids are confirmed once its last record is on
    disk (records are durable in order)."""
    publisher_id = f.u8()
    count = f.count(12)
    publisher = conn.publishers.get(publisher_id)
    if version < 2 and publisher is not None and not publisher.reference and not publisher.queue.deleted:
        scanned = scan(f.data, f.pos, count)
        if scanned is not None:
            return _publish_plain(conn, publisher, f.data, f.pos, count, *scanned)
    errors: list[tuple[int, int]] = []
    queue = publisher.queue if publisher is not None else None
    tracking = conn.node.tracking(queue) if publisher is not None and publisher.reference else None
    if tracking is not None and not tracking.loaded:
        tracking = None  # cannot happen after a declare's answer; no deduplication without it
    reference = publisher.reference.encode("utf-8") if tracking is not None else b""
    highest = tracking.accepted.get(publisher.reference, 0) if tracking is not None else 0
    prefixes: dict[bytes, bytes] = {}
    records: list[bytes] = []
    ids: list[int] = []
    data = f.data
    for _ in range(count):
        filter_value = b""
        if version < 2 and f.left >= 13 and not data[f.pos + 8] & 0x80:
            # The common entry, parsed in one step: publishing id, size, message.
            publishing_id, size = _ENTRY.unpack_from(data, f.pos)
            f.pos += 12
            messages = (f.raw(size),)
        else:
            publishing_id = f.u64()
            if version >= 2:
                value = f.string()
                filter_value = value.encode("utf-8") if value else b""
            kind = data[f.pos] if f.left else 0
            if kind & 0x80:
                f.u8()
                batch_count, uncompressed, size = f.u16(), f.i32(), f.i32()
                batch = f.raw(size)
                if publisher is None:
                    errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
                    continue
                try:
                    messages = unpack_batch((kind >> 4) & 0x7, batch_count, uncompressed, batch, MAX_SUB_BATCH,
                                            codes.PRECONDITION_FAILED, codes.PRECONDITION_FAILED)
                except BadBatch as exc:
                    log.info("stream connection from %s: %s", conn.peer, exc)
                    errors.append((publishing_id, exc.code))
                    continue
            else:
                messages = (f.bytes_() or b"",)
        if publisher is None:
            errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
            continue
        if queue.deleted:
            errors.append((publishing_id, codes.STREAM_DOES_NOT_EXIST))
            continue
        if tracking is not None:
            if publishing_id <= highest:
                confirm(conn, publisher, publishing_id)  # a duplicate: confirmed, not stored
                continue
            highest = publishing_id
        prefix = prefixes.get(filter_value)
        if prefix is None:
            prefix = prefixes[filter_value] = amqp10_prefix(filter_value, reference)
        if reference:
            prefix = prefix + _ID.pack(publishing_id)
        records.extend(prefix + message for message in messages)
        ids.append(publishing_id)
    if records:
        if tracking is not None:
            tracking.accepted[publisher.reference] = highest
        queue.append_batch(records, Confirm(conn, publisher, b"".join(_ID.pack(i) for i in ids), tracking,
                                            max(ids)))
    f.end()
    if errors:
        conn.send(frames.frame(codes.PUBLISH_ERROR, 1, frames.u8(publisher_id), frames.array(
            [frames.u64(pid) + frames.u16(code) for pid, code in errors])))
    _flow(conn)


def _publish_plain(conn, publisher: Publisher, data: bytes, pos: int, count: int, message_bytes: int,
                   ids: bytes) -> None:
    """A frame of plain entries `scan` accepted: one run of the log."""
    if count:
        def encode(first: int, timestamp: int, since_index: int):
            return encode_records(data, pos, count, PLAIN_PREFIX, first, timestamp, since_index, INDEX_INTERVAL)
        publisher.queue.append_run(count, message_bytes + count * (batches.OVERHEAD + len(PLAIN_PREFIX)), encode,
                                   Confirm(conn, publisher, ids, None))
    _flow(conn)


def _flow(conn) -> None:
    """Alarms and the writer's backlog hold publishers back (credit flow)."""
    if conn.node.alarms.raised:
        conn.node.alarms.block(conn)
    writer = conn.node.writer
    if writer.backlogged:
        writer.flow_waiters.add(conn)
        conn.throttled_by(writer)
