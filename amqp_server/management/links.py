"""Handlers for the shovel and federation status routes (RabbitMQ's
rabbitmq_shovel_management and rabbitmq_federation_management plugins).

Listings show the links of the vhosts the user may see. Deleting a shovel
clears its parameter, as RabbitMQ 3.10 does for a dynamic shovel;
restarting one ends its current session and starts a new one.
"""
from __future__ import annotations

from vhosts.parameters import SHOVEL

from amqp_server.management import access
from amqp_server.management.errors import not_found
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.listing import present


def _visible(req) -> set:
    name = req.params.get("vhost")
    if name is not None:
        return {access.visible_vhost(req, name).name}
    return {v.name for v in access.visible_vhosts(req.user, req.broker)}


def shovels(req) -> list:
    visible = _visible(req)
    return present([s for s in req.node.links.shovel_status() if s["vhost"] in visible], req.query)


def shovel(req) -> list:
    """/api/shovels/vhost/{vhost}/{name}: RabbitMQ answers a list of one."""
    found = [s for s in req.node.links.shovel_status(access.visible_vhost(req, req.params["vhost"]).name)
             if s["name"] == req.params["name"]]
    if not found:
        raise not_found()
    return found


def delete_shovel(req):
    v = req.vhost(req.params["vhost"])
    if (SHOVEL, req.params["name"]) not in v.parameters:
        raise not_found()
    req.broker.clear_parameter(v.name, SHOVEL, req.params["name"])
    return NO_CONTENT


def restart_shovel(req):
    v = req.vhost(req.params["vhost"])
    if not req.node.links.restart_shovel(v.name, req.params["name"]):
        raise not_found()
    return NO_CONTENT


def federation_links(req) -> list:
    visible = _visible(req)
    return present([link for link in req.node.links.federation_status() if link["vhost"] in visible], req.query)
