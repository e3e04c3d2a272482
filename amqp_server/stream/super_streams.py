"""Super streams over the stream protocol: a direct exchange with the
argument x-super-stream and one stream per partition bound to it with the
partition's binding key and x-stream-partition-order (the same shape
`hutchctl add_super_stream` and RabbitMQ make, docs/streams.md)."""
from __future__ import annotations

from vhosts.errors import NOT_FOUND, AMQPError

ORDER = "x-stream-partition-order"


class AlreadyExists(Exception):
    """The super stream's exchange or one of its partitions exists."""


def partitions(vhost, super_stream: str) -> list[str]:
    """The partition streams in partition order; AMQPError 404 when there is
    no such exchange."""
    vhost.exchange(super_stream)
    bound = sorted((_order(args), dest.name)
                   for _source, dest, _key, args in _bindings(vhost, super_stream) if dest.kind == "queue")
    seen, out = set(), []
    for _position, name in bound:
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _order(args: dict) -> int:
    order = args.get(ORDER, 0)
    return order if isinstance(order, int) else 0


def _bindings(vhost, exchange: str):
    for source, dest, key, args in vhost.bindings():
        if source == exchange:
            yield source, dest, key, args or {}


def route(vhost, super_stream: str, routing_key: str) -> list[str]:
    """The partitions a routing key goes to (the exchange's own routing)."""
    vhost.exchange(super_stream)
    seen, out = set(), []
    for _source, dest, key, _args in _bindings(vhost, super_stream):
        if dest.kind == "queue" and key == routing_key and dest.name not in seen:
            seen.add(dest.name)
            out.append(dest.name)
    return out


def partition_index(vhost, super_stream: str, stream: str) -> int:
    try:
        return partitions(vhost, super_stream).index(stream)
    except (AMQPError, ValueError):
        return 0


def create(vhost, name: str, streams: list[str], keys: list[str], arguments: dict, owner, access) -> None:
    """Declare the partitions (streams with `arguments`), the exchange and
    the bindings; AMQPError as AMQP would answer each step."""
    if name in vhost.exchanges or any(s in vhost.queues for s in streams):
        raise AlreadyExists(name)
    access.check("exchange", name, "configure")
    for stream in streams:
        access.check("queue", stream, "configure")
    vhost.declare_exchange(name, "direct", durable=True, arguments={"x-super-stream": True}, access=access)
    for order, (stream, key) in enumerate(zip(streams, keys)):
        vhost.declare_queue(stream, owner, durable=True, arguments={**arguments, "x-queue-type": "stream"},
                            access=access)
        vhost.bind_queue(stream, name, key, {ORDER: order}, owner, access=access)


def delete(vhost, name: str, owner, access) -> None:
    x = vhost.exchanges.get(name)
    if x is None:
        raise AMQPError(NOT_FOUND, "super stream %s does not exist" % name)
    streams = partitions(vhost, name)
    access.check("exchange", name, "configure")
    for stream in streams:
        access.check("queue", stream, "configure")
    vhost.delete_exchange(name, access=access)
    for stream in streams:
        vhost.delete_queue(stream, owner, access=access)
