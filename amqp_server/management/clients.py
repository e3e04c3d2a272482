"""Handlers for what clients hold open: connections (listing and closing),
channels and consumers. Management users see their own connections only;
monitoring and administrator users see all."""
from __future__ import annotations

from vhosts.errors import CONNECTION_FORCED, AMQPError

from amqp_server.management import access, shapes
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
    """The named connection: 404 when there is none, 401 when it is
    someone else's and the user may not see it (RabbitMQ's answers)."""
    name = req.params["name"]
    for connection in _open(req, everyone=True):
        if shapes.connection_name(connection) == name:
            return access.owned(req.user, connection)
    raise not_found()


def _connections(req, found) -> list:
    reading = shapes.reading_of(req)
    return present(found, req.query, lambda c: shapes.connection(reading, c), shapes.connection_name)


def _channel_list(req, found) -> list:
    reading = shapes.reading_of(req)
    return present(_channels(found), req.query, lambda ch: shapes.channel(reading, ch), shapes.channel_name)


def connections(req) -> list:
    return _connections(req, _open(req))


def vhost_connections(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return _connections(req, _open(req, name))


def connection(req) -> dict:
    return shapes.connection(shapes.reading_of(req), _connection(req))


def close_connection(req):
    """connection.close 320 CONNECTION_FORCED with the X-Reason header's text
    or RabbitMQ's default; only the owner or an administrator may."""
    found = _connection(req)
    if not (access.has(req.user, access.ADMINISTRATOR) or found.user.name == req.user.name):
        raise not_authorised("Not administrator user")
    found.close_with(AMQPError(CONNECTION_FORCED, req.headers.get("X-Reason") or DEFAULT_CLOSE_REASON))
    return NO_CONTENT


def connection_channels(req) -> list:
    return _channel_list(req, [_connection(req)])


def channels(req) -> list:
    return _channel_list(req, _open(req))


def vhost_channels(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return _channel_list(req, _open(req, name))


def channel(req) -> dict:
    for ch in _channels(_open(req, everyone=True)):
        if shapes.channel_name(ch) == req.params["name"]:
            access.owned(req.user, ch.connection)
            out = shapes.channel(shapes.reading_of(req), ch)
            out["consumer_details"] = [shapes.consumer(ch, c) for c in ch.consumers.values()]
            # RabbitMQ's per-exchange and per-queue lists, kept only with fine-grained statistics
            out["deliveries"] = []
            out["publishes"] = []
            return out
    raise not_found()


def consumers(req) -> list:
    """Every consumer on the vhosts the user may see (RabbitMQ lists them per
    vhost, not per connection owner); for a vhost the user may not see, none
    (RabbitMQ's empty list, not a refusal)."""
    name = req.params.get("vhost")
    names = {v.name for v in access.visible_vhosts(req.user, req.broker)}
    if name is not None:
        if name not in req.broker.vhosts:
            raise not_found()
        names &= {name}
    out = [shapes.consumer(ch, c) for ch in _channels(list(req.node.connections))
           if ch.vhost.name in names for c in ch.consumers.values()]
    return present(out, req.query)
