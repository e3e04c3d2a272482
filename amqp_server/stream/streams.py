"""Stream-level commands: create and delete (arguments as RabbitMQ's), metadata,
stream stats, exchange command versions, and the super stream commands
(route, partitions, create, delete; super_streams)."""
from __future__ import annotations

import logging

from amqp_server.stream import codes, frames, super_streams
from amqp_server.stream.frames import Fields
from vhosts.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, AMQPError

log = logging.getLogger("hutch.stream")

# vhost-layer reply codes as stream response codes
CODES = {ACCESS_REFUSED: codes.ACCESS_REFUSED, NOT_FOUND: codes.STREAM_DOES_NOT_EXIST,
         PRECONDITION_FAILED: codes.PRECONDITION_FAILED}
# create-stream arguments and the queue arguments they become (None: accepted, no meaning on one node;
# stream-filter-size-bytes is range-checked as the queue argument, though hutch keeps no Bloom filter)
ARGUMENTS = {"max-length-bytes": ("x-max-length-bytes", int), "max-age": ("x-max-age", str),
             "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
             "initial-cluster-size": (None, int), "queue-leader-locator": (None, str),
             "stream-filter-size-bytes": ("x-stream-filter-size-bytes", int)}


def queue_arguments(arguments: dict[str, str]) -> dict:
    out = {"x-queue-type": "stream"}
    for key, value in arguments.items():
        known = ARGUMENTS.get(key)
        if known is None:
            raise AMQPError(PRECONDITION_FAILED, "unknown stream argument %s" % key)
        name, kind = known
        try:
            converted = kind(value)
        except ValueError:
            raise AMQPError(PRECONDITION_FAILED, "invalid value for stream argument %s: %s" % (key, value)) from None
        if name is not None:
            out[name] = converted
    return out


def create(conn, version: int, f: Fields) -> None:
    correlation, stream, arguments = f.u32(), f.text(), f.string_map()
    if stream in conn.vhost.queues:
        return conn.respond(codes.CREATE_STREAM, correlation, codes.STREAM_ALREADY_EXISTS)
    try:
        conn.vhost.declare_queue(stream, conn, durable=True, arguments=queue_arguments(arguments),
                                 access=conn.access)
    except AMQPError as exc:
        log.info("stream connection from %s: create stream %s refused: %s", conn.peer, stream, exc.reply_text)
        return conn.respond(codes.CREATE_STREAM, correlation, CODES.get(exc.reply_code, codes.PRECONDITION_FAILED))
    conn.respond(codes.CREATE_STREAM, correlation, codes.OK)


def delete(conn, version: int, f: Fields) -> None:
    correlation, stream = f.u32(), f.text()
    if conn.stream(stream) is None:
        return conn.respond(codes.DELETE_STREAM, correlation, codes.STREAM_DOES_NOT_EXIST)
    try:
        conn.vhost.delete_queue(stream, conn, access=conn.access)
    except AMQPError as exc:
        return conn.respond(codes.DELETE_STREAM, correlation, CODES.get(exc.reply_code, codes.INTERNAL_ERROR))
    conn.respond(codes.DELETE_STREAM, correlation, codes.OK)


def metadata(conn, version: int, f: Fields) -> None:
    """The leader (this node) of each stream and its replicas: in a
    cluster the in-sync followers (every stream is on every member), on one
    node none, as RabbitMQ with one node. The broker list names only the
    brokers an entry refers to, as RabbitMQ's (none when no stream exists)."""
    correlation = f.u32()
    streams = f.strings()
    entries = []
    found = False
    replicas = conn.node.replicas(conn.node.tls(conn))
    references = frames.array([frames.u16(1 + i) for i in range(len(replicas))])
    for name in streams:
        if conn.stream(name) is not None:
            found = True
            entries.append(frames.string(name) + frames.u16(codes.OK) + frames.u16(0) + references)
        else:
            entries.append(frames.string(name) + frames.u16(codes.STREAM_DOES_NOT_EXIST) + frames.u16(0xFFFF)
                           + frames.array([]))
    brokers = []
    if found:
        for reference, (host, port) in enumerate([conn.node.advertised(conn), *replicas]):
            brokers.append(frames.u16(reference) + frames.string(host) + frames.u32(port))
    conn.send(frames.frame(codes.METADATA | codes.RESPONSE, 1, frames.u32(correlation), frames.array(brokers),
                           frames.array(entries)))


def stream_stats(conn, version: int, f: Fields) -> None:
    correlation, stream = f.u32(), f.text()
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.STREAM_STATS, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
    code = conn.check("queue", stream, "read")
    if code != codes.OK:
        return conn.respond(codes.STREAM_STATS, correlation, code, frames.array([]))
    log_ = queue.log
    empty = log_.next_offset <= log_.first_offset
    stats = {"first_chunk_id": -1 if empty else log_.first_offset,
             "committed_chunk_id": -1 if empty else log_.next_offset - 1}
    conn.respond(codes.STREAM_STATS, correlation, codes.OK,
                 frames.array([frames.string(k) + frames.i64(v) for k, v in stats.items()]))


def exchange_command_versions(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    for _ in range(f.count(6)):
        key = f.u16()
        f.u16()  # the client's lowest version of it
        high = f.u16()
        if key == codes.DELIVER:
            conn.deliver_version = min(high, codes.COMMAND_VERSIONS[codes.DELIVER][1])
    conn.respond(codes.EXCHANGE_COMMAND_VERSIONS, correlation, codes.OK, frames.array(
        [frames.u16(k) + frames.u16(low) + frames.u16(high)
         for k, (low, high) in sorted(codes.COMMAND_VERSIONS.items())]))


def route(conn, version: int, f: Fields) -> None:
    correlation, routing_key, super_stream = f.u32(), f.text(), f.text()
    try:
        streams = super_streams.route(conn.vhost, super_stream, routing_key)
    except AMQPError:
        return conn.respond(codes.ROUTE, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
    conn.respond(codes.ROUTE, correlation, codes.OK, frames.array([frames.string(s) for s in streams]))


def partitions(conn, version: int, f: Fields) -> None:
    correlation, super_stream = f.u32(), f.text()
    try:
        streams = super_streams.partitions(conn.vhost, super_stream)
    except AMQPError:
        return conn.respond(codes.PARTITIONS, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
    conn.respond(codes.PARTITIONS, correlation, codes.OK, frames.array([frames.string(s) for s in streams]))


def create_super_stream(conn, version: int, f: Fields) -> None:
    correlation, name = f.u32(), f.text()
    streams, keys, arguments = f.strings(), f.strings(), f.string_map()
    if not streams or len(streams) != len(keys):
        return conn.respond(codes.CREATE_SUPER_STREAM, correlation, codes.PRECONDITION_FAILED)
    try:
        super_streams.create(conn.vhost, name, streams, keys, queue_arguments(arguments), conn,
                             conn.access)
    except super_streams.AlreadyExists:
        return conn.respond(codes.CREATE_SUPER_STREAM, correlation, codes.STREAM_ALREADY_EXISTS)
    except AMQPError as exc:
        log.info("stream connection from %s: create super stream %s refused: %s", conn.peer, name,
                 exc.reply_text)
        return conn.respond(codes.CREATE_SUPER_STREAM, correlation,
                            CODES.get(exc.reply_code, codes.PRECONDITION_FAILED))
    conn.respond(codes.CREATE_SUPER_STREAM, correlation, codes.OK)


def delete_super_stream(conn, version: int, f: Fields) -> None:
    correlation, name = f.u32(), f.text()
    try:
        super_streams.delete(conn.vhost, name, conn, conn.access)
    except AMQPError as exc:
        return conn.respond(codes.DELETE_SUPER_STREAM, correlation,
                            CODES.get(exc.reply_code, codes.INTERNAL_ERROR))
    conn.respond(codes.DELETE_SUPER_STREAM, correlation, codes.OK)
