"""Handlers for the broker's objects: overview, nodes, vhosts, users,
permissions, exchanges, queues and bindings (RabbitMQ's /api/... routes).

Changes go through the same domain calls AMQP methods use (`vhosts.Broker`,
`vhosts.VirtualHost`), so durability, auto-delete cascades and errors are
the same; an `AMQPError` becomes RabbitMQ's HTTP answer (`errors.from_amqp`).
"""
from __future__ import annotations

import os
from urllib.parse import unquote

from routing import EXCHANGE_TYPES, Destination
from vhosts.errors import CONNECTION_FORCED, AMQPError
from vhosts.users import Permission, hash_password

from amqp_server.management import access, shapes
from amqp_server.management.errors import ApiError, bad_request, from_amqp, not_found
from amqp_server.management.http import CREATED, NO_CONTENT, Created
from amqp_server.management.listing import present
from amqp_server.management.node import COMPATIBLE_VERSION

EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
}
DEFAULT_EXCHANGE_ALIAS = "amq.default"


def exchange_types() -> list[dict]:
    return [{"name": name, "description": EXCHANGE_TYPE_DESCRIPTIONS.get(name, ""), "enabled": True}
            for name in sorted(EXCHANGE_TYPES)]


def _flag(query: dict, name: str) -> bool:
    return query.get(name, "").lower() == "true"


def _visible_connections(req) -> list:
    return [c for c in list(req.node.connections) if c.vhost is not None and access.owns(req.user, c)]


def _in_vhosts(req, vhost_name: str | None) -> list:
    """The vhosts a listing covers: one (checked) or every visible one."""
    if vhost_name is None:
        return access.visible_vhosts(req.user, req.broker)
    return [req.vhost(vhost_name)]


# -- overview, nodes, whoami ------------------------------------------------------


def overview(req) -> dict:
    node, sampler = req.node, req.node.sampler
    vhosts = access.visible_vhosts(req.user, req.broker)
    connections = _visible_connections(req)
    unacked = shapes.unacked_by_queue(req.node.connections)
    queues = [q for v in vhosts for q in v.queues.values()]
    ready = sum(q.message_count for q in queues)
    held = sum(unacked[q] for q in queues)
    totals = dict.fromkeys(shapes.VHOST_STATS, 0)
    for v in vhosts:
        for key, value in v.stats.totals().items():
            if key in totals:
                totals[key] += value
    rates = {key: sum(sampler.rate(v.stats, key) for v in vhosts) for key in shapes.VHOST_STATS}
    message_stats = {}
    for key in shapes.VHOST_STATS:
        message_stats[key] = totals[key]
        message_stats[key + "_details"] = {"rate": round(rates[key], 1)}
    ready_rate = round(sum(sampler.rate(v, "messages_ready") for v in vhosts), 1)
    return {
        "management_version": COMPATIBLE_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]},
        "exchange_types": exchange_types(),
        "product_version": COMPATIBLE_VERSION,
        "product_name": "hutch",
        "rabbitmq_version": COMPATIBLE_VERSION,
        "cluster_name": shapes.NODE,
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": message_stats,
        "queue_totals": {
            "messages": ready + held, "messages_details": {"rate": ready_rate},
            "messages_ready": ready, "messages_ready_details": {"rate": ready_rate},
            "messages_unacknowledged": held, "messages_unacknowledged_details": {"rate": 0.0},
        },
        "object_totals": {
            "channels": sum(len(c.channels) for c in connections),
            "connections": len(connections),
            "consumers": sum(len(q.consumers) for q in queues),
            "exchanges": sum(len(v.exchanges) + 1 for v in vhosts),
            "queues": len(queues),
        },
        "statistics_db_event_queue": 0,
        "node": shapes.NODE,
        "listeners": [
            {"node": shapes.NODE, "protocol": protocol, "ip_address": address, "port": port, "socket_opts": {}}
            for protocol, address, port in node.listeners
        ],
        "contexts": [
            {"node": shapes.NODE, "description": "RabbitMQ Management", "path": "/", "port": str(port)}
            for protocol, _address, port in node.listeners if protocol == "http"
        ],
    }


def node_info(req) -> dict:
    node = req.node
    limit = int(node.monitor.budget / max(node.config.storage.paging_ratio, 1e-9))
    return {
        "name": shapes.NODE,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_used": node.rss_bytes(),
        "mem_limit": limit,
        "mem_alarm": False,
        "disk_free_alarm": False,
        "partitions": [],
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "uptime": node.uptime_ms,
        "run_queue": 0,
        "exchange_types": exchange_types(),
        "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": True},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True},
        ],
        "db_dir": node.config.data_dir,
        "net_ticktime": 60,
        "mem_calculation_strategy": "rss",
    }


def nodes(req) -> list:
    return present([node_info(req)], req.query)


def node(req) -> dict:
    if req.params["node"] != shapes.NODE:
        raise not_found()
    return node_info(req)


def whoami(req) -> dict:
    return {"name": req.user.name, "tags": list(req.user.tags)}


def cluster_name(req) -> dict:
    return {"name": shapes.NODE}


def extensions(req) -> list:
    return []


# -- vhosts -------------------------------------------------------------------


def vhosts(req) -> list:
    unacked = shapes.unacked_by_queue(req.node.connections)
    return present([shapes.vhost(req.node.sampler, v, unacked) for v in access.visible_vhosts(req.user, req.broker)],
                   req.query)


def vhost(req) -> dict:
    found = req.vhost(req.params["vhost"])
    return shapes.vhost(req.node.sampler, found, shapes.unacked_by_queue(req.node.connections))


def put_vhost(req):
    req.body()
    name = req.params["vhost"]
    if name in req.broker.vhosts:
        return NO_CONTENT
    req.broker.add_vhost(name)
    return CREATED


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
        raise bad_request("password_hash must be a string")
    return value


def delete_user(req):
    _user(req)
    req.broker.delete_user(req.params["user"])
    return NO_CONTENT


def bulk_delete_users(req):
    names = req.body().get("users")
    if not isinstance(names, list):
        raise bad_request("[{key_missing,users}]")
    for name in names:
        if isinstance(name, str):
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


# -- exchanges --------------------------------------------------------------------


def _exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


def _exchange_list(req, vhosts) -> list[dict]:
    out = []
    for v in vhosts:
        out.append(shapes.default_exchange(v.name, req.user.name))
        out += [shapes.exchange(v.exchanges[n], v.name, req.user.name) for n in sorted(v.exchanges)]
    return out


def exchanges(req) -> list:
    return present(_exchange_list(req, _in_vhosts(req, req.params.get("vhost"))), req.query)


def exchange(req) -> dict:
    v = req.vhost(req.params["vhost"])
    name = _exchange_name(req.params["name"])
    if name == "":
        return shapes.default_exchange(v.name, req.user.name)
    x = v.exchanges.get(name)
    if x is None:
        raise not_found()
    out = shapes.exchange(x, v.name, req.user.name)
    out["incoming"] = []
    out["outgoing"] = []
    return out


def _writable_vhost(req):
    """PUT into a vhost: RabbitMQ's 404 names a missing vhost."""
    name = req.params["vhost"]
    if name not in req.broker.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    return req.vhost(name)


def arguments_of(body: dict) -> dict:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be an object")
    return arguments


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise bad_request("%s must be a boolean" % key)
    return value


def put_exchange(req):
    v = _writable_vhost(req)
    body = req.body()
    name = req.params["name"]
    existed = name in v.exchanges
    try:
        v.declare_exchange(name, body.get("type", "direct"), durable=_bool(body, "durable", True),
                           auto_delete=_bool(body, "auto_delete", False), internal=_bool(body, "internal", False),
                           arguments=arguments_of(body))
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return NO_CONTENT if existed else CREATED


def delete_exchange(req):
    v = req.vhost(req.params["vhost"])
    name = _exchange_name(req.params["name"])
    if name not in v.exchanges:
        raise not_found()
    try:
        v.delete_exchange(name, if_unused=_flag(req.query, "if-unused"))
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return NO_CONTENT


# -- queues -----------------------------------------------------------------------


def _queue_list(req, vhosts) -> list[dict]:
    connections = req.node.connections
    unacked = shapes.unacked_by_queue(connections)
    consumers = shapes.consumers_by_queue(connections)
    return [shapes.queue(req.node.sampler, v.queues[n], unacked[v.queues[n]], consumers.get(v.queues[n], []))
            for v in vhosts for n in sorted(v.queues)]


def queues(req) -> list:
    return present(_queue_list(req, _in_vhosts(req, req.params.get("vhost"))), req.query)


def find_queue(req):
    v = req.vhost(req.params["vhost"])
    q = v.queues.get(req.params["name"])
    if q is None:
        raise not_found()
    return v, q


def queue(req) -> dict:
    _v, q = find_queue(req)
    connections = req.node.connections
    consumers = shapes.consumers_by_queue(connections).get(q, [])
    out = shapes.queue(req.node.sampler, q, shapes.unacked_by_queue(connections)[q], consumers)
    out["consumer_details"] = [shapes.consumer(ch, c) for ch, c in consumers]
    out["deliveries"] = []
    out["incoming"] = []
    return out


def put_queue(req):
    v = _writable_vhost(req)
    body = req.body()
    name = req.params["name"]
    existed = name in v.queues
    try:
        v.declare_queue(name, None, durable=_bool(body, "durable", True),
                        auto_delete=_bool(body, "auto_delete", False), arguments=arguments_of(body))
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return NO_CONTENT if existed else CREATED


def delete_queue(req):
    v, q = find_queue(req)
    try:
        v.delete_queue(q.name, None, if_unused=_flag(req.query, "if-unused"), if_empty=_flag(req.query, "if-empty"))
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return NO_CONTENT


# -- bindings ---------------------------------------------------------------------


def _default_bindings(v, queue_names) -> list[dict]:
    return [shapes.binding(v.name, "", "queue", name, name, {}) for name in queue_names]


def _explicit_bindings(v) -> list[dict]:
    out = [shapes.binding(v.name, source, dest.kind, dest.name, key, args)
           for source, dest, key, args in v.bindings()]
    out.sort(key=lambda b: (b["source"], b["destination_type"], b["destination"], b["routing_key"]))
    return out


def bindings(req) -> list:
    out = []
    for v in _in_vhosts(req, req.params.get("vhost")):
        out += _default_bindings(v, sorted(v.queues)) + _explicit_bindings(v)
    return present(out, req.query)


def queue_bindings(req) -> list:
    v, q = find_queue(req)
    out = _default_bindings(v, [q.name])
    out += [b for b in _explicit_bindings(v) if b["destination_type"] == "queue" and b["destination"] == q.name]
    return present(out, req.query)


def exchange_bindings(req, side: str) -> list:
    v = req.vhost(req.params["vhost"])
    name = _exchange_name(req.params["name"])
    if name not in v.exchanges:
        raise not_found()
    if side == "source":
        out = [b for b in _explicit_bindings(v) if b["source"] == name]
    else:
        out = [b for b in _explicit_bindings(v) if b["destination_type"] == "exchange" and b["destination"] == name]
    return present(out, req.query)


def exchange_source_bindings(req) -> list:
    return exchange_bindings(req, "source")


def exchange_destination_bindings(req) -> list:
    return exchange_bindings(req, "destination")


DEST_KINDS = {"q": "queue", "e": "exchange"}


def _ends(req):
    v = req.vhost(req.params["vhost"])
    kind = DEST_KINDS.get(req.params["kind"])
    if kind is None:
        raise not_found()
    source = _exchange_name(req.params["source"])
    dest = req.params["destination"]
    if source not in v.exchanges and source != "":
        raise not_found()
    if (v.queues if kind == "queue" else v.exchanges).get(dest) is None:
        raise not_found()
    return v, source, Destination(kind, dest)


def _between(v, source: str, dest: Destination) -> list[dict]:
    if source == "":
        return _default_bindings(v, [dest.name]) if dest.kind == "queue" else []
    return [b for b in _explicit_bindings(v)
            if b["source"] == source and b["destination_type"] == dest.kind and b["destination"] == dest.name]


def bindings_between(req) -> list:
    v, source, dest = _ends(req)
    return present(_between(v, source, dest), req.query)


def add_binding(req):
    v, source, dest = _ends(req)
    body = req.body()
    key = body.get("routing_key", "")
    if not isinstance(key, str):
        raise bad_request("routing_key must be a string")
    arguments = arguments_of(body)
    try:
        if dest.kind == "queue":
            v.bind_queue(dest.name, source, key, arguments, None)
        else:
            v.bind_exchange(dest.name, source, key, arguments)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return Created(shapes.properties_key(key, arguments))


def _binding(req) -> dict:
    v, source, dest = _ends(req)
    # The key as listed, percent-encoded once more in the URL (RabbitMQ's
    # UI and rabbitmqadmin), or as listed (so decoded once too many).
    wanted = req.params["props"]
    for found in _between(v, source, dest):
        if wanted in (found["properties_key"], unquote(found["properties_key"])):
            return found
    raise not_found()


def binding(req) -> dict:
    return _binding(req)


def delete_binding(req):
    found = _binding(req)
    if found["source"] == "":
        raise from_amqp(AMQPError(403, "operation not permitted on the default exchange"))
    v = req.vhost(req.params["vhost"])
    try:
        v.unbind(found["source"], Destination(found["destination_type"], found["destination"]),
                 found["routing_key"], found["arguments"])
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return NO_CONTENT
