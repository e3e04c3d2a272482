"""Handlers for what clients hold open: connections (listing and closing),
channels and consumers. Management users see their own connections only;
monitoring and administrator users see all.

On a node of several shards, the listings add the rows the other shards
reported (amqp_server.management.shards), each row naming its "shard", and
a connection of another shard is closed by that shard."""
from __future__ import annotations

from vhosts.errors import CONNECTION_FORCED, AMQPError

from amqp_server.management import access, shapes, shards
from amqp_server.management.errors import not_authorised, not_found
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.listing import present

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _open(req, vhost_name: str | None = None, everyone: bool = False) -> list:
    """Connections past connection.open that the user may see (or all of
    them), oldest first."""
    found = [c for c in list(req.node.connections)
             if c.vhost is not None and (everyone or access.owns(req.user, c))
             and (vhost_name is None or c.vhost.name == vhost_name)]
    return sorted(found, key=lambda c: c.connected_at)


def _channels(connections) -> list:
    return [ch for c in connections for _n, ch in sorted(c.channels.items())]


def _connection(req):
    """The named connection of this shard, or None; 401 when it is someone
    else's and the user may not see it (RabbitMQ's answer)."""
    name = req.params["name"]
    for connection in _open(req, everyone=True):
        if shapes.connection_name(connection) == name:
            return access.owned(req.user, connection)
    return None


CLIENTS = ("connections", "channels", "consumers")


async def _others(req) -> list:
    """The other shards' reports of their clients (amqp_server.management.shards)."""
    return await shards.gathered(req.node, CLIENTS, shapes.reading_of(req))


def _remote_connection(req, found) -> dict:
    """The named connection's row from the shard that holds it (`found`:
    the other shards' reports): 404 when no shard has it, 401 when the user
    may not see it."""
    name = req.params["name"]
    for row in shards.remote_rows(found, "connections"):
        if row["name"] == name:
            if not (access.sees_everything(req.user) or row["user"] == req.user.name):
                raise not_authorised("User not authorised to access object")
            return row
    raise not_found()


async def _connections(req, connections, vhost_name: str | None = None) -> list:
    """This shard's connections (shaped only if listed: `present`) and the
    other shards' rows, oldest first."""
    reading = shapes.reading_of(req)
    rows = shards.visible_rows(req, await _others(req), "connections", vhost_name)
    items = sorted(connections + rows,
                   key=lambda item: item["connected_at"] if isinstance(item, dict) else item.connected_at)
    return present(items, req.query,
                   lambda item: item if isinstance(item, dict) else shards.marked(
                       req.node, shapes.connection(reading, item)),
                   lambda item: item["name"] if isinstance(item, dict) else shapes.connection_name(item))


def _channel_list(req, connections, rows=()) -> list:
    """The channels of this shard's `connections`, then the other shards' `rows`."""
    reading = shapes.reading_of(req)
    return present(_channels(connections) + list(rows), req.query,
                   lambda item: item if isinstance(item, dict) else shards.marked(
                       req.node, shapes.channel(reading, item)),
                   lambda item: item["name"] if isinstance(item, dict) else shapes.channel_name(item))


async def connections(req) -> list:
    return await _connections(req, _open(req))


async def vhost_connections(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return await _connections(req, _open(req, name), name)


async def connection(req) -> dict:
    found = _connection(req)
    if found is None:
        return _remote_connection(req, await _others(req))
    return shards.marked(req.node, shapes.connection(shapes.reading_of(req), found))


async def close_connection(req):
    """connection.close 320 CONNECTION_FORCED with the X-Reason header's text
    or RabbitMQ's default; only the owner or an administrator may. A
    connection of another shard is closed there."""
    found = _connection(req)
    row = _remote_connection(req, await _others(req)) if found is None else None
    owner = found.user.name if found is not None else row["user"]
    if not (access.has(req.user, access.ADMINISTRATOR) or owner == req.user.name):
        raise not_authorised("Not administrator user")
    reason = req.headers.get("X-Reason") or DEFAULT_CLOSE_REASON
    if found is not None:
        found.close_with(AMQPError(CONNECTION_FORCED, reason))
        return NO_CONTENT
    try:
        closed = await shards.ask(req.node, row["shard"], "connection.close", row["name"], reason)
    except Exception:  # the shard ended before it answered (ShardGone): its connections went with it
        closed = False
    if not closed:
        raise not_found()
    return NO_CONTENT


async def connection_channels(req) -> list:
    found = _connection(req)
    if found is not None:
        return _channel_list(req, [found])
    others = await _others(req)
    name = _remote_connection(req, others)["name"]
    return _channel_list(req, [], [row for row in shards.remote_rows(others, "channels")
                                   if row["connection_details"]["name"] == name])


async def channels(req) -> list:
    return _channel_list(req, _open(req), shards.visible_rows(req, await _others(req), "channels"))


async def vhost_channels(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return _channel_list(req, _open(req, name), shards.visible_rows(req, await _others(req), "channels", name))


async def channel(req) -> dict:
    for ch in _channels(_open(req, everyone=True)):
        if shapes.channel_name(ch) == req.params["name"]:
            access.owned(req.user, ch.connection)
            out = shards.marked(req.node, shapes.channel(shapes.reading_of(req), ch))
            out["consumer_details"] = [shards.marked(req.node, shapes.consumer(ch, c))
                                       for c in ch.consumers.values()]
            return _without_fine_stats(out)
    others = await _others(req)
    for row in shards.remote_rows(others, "channels"):
        if row["name"] == req.params["name"]:
            if not (access.sees_everything(req.user) or row["user"] == req.user.name):
                raise not_authorised("User not authorised to access object")
            out = dict(row)
            out["consumer_details"] = [c for c in shards.remote_rows(others, "consumers")
                                       if c["channel_details"]["name"] == row["name"]]
            return _without_fine_stats(out)
    raise not_found()


def _without_fine_stats(out: dict) -> dict:
    """RabbitMQ's per-exchange and per-queue lists, kept only with fine-grained statistics."""
    out["deliveries"] = []
    out["publishes"] = []
    return out


async def consumers(req) -> list:
    """Every consumer on the vhosts the user may see (RabbitMQ lists them per
    vhost, not per connection owner); for a vhost the user may not see, none
    (RabbitMQ's empty list, not a refusal)."""
    name = req.params.get("vhost")
    names = {v.name for v in access.visible_vhosts(req.user, req.broker)}
    if name is not None:
        if name not in req.broker.vhosts:
            raise not_found()
        names &= {name}
    out = [shards.marked(req.node, shapes.consumer(ch, c)) for ch in _channels(list(req.node.connections))
           if ch.vhost.name in names for c in ch.consumers.values()]
    out += [row for row in shards.remote_rows(await _others(req), "consumers") if row["queue"]["vhost"] in names]
    return present(out, req.query)
