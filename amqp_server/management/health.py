"""Health checks (RabbitMQ's /api/health/checks/...): 200 {"status": "ok"}
when healthy, 503 {"status": "failed", ...} otherwise. The alarm checks
report the memory and disk alarms (amqp_server.shared.alarms); hutch runs as a
single node and has no mirrored or quorum queues, so those checks pass."""
from __future__ import annotations

from amqp_server.management import shapes
from amqp_server.management.errors import bad_request
from amqp_server.management.http import json_response


def ok(req) -> dict:
    return {"status": "ok"}


def alarms(req):
    return _alarms(req, "There are alarms in effect in the cluster")


def local_alarms(req):
    return _alarms(req, "There are alarms in effect on the node")


def _alarms(req, reason: str):
    raised = sorted(req.node.alarms.raised)
    if not raised:
        return {"status": "ok"}
    return json_response(503, {"status": "failed", "reason": reason,
                               "alarms": [{"node": shapes.NODE, "resource": name} for name in raised]})


def single_node(req) -> dict:
    return {"status": "ok", "reason": "single node cluster"}


def port_listener(req):
    try:
        port = int(req.params["port"])
    except ValueError:
        raise bad_request("invalid port %s" % req.params["port"]) from None
    ports = sorted({bound for _protocol, _address, bound in req.node.listeners})
    if port in ports:
        return {"status": "ok", "port": port}
    return json_response(503, {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports})


def protocol_listener(req):
    protocol = req.params["protocol"]
    protocols = sorted({name for name, _address, _port in req.node.listeners})
    if protocol in protocols:
        return {"status": "ok", "protocol": protocol}
    return json_response(503, {"status": "failed", "reason": "No active listener", "missing": protocol,
                               "protocols": protocols})
