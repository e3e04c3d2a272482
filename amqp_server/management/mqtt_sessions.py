"""hutch's MQTT sessions in the management API (docs/mqtt.md, Administration):

    GET    /api/hutch/mqtt/sessions
    GET    /api/hutch/mqtt/sessions/{vhost}
    GET    /api/hutch/mqtt/sessions/{vhost}/{client_id}
    DELETE /api/hutch/mqtt/sessions/{vhost}/{client_id}

A session is a connected MQTT client id, or a persistent session whose
client is away while the node keeps its durable subscription queues or QoS 2
state (`Sessions.in_vhost`). Seeing sessions follows vhost visibility, as
queues do: management users see the vhosts they have a permission in,
monitoring users all. Ending one (DELETE) needs a permission in the vhost,
configure on its queues (deleting them, as queue.delete checks it) and, when
it is connected, to own its connection or be an administrator (as closing a
connection does).
"""
from __future__ import annotations

from amqp_server.management import access, shards
from amqp_server.management.errors import amqp_errors_as_http, not_authorised, not_found
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.listing import present
from amqp_server.management.rates import Reading


def _shape(vhost, session, filters: dict, node_queues) -> dict:
    """`node_queues`: the node's queues' figures (amqp_server.management.shards:
    on a node of several shards a session's queue may be on another one)."""
    connection = session.connection
    queues, subscriptions = [], []
    for q in session.queues:
        qos = int(q.name[-1])
        figures = node_queues.figures_of(q)  # a queue that is down has none: counted as 0
        ready, held = figures.get("messages_ready", 0), figures.get("messages_unacknowledged", 0)
        queues.append({"name": q.name, "qos": qos, "durable": q.durable, "consumers": figures.get("consumers", 0),
                       "messages": ready + held, "messages_ready": ready, "messages_unacknowledged": held})
        subscriptions += [{"topic_filter": f, "qos": qos} for f in sorted(filters.get(q.name, ()))]
    qos2 = session.qos2
    return {
        "vhost": vhost.name,
        "client_id": session.client_id,
        "connected": connection is not None,
        "clean_session": session.clean,
        "connection": connection.name if connection is not None else None,
        "user": connection.user.name if connection is not None else None,
        "protocol": connection.protocol if connection is not None else None,
        "subscriptions": subscriptions,
        "queues": queues,
        "messages": sum(q["messages"] for q in queues),
        "messages_ready": sum(q["messages_ready"] for q in queues),
        "messages_unacknowledged": sum(q["messages_unacknowledged"] for q in queues),
        "qos2": {"received": len(qos2.received) if qos2 else 0, "sent": len(qos2.sent) if qos2 else 0,
                 "released": len(qos2.released) if qos2 else 0},
    }


async def _node_queues(req):
    return shards.NodeQueues(req.node, Reading(req.node.sampler, {}), await shards.gathered(req.node, ("queues",)))


def _in(req, vhost, node_queues) -> list[dict]:
    filters = req.node.mqtt_sessions.topic_filters(vhost, req.node.config.mqtt.exchange)
    return [_shape(vhost, session, filters, node_queues) for session in req.node.mqtt_sessions.in_vhost(vhost)]


async def sessions(req) -> list:
    name = req.params.get("vhost")
    vhosts = [req.vhost(name)] if name is not None else access.visible_vhosts(req.user, req.broker)
    node_queues = await _node_queues(req)
    return present([row for vhost in vhosts for row in _in(req, vhost, node_queues)], req.query)


def _find(req):
    vhost = req.vhost(req.params["vhost"])
    client_id = req.params["client_id"]
    for session in req.node.mqtt_sessions.in_vhost(vhost):
        if session.client_id == client_id:
            return vhost, session
    raise not_found()


async def session(req) -> dict:
    vhost, found = _find(req)
    return _shape(vhost, found, req.node.mqtt_sessions.topic_filters(vhost, req.node.config.mqtt.exchange),
                  await _node_queues(req))


def end_session(req):
    vhost, found = _find(req)
    connection = found.connection
    if connection is not None and not (access.has(req.user, access.ADMINISTRATOR)
                                       or connection.user.name == req.user.name):
        raise not_authorised("Not administrator user")
    checks = req.access(vhost)
    with amqp_errors_as_http():
        for q in found.queues:
            checks.check("queue", q.name, "configure")
    req.node.mqtt_sessions.end(vhost, found)
    return NO_CONTENT
