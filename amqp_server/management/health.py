"""Health checks (RabbitMQ's /api/health/checks/...): 200 {"status": "ok"}
when healthy, 503 {"status": "failed", ...} otherwise. hutch raises no
resource alarms (memory pressure pages messages to disk instead), runs as a
single node and has no mirrored or quorum queues, so those checks pass."""
from __future__ import annotations

from amqp_server.management.errors import bad_request
from amqp_server.management.http import json_response


def ok(req) -> dict:
    return {"status": "ok"}


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
