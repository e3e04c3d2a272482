"""hutch's own management API operations, which RabbitMQ does not have:
peek at a queue's head and move messages out of a queue (hutchctl's `peek`
and `move`; docs/management.md).

Both are checked with the user's AMQP permissions as the operations they
resemble: a peek reads the queue (read, as basic.get); a move reads the
source (read) and publishes to the destination (write on the destination
queue, or on the exchange and, for a topic exchange and a given routing
key, the topic permission), like a shovel running as that user.
"""
from __future__ import annotations

from amqp_server.management import shards
from amqp_server.management.errors import amqp_errors_as_http, bad_request
from amqp_server.management.operations import rendered
from amqp_server.management.resources import exchange_name, find_queue


def _count(value, default: int | None) -> int | None:
    """A non-negative count (a numeric string from a query too); None/absent: `default`."""
    if value is None:
        return default
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request("count must be a non-negative integer")
    return value


async def peek(req) -> list:
    """A queue of another shard of the node is peeked at by its owner."""
    v, queue = find_queue(req)
    count = _count(req.query.get("count"), 1)
    with amqp_errors_as_http():
        req.access(v).check("queue", queue.name, "read")
        if getattr(queue, "remote", False):
            return await shards.at_owner(req.node, queue, "queue.peek", v.name, queue.name, count)
        return await _peeked(v, queue, count)


async def _peeked(v, queue, count: int) -> list:
    entries = await v.peek_queue(queue.name, count)
    ready = queue.message_count
    # message_count: the ready messages behind each one, as a get shows it
    return [rendered(entry, max(ready - i - 1, 0), "auto", None) for i, entry in enumerate(entries)]


@shards.service("queue.peek")
async def _peek_here(node, vhost: str, name: str, count: int) -> list:
    found = shards.owned_queue(node, vhost, name)
    return [] if found is None else await _peeked(*found, count)


def _destination(body: dict) -> tuple[str, str, str | None]:
    """(kind, name, routing key) of a move's "destination" object."""
    target = body.get("destination")
    if not isinstance(target, dict) or ("queue" in target) == ("exchange" in target):
        raise bad_request("destination must name exactly one of queue or exchange")
    kind = "queue" if "queue" in target else "exchange"
    name, key = target[kind], target.get("routing_key")
    if not isinstance(name, str) or (key is not None and not isinstance(key, str)):
        raise bad_request("destination names and routing_key must be strings")
    if kind == "queue" and key is not None:
        raise bad_request("routing_key applies only to an exchange destination")
    return kind, (exchange_name(name) if kind == "exchange" else name), key


async def move(req) -> dict:
    v, queue = find_queue(req)
    body = req.body()
    kind, name, key = _destination(body)
    count = _count(body.get("count"), None)
    checks = req.access(v)
    with amqp_errors_as_http():
        checks.check("queue", queue.name, "read")
        if kind == "queue":
            checks.check("queue", name, "write")
        else:
            checks.publish(name)
            if key is not None:
                checks.topic(v.exchanges.get(name), key, "write")
        if getattr(queue, "remote", False):  # the owner moves them (to wherever they go from there)
            moved = await shards.at_owner(req.node, queue, "queue.move", v.name, queue.name, name, kind, count, key)
        else:
            moved = await v.move_messages(queue.name, name, kind, count, key)
    return {"moved": moved}


@shards.service("queue.move")
async def _move_here(node, vhost: str, source: str, destination: str, kind: str, count, key) -> int:
    found = shards.owned_queue(node, vhost, source)
    return 0 if found is None else await found[0].move_messages(source, destination, kind, count, key)
