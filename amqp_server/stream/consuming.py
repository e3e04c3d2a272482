"""Consuming over the stream protocol: subscribe (every offset
specification, credit, filters, single active consumer), credit,
unsubscribe, consumer updates, store/query offset and resolve offset spec.
The reading itself is `subscription.Subscription`'s."""
from __future__ import annotations

from amqp_server.stream import codes, frames, super_streams
from amqp_server.stream.frames import Fields, Malformed
from amqp_server.stream.subscription import Subscription

MAX_CREDIT = 0xFFFF * 16


def offset_spec(f: Fields) -> tuple[int, int]:
    kind = f.u16()
    if kind == codes.OFFSET_OFFSET:
        return kind, f.u64()
    if kind == codes.OFFSET_TIMESTAMP:
        return kind, f.i64()
    if kind in (codes.OFFSET_FIRST, codes.OFFSET_LAST, codes.OFFSET_NEXT, codes.OFFSET_NONE):
        return kind, 0
    raise Malformed("offset specification type %d" % kind)


def resolve(queue, spec: tuple[int, int], then) -> None:
    """`then(offset)` with where `spec` starts in `queue`, as RabbitMQ 3.11+:
    an offset below the first kept is the first, one past the end is next."""
    kind, value = spec
    log_ = queue.log
    if kind == codes.OFFSET_FIRST:
        then(log_.first_offset)
    elif kind == codes.OFFSET_LAST:
        then(max(log_.next_offset - 1, log_.first_offset))
    elif kind == codes.OFFSET_OFFSET:
        then(min(max(value, log_.first_offset), log_.next_offset))
    elif kind == codes.OFFSET_TIMESTAMP:
        log_.find_time(value / 1000, lambda found: then(log_.first_offset if isinstance(found, Exception)
                                                        else found))
    else:
        then(log_.next_offset)


def subscribe(conn, version: int, f: Fields) -> None:
    correlation, subscription_id, stream = f.u32(), f.u8(), f.text()
    spec = offset_spec(f)
    credit = f.u16()
    properties = f.string_map() if f.left else {}
    if subscription_id in conn.subscriptions:
        return conn.respond(codes.SUBSCRIBE, correlation, codes.SUBSCRIPTION_ID_ALREADY_EXISTS)
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.SUBSCRIBE, correlation, codes.STREAM_DOES_NOT_EXIST)
    code = conn.check("queue", stream, "read")
    if code != codes.OK:
        return conn.respond(codes.SUBSCRIBE, correlation, code)
    single_active = properties.get("single-active-consumer", "").lower() == "true"
    name = properties.get("name")
    if single_active and not name:
        return conn.respond(codes.SUBSCRIBE, correlation, codes.PRECONDITION_FAILED)
    values = frozenset(v.encode("utf-8") for k, v in properties.items() if k.startswith("filter."))
    subscription = Subscription(conn, subscription_id, queue, credit, values or None,
                                properties.get("match-unfiltered", "").lower() == "true", properties)
    subscription.requested = spec
    conn.subscriptions[subscription_id] = subscription
    queue.watchers.add(subscription)
    conn.respond(codes.SUBSCRIBE, correlation, codes.OK)
    if single_active:
        subscription.active = False
        super_stream = properties.get("super-stream")
        partition = (super_streams.partition_index(conn.vhost, super_stream, stream)
                     if super_stream else None)
        subscription.group = (conn.vhost.name, stream, name)
        conn.node.groups.join(subscription.group, subscription, partition)
    else:
        resolve(queue, spec, subscription.start_at)


def consumer_update_answer(conn, version: int, f: Fields) -> None:
    correlation = f.u32()
    f.u16()  # the response code: an answer is an answer
    kind = f.u16() if f.left >= 2 else codes.OFFSET_NONE
    value = f.u64() if f.left >= 8 else 0
    subscription = conn.updates.pop(correlation, None)
    if subscription is None or subscription.closed:
        return
    group = conn.node.groups.groups.get(subscription.group)
    if group is None or group.active is not subscription:
        return  # superseded meanwhile
    subscription.active = True
    if kind == codes.OFFSET_NONE:
        spec = subscription.requested
    elif kind in (codes.OFFSET_FIRST, codes.OFFSET_LAST, codes.OFFSET_NEXT, codes.OFFSET_OFFSET,
                  codes.OFFSET_TIMESTAMP):
        spec = (kind, value if kind != codes.OFFSET_TIMESTAMP else value - (1 << 64) * (value >> 63))
    else:
        raise Malformed("offset specification type %d" % kind)
    subscription.next = -1
    resolve(subscription.queue, spec, subscription.start_at)


def credit(conn, version: int, f: Fields) -> None:
    subscription_id, credit = f.u8(), f.u16()
    subscription = conn.subscriptions.get(subscription_id)
    if subscription is None:
        # The only response to a credit, and without a correlation id.
        conn.send(frames.frame(codes.CREDIT | codes.RESPONSE, 1, frames.u16(codes.SUBSCRIPTION_ID_DOES_NOT_EXIST),
                               frames.u8(subscription_id)))
        return
    subscription.credit = min(subscription.credit + credit, MAX_CREDIT)
    subscription.pump()


def unsubscribe(conn, version: int, f: Fields) -> None:
    correlation, subscription_id = f.u32(), f.u8()
    subscription = conn.subscriptions.get(subscription_id)
    if subscription is None:
        return conn.respond(codes.UNSUBSCRIBE, correlation, codes.SUBSCRIPTION_ID_DOES_NOT_EXIST)
    conn.drop_subscription(subscription)
    conn.respond(codes.UNSUBSCRIBE, correlation, codes.OK)


def store_offset(conn, version: int, f: Fields) -> None:
    reference, stream, offset = f.text(), f.text(), f.u64()
    queue = conn.stream(stream)
    if queue is None or not reference or conn.check("queue", stream, "read") != codes.OK:
        return  # no response to store offset, as RabbitMQ
    conn.node.tracking(queue).store_offset(reference, offset)


def query_offset(conn, version: int, f: Fields) -> None:
    correlation, reference, stream = f.u32(), f.text(), f.text()
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.QUERY_OFFSET, correlation, codes.STREAM_DOES_NOT_EXIST, frames.u64(0))
    code = conn.check("queue", stream, "read")
    if code != codes.OK:
        return conn.respond(codes.QUERY_OFFSET, correlation, code, frames.u64(0))
    tracking = conn.node.tracking(queue)

    def answer() -> None:
        offset = tracking.offsets.get(reference)
        conn.respond(codes.QUERY_OFFSET, correlation, codes.OK if offset is not None else codes.NO_OFFSET,
                     frames.u64(offset or 0))
    tracking.when_loaded(answer)


def resolve_offset_spec(conn, version: int, f: Fields) -> None:
    correlation, stream = f.u32(), f.text()
    spec = offset_spec(f)
    if f.left:
        f.string_map()
    queue = conn.stream(stream)
    if queue is None:
        return conn.respond(codes.RESOLVE_OFFSET_SPEC, correlation, codes.STREAM_DOES_NOT_EXIST,
                            frames.u16(codes.OFFSET_OFFSET), frames.u64(0))
    code = conn.check("queue", stream, "read")
    if code != codes.OK:
        return conn.respond(codes.RESOLVE_OFFSET_SPEC, correlation, code, frames.u16(codes.OFFSET_OFFSET),
                            frames.u64(0))
    resolve(queue, spec, lambda offset: conn.respond(
        codes.RESOLVE_OFFSET_SPEC, correlation, codes.OK, frames.u16(codes.OFFSET_OFFSET), frames.u64(offset)))
