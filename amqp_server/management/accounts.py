"""Handlers for vhosts, users and permissions (administrators change them;
vhosts are listed to whoever may see them). Changes go through
`vhosts.Broker`, which stores them durably."""
from __future__ import annotations

import base64
import binascii

from vhosts.errors import CONNECTION_FORCED, AMQPError
from vhosts.users import Permission, hash_password

from amqp_server.management import access, shapes, shards
from amqp_server.management.errors import bad_request, not_found
from amqp_server.management.http import CREATED, NO_CONTENT
from amqp_server.management.listing import present

# -- vhosts -------------------------------------------------------------------


async def vhosts(req) -> list:
    reading = shapes.reading_of(req)
    unacked = shapes.unacked_by_queue(shards.holders(req.node))
    found = await shards.gathered(req.node, VHOST_PARTS, reading)
    return present(access.visible_vhosts(req.user, req.broker), req.query,
                   lambda v: _vhost(req, reading, v, unacked, found), lambda v: v.name)


async def vhost(req) -> dict:
    v = req.vhost(req.params["vhost"])
    reading = shapes.reading_of(req)
    found = await shards.gathered(req.node, VHOST_PARTS, reading)
    return _vhost(req, reading, v, shapes.unacked_by_queue(shards.holders(req.node)), found)


VHOST_PARTS = ("vhosts", "connections")
DATA_KEYS = ("recv_oct", "send_oct", "recv_oct_details", "send_oct_details")


def _vhost(req, reading, v, unacked, found) -> dict:
    """A vhost's row; on a node of several shards, with every shard's
    messages, message_stats and connections' traffic (`found`: the other
    shards' reports)."""
    out = shapes.vhost(reading, v, unacked, req.node.connections)
    if req.node.shards is None:
        return out
    lengths, stats = shards.vhost_totals(reading, [v], unacked, found)
    out.update(lengths)
    if any(stats[key] for key in shapes.VHOST_STATS):
        out["message_stats"] = stats
    for row in shards.remote_rows(found, "connections"):
        if row["vhost"] == v.name:
            out.update(shards.add_figures({key: out[key] for key in DATA_KEYS}, {key: row[key] for key in DATA_KEYS}))
    return out


def _tracing(value) -> bool | None:
    """RabbitMQ's "tracing": a boolean (or "true"/"false"); None: unchanged."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value is not None and not isinstance(value, bool):
        raise bad_request("tracing must be a boolean")
    return value


def put_vhost(req):
    """Creates the vhost or replaces its description and tags (absent: none,
    as RabbitMQ); "tracing" turns the firehose on or off
    (vhosts.firehose), absent leaves it as it is. A default queue type
    is accepted and not kept: RabbitMQ 3.10 reports "undefined" whatever
    was sent, and hutch has classic queues only. The user who creates it
    gets full permissions on it, as on RabbitMQ."""
    body = req.body()
    tracing = _tracing(body.get("tracing"))
    description, tags = vhost_metadata(body)
    name = req.params["vhost"]
    existed = name in req.broker.vhosts
    found = req.broker.add_vhost(name, description, tags, acting_user=req.user.name)
    if tracing is not None:
        req.broker.set_tracing(found.name, tracing)
    return NO_CONTENT if existed else CREATED


def vhost_metadata(item: dict) -> tuple[str, list[str]]:
    """A vhost's description and tags from a PUT body or a definitions
    entry: top-level keys, or RabbitMQ's export "metadata" object."""
    metadata = item.get("metadata")
    if metadata is None:
        metadata = item
    elif not isinstance(metadata, dict):
        raise bad_request("metadata must be an object")
    description = metadata.get("description", "")
    if not isinstance(description, str):
        raise bad_request("description must be a string")
    return description, tags_from(metadata.get("tags", []))


def put_trace(req):
    """hutch's PUT /api/hutch/trace/{vhost} {"enabled": bool}: trace_on / trace_off."""
    found = req.broker.vhosts.get(req.params["vhost"])
    if found is None:
        raise not_found()
    enabled = req.body().get("enabled")
    if not isinstance(enabled, bool):
        raise bad_request("[{key_missing,enabled}]" if enabled is None else "enabled must be a boolean")
    req.broker.set_tracing(found.name, enabled)
    return NO_CONTENT


def delete_vhost(req):
    name = req.params["vhost"]
    if name not in req.broker.vhosts:
        raise not_found()
    for connection in list(req.node.connections):
        if connection.vhost is not None and connection.vhost.name == name:
            connection.close_with(AMQPError(CONNECTION_FORCED, "vhost '%s' is deleted" % name))
    req.broker.delete_vhost(name)
    return NO_CONTENT


def vhost_permissions(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return present([shapes.permission(u.name, name, u.permissions[name])
                    for u in _sorted_users(req) if name in u.permissions], req.query)


# -- users and permissions ------------------------------------------------------


def _sorted_users(req) -> list:
    return [req.broker.users[name] for name in sorted(req.broker.users)]


def _user(req):
    found = req.broker.users.get(req.params["user"])
    if found is None:
        raise not_found()
    return found


def users(req) -> list:
    return present([shapes.user(u) for u in _sorted_users(req)], req.query)


def users_without_permissions(req) -> list:
    return present([shapes.user(u) for u in _sorted_users(req) if not u.permissions], req.query)


def user(req) -> dict:
    return shapes.user(_user(req))


def tags_from(value) -> list[str]:
    """RabbitMQ accepts tags as "a,b" or ["a", "b"]."""
    if isinstance(value, str):
        return [tag.strip() for tag in value.split(",") if tag.strip()]
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return [tag.strip() for tag in value if tag.strip()]
    raise bad_request("tags must be a string or a list of strings")


def put_user(req):
    body = req.body()
    if "tags" not in body:
        raise bad_request("tags_not_present")
    tags = tags_from(body["tags"])
    name = req.params["user"]
    existing = req.broker.users.get(name)
    if "password" in body:
        if not isinstance(body["password"], str):
            raise bad_request("password must be a string")
        password_hash = hash_password(body["password"])
    elif "password_hash" in body:
        password_hash = imported_hash(body)
    else:
        password_hash = existing.password_hash if existing is not None else ""
    req.broker.put_user(name, password_hash, tags)
    return NO_CONTENT if existing is not None else CREATED


def imported_hash(entry: dict) -> str:
    """A password hash given in a user object: only RabbitMQ's default
    scheme (salted SHA-256) is understood."""
    algorithm = entry.get("hashing_algorithm", "rabbit_password_hashing_sha256")
    if algorithm != "rabbit_password_hashing_sha256":
        raise bad_request("unsupported hashing_algorithm '%s'" % algorithm)
    value = entry.get("password_hash")
    if not isinstance(value, str):
        raise bad_request(["not_string", "password_hash"])
    try:
        base64.b64decode(value, validate=True)
    except binascii.Error:
        raise bad_request(["not_base64", value]) from None
    return value


def delete_user(req):
    _user(req)
    req.broker.delete_user(req.params["user"])
    return NO_CONTENT


def bulk_delete_users(req):
    names = req.body().get("users")
    if not isinstance(names, list):
        raise bad_request("[{key_missing,users}]")
    for name in names:  # in order, as RabbitMQ: the ones before a missing user are deleted
        if isinstance(name, str):
            if name not in req.broker.users:
                raise bad_request(["no_such_user", name])
            req.broker.delete_user(name)
    return NO_CONTENT


def user_permissions(req) -> list:
    found = _user(req)
    return present([shapes.permission(found.name, v, found.permissions[v]) for v in sorted(found.permissions)],
                   req.query)


def permissions(req) -> list:
    return present([shapes.permission(u.name, v, u.permissions[v])
                    for u in _sorted_users(req) for v in sorted(u.permissions)], req.query)


def permission(req) -> dict:
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    if found is None or name not in req.broker.vhosts or name not in found.permissions:
        raise not_found()
    return shapes.permission(found.name, name, found.permissions[name])


def put_permission(req):
    body = req.body()
    missing = [key for key in ("configure", "write", "read") if key not in body]
    if missing:
        raise bad_request("[%s]" % ",".join("{key_missing,%s}" % key for key in missing))
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    if found is None or name not in req.broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    existed = name in found.permissions
    req.broker.set_permissions(found.name, name, Permission(str(body["configure"]), str(body["write"]),
                                                            str(body["read"])))
    return NO_CONTENT if existed else CREATED


def delete_permission(req):
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    if found is None or name not in found.permissions:
        raise not_found()
    req.broker.clear_permissions(found.name, name)
    return NO_CONTENT
