"""Publishing over the stream protocol: publishers, publish (batches, sub-
entry batches, filter values in version 2), confirms and errors, and
deduplication by publisher reference.

- A publisher (id 0-255) is declared on one stream, with an optional
  reference (write permission on the stream). Each message, and each
  message of a sub-entry batch, becomes one record
  (vhosts.stream_records.encode_amqp10); the publishing id is confirmed once
  its record (the batch's last) is durable, in a PublishConfirm sent once per
  loop turn per publisher.
- With a reference, an id at or below the highest seen for it is confirmed
  without being stored (tracking.Tracking keeps the sequences, recovered
  from the records themselves); a declare with a reference is answered once
  the stream's tracking is loaded, so a publish never meets an unloaded one.
- Errors go out as PublishError with RabbitMQ's codes: an unknown publisher
  id, a stream deleted meanwhile, a sub-entry batch that cannot be unpacked.
"""
from __future__ import annotations

import logging

from amqp_server.stream import codes, frames
from amqp_server.stream.chunks import BadBatch, unpack_batch
from amqp_server.stream.frames import Fields
from vhosts.stream_records import encode_amqp10

log = logging.getLogger("hutch.stream")

MAX_SUB_BATCH = 64 * 1024 * 1024  # RabbitMQ's max uncompressed sub-entry batch size


class Publisher:
    __slots__ = ("id", "queue", "reference", "confirmed", "connection")

    def __init__(self, connection, publisher_id: int, queue, reference: str | None) -> None:
        self.connection = connection
        self.id = publisher_id
        self.queue = queue
        self.reference = reference or None
        self.confirmed: list[int] = []

    def records_available(self) -> None:
        """Publishers read nothing."""

    def stream_deleted(self, queue) -> None:
        self.connection.stream_gone(queue.name)


class Confirm:
    """The durable callback of a publish: its id is confirmed (and, with a
    reference, becomes the durable sequence)."""

    __slots__ = ("connection", "publisher", "publishing_id", "tracking")

    def __init__(self, connection, publisher: Publisher, publishing_id: int, tracking) -> None:
        self.connection = connection
        self.publisher = publisher
        self.publishing_id = publishing_id
        self.tracking = tracking

    def __call__(self) -> None:
        if self.tracking is not None:
            self.tracking.durable(self.publisher.reference, self.publishing_id)
        confirm(self.connection, self.publisher, self.publishing_id)


def confirm(conn, publisher: Publisher, publishing_id: int) -> None:
    publisher.confirmed.append(publishing_id)
    if not conn.confirming:
        conn.io.call_soon(lambda: send_confirms(conn))
    conn.confirming.add(publisher)


def send_confirms(conn) -> None:
    confirming, conn.confirming = conn.confirming, set()
    for publisher in confirming:
        ids, publisher.confirmed = publisher.confirmed, []
        if conn.publishers.get(publisher.id) is not publisher:
            continue
        for start in range(0, len(ids), 8192):
            part = ids[start:start + 8192]
            conn.send(frames.frame(codes.PUBLISH_CONFIRM, 1, frames.u8(publisher.id),
                                   frames.array([frames.u64(i) for i in part])))


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
    tracking = conn.node.tracking(queue)
    tracking.when_loaded(lambda: conn.respond(codes.QUERY_PUBLISHER_SEQUENCE, correlation, codes.OK,
                                               frames.u64(tracking.accepted.get(reference, 0))))


def publish(conn, version: int, f: Fields) -> None:
    publisher_id = f.u8()
    count = f.count(12)
    publisher = conn.publishers.get(publisher_id)
    errors: list[tuple[int, int]] = []
    queue = publisher.queue if publisher is not None else None
    tracking = conn.node.tracking(queue) if publisher is not None and publisher.reference else None
    if tracking is not None and not tracking.loaded:
        tracking = None  # cannot happen after a declare's answer; no deduplication without it
    reference = publisher.reference.encode("utf-8") if tracking is not None else b""
    for _ in range(count):
        publishing_id = f.u64()
        filter_value = b""
        if version >= 2:
            value = f.string()
            filter_value = value.encode("utf-8") if value else b""
        kind = f.data[f.pos] if f.left else 0
        if kind & 0x80:
            f.u8()
            batch_count, uncompressed, size = f.u16(), f.i32(), f.i32()
            data = f.raw(size)
            if publisher is None:
                errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
                continue
            try:
                messages = unpack_batch((kind >> 4) & 0x7, batch_count, uncompressed, data, MAX_SUB_BATCH,
                                        codes.PRECONDITION_FAILED, codes.PRECONDITION_FAILED)
            except BadBatch as exc:
                log.info("stream connection from %s: %s", conn.peer, exc)
                errors.append((publishing_id, exc.code))
                continue
        else:
            body = f.bytes_()
            if publisher is None:
                errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
                continue
            messages = [body or b""]
        if queue.deleted:
            errors.append((publishing_id, codes.STREAM_DOES_NOT_EXIST))
            continue
        if tracking is not None:
            if publishing_id <= tracking.accepted.get(publisher.reference, 0):
                confirm(conn, publisher, publishing_id)  # a duplicate: confirmed, not stored
                continue
            tracking.accepted[publisher.reference] = publishing_id
        on_durable = Confirm(conn, publisher, publishing_id, tracking)
        last = len(messages) - 1
        for i, message in enumerate(messages):
            queue.append(encode_amqp10(message, filter_value, reference, publishing_id),
                         on_durable if i == last else None)
    f.end()
    if errors:
        conn.send(frames.frame(codes.PUBLISH_ERROR, 1, frames.u8(publisher_id), frames.array(
            [frames.u64(pid) + frames.u16(code) for pid, code in errors])))
    if conn.node.alarms.raised:
        conn.node.alarms.block(conn)
    writer = conn.node.writer
    if writer.backlogged:
        writer.flow_waiters.add(conn)
        conn.throttled_by(writer)
