"""Handlers for exchanges, queues and bindings (RabbitMQ's /api/exchanges,
/api/queues, /api/bindings routes).

Changes go through the same domain calls AMQP methods use
(`vhosts.VirtualHost`), so durability, auto-delete cascades and errors are
the same; an `AMQPError` becomes RabbitMQ's HTTP answer
(`errors.amqp_errors_as_http`). The management API acts as no connection:
exclusive queues of connections are locked to it, as in RabbitMQ.
"""
from __future__ import annotations

from urllib.parse import unquote

from routing import Destination

from amqp_server.management import access, shapes, shards
from amqp_server.management.errors import ApiError, amqp_errors_as_http, bad_request, not_found
from amqp_server.management.http import CREATED, NO_CONTENT, Created
from amqp_server.management.listing import present

# How the API names the default exchange in paths.
DEFAULT_EXCHANGE_ALIAS = "amq.default"

def _flag(query: dict, name: str) -> bool:
    return query.get(name, "").lower() == "true"


def _in_vhosts(req, vhost_name: str | None) -> list:
    """The vhosts a listing covers: one (checked) or every visible one."""
    if vhost_name is None:
        return access.visible_vhosts(req.user, req.broker)
    return [req.vhost(vhost_name)]


# -- exchanges --------------------------------------------------------------------


def exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


def _exchange_list(vhosts) -> list[tuple]:
    """(vhost, name) of every exchange, the default one first in each vhost."""
    return [(v, name) for v in vhosts for name in [""] + sorted(v.exchanges)]


def _exchange_json(req, reading, v, name: str, found) -> dict:
    """`found`: the other shards' reports, whose counters of the exchange add up."""
    if name == "":
        out = shapes.default_exchange(reading, v, req.user.name)
    else:
        out = shapes.exchange(reading, v.exchanges[name], v.name, req.user.name, v.policy_for("exchange", name))
    for stats in shards.exchange_stats(found, v.name, name):
        out["message_stats"] = dict(sorted(shards.add_figures(out.get("message_stats", {}), stats).items()))
    return out


async def exchanges(req) -> list:
    reading = shapes.reading_of(req)
    vhosts = _in_vhosts(req, req.params.get("vhost"))
    found = await shards.gathered(req.node, ("exchanges",), reading)
    return present(_exchange_list(vhosts), req.query,
                   lambda item: _exchange_json(req, reading, *item, found), lambda item: item[1])


async def exchange(req) -> dict:
    v = req.vhost(req.params["vhost"])
    name = exchange_name(req.params["name"])
    if name != "" and name not in v.exchanges:
        raise not_found()
    reading = shapes.reading_of(req)
    out = _exchange_json(req, reading, v, name, await shards.gathered(req.node, ("exchanges",), reading))
    # RabbitMQ lists the channels publishing to it and the queues it routes to
    # only with fine-grained statistics (rates_mode detailed, not its default)
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


def _declare(req, kind: str, declare) -> object:
    """PUT of an exchange or queue: `declare(vhost, name, body, access)`
    (configure permission, as the declare method); 201 when it is new, 204
    when it existed (and was equivalent)."""
    v = _writable_vhost(req)
    body = req.body()
    name = req.params["name"]
    existed = name in (v.exchanges if kind == "exchange" else v.queues)
    with amqp_errors_as_http():
        declare(v, name, body, req.access(v))
    return NO_CONTENT if existed else CREATED


def put_exchange(req):
    return _declare(req, "exchange", lambda v, name, body, checks: v.declare_exchange(
        name, body.get("type", "direct"), durable=_bool(body, "durable", True),
        auto_delete=_bool(body, "auto_delete", False), internal=_bool(body, "internal", False),
        arguments=arguments_of(body), access=checks))


def delete_exchange(req):
    v = req.vhost(req.params["vhost"])
    name = exchange_name(req.params["name"])
    if name not in v.exchanges:
        raise not_found()
    with amqp_errors_as_http():
        v.delete_exchange(name, if_unused=_flag(req.query, "if-unused"), access=req.access(v))
    return NO_CONTENT


# -- queues -----------------------------------------------------------------------


QUEUE_PARTS = ("queues", "counted")


async def queues(req) -> list:
    """Every queue of the node: one another shard owns shows that shard's
    figures (amqp_server.management.shards)."""
    vhosts = _in_vhosts(req, req.params.get("vhost"))
    reading = shapes.reading_of(req)
    node_queues = shards.NodeQueues(req.node, reading, await shards.gathered(req.node, QUEUE_PARTS, reading))
    return present([(v, v.queues[n]) for v in vhosts for n in sorted(v.queues)], req.query,
                   lambda pair: node_queues.row(*pair), lambda pair: pair[1].name)


def find_queue(req):
    v = req.vhost(req.params["vhost"])
    q = v.queues.get(req.params["name"])
    if q is None:
        raise not_found()
    return v, q


async def queue(req) -> dict:
    """One queue; one of another shard with its owner's figures (and the
    samples of the ranges asked for)."""
    v, q = find_queue(req)
    reading = shapes.reading_of(req)
    found = await shards.gathered(req.node, ("counted", "consumers"))
    node_queues = shards.NodeQueues(req.node, reading, found)
    if getattr(q, "remote", False) and not node_queues.is_down(q):
        fresh = await shards.fresh_figures(req.node, q, reading)
        if fresh is not None:
            node_queues.fresh[(q.vhost, q.name)] = fresh
        else:  # the owner did not answer: as it last reported
            node_queues.figures.update(dict(shards.reports(req.node)).get(q.shard, {}).get("queues", {}))
    out = node_queues.row(v, q)
    out["consumer_details"] = shards.consumer_rows(req.node, found, q)
    out["deliveries"] = []
    out["incoming"] = []
    return out


def put_queue(req):
    size = len(req.params["name"].encode("utf-8"))
    if size > 255:  # a queue must be nameable in AMQP's short strings
        raise bad_request("queue should be less than 255 bytes, actually was %d\n" % size)
    return _declare(req, "queue", lambda v, name, body, checks: v.declare_queue(
        name, None, durable=_bool(body, "durable", True), auto_delete=_bool(body, "auto_delete", False),
        arguments=arguments_of(body), access=checks))


def delete_queue(req):
    v, q = find_queue(req)
    with amqp_errors_as_http():
        v.delete_queue(q.name, None, if_unused=_flag(req.query, "if-unused"), if_empty=_flag(req.query, "if-empty"),
                       access=req.access(v))
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
    name = exchange_name(req.params["name"])
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


def _ends(req, existing: bool = True):
    """(vhost, source, destination) a binding route names; with `existing`
    both ends must exist (404 otherwise)."""
    v = req.vhost(req.params["vhost"])
    kind = DEST_KINDS.get(req.params["kind"])
    if kind is None:
        raise not_found()
    source = exchange_name(req.params["source"])
    dest = req.params["destination"]
    if existing and (source not in v.exchanges and source != ""
                     or dest not in (v.queues if kind == "queue" else v.exchanges)):
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
    """A missing end is the domain's 404, as RabbitMQ reports it."""
    v, source, dest = _ends(req, existing=False)
    body = req.body()
    key = body.get("routing_key", "")
    if not isinstance(key, str):
        raise bad_request("routing_key must be a string")
    arguments = arguments_of(body)
    with amqp_errors_as_http():
        if dest.kind == "queue":
            v.bind_queue(dest.name, source, key, arguments, None, access=req.access(v))
        else:
            v.bind_exchange(dest.name, source, key, arguments, access=req.access(v))
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
    v = req.vhost(req.params["vhost"])
    with amqp_errors_as_http():
        if found["destination_type"] == "queue":
            v.unbind_queue(found["destination"], found["source"], found["routing_key"], found["arguments"], None,
                           access=req.access(v))
        else:
            v.unbind_exchange(found["destination"], found["source"], found["routing_key"], found["arguments"],
                              access=req.access(v))
    return NO_CONTENT
