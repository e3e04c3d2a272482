"""Handlers for runtime parameters and global parameters (RabbitMQ's
/api/parameters and /api/global-parameters routes).

Runtime parameters need the policymaker tag (as RabbitMQ: they are policy-
like configuration of a vhost) and, for one vhost, a permission in it;
listings show the vhosts the user may see. Global parameters are for
administrators. A vhost's limits show as RabbitMQ shows them, a parameter
of component "vhost-limits" named "limits" (read here, set through
/api/vhost-limits). Values go through `vhosts.Broker.set_parameter`, which
validates them as RabbitMQ 3.10's plugins do; its error lines come back as
RabbitMQ's "Validation failed" 400, escaped for HTML as RabbitMQ does. The
user setting a shovel or federation upstream must be allowed to connect to
every vhost of this broker its URIs name (the links' `may_connect`), and is
kept as the parameter's owner: not shown by these routes (RabbitMQ 3.10
keeps no owner), exported with the definitions as
"user_who_performed_action" (RabbitMQ's import ignores the key).
"""
from __future__ import annotations

import html

from amqp_server.management import access
from amqp_server.management.errors import ApiError, bad_request, missing_keys, not_found
from amqp_server.management.http import CREATED, NO_CONTENT


def sorted_value(value: object) -> object:
    """A JSON value with its objects' keys in order, as RabbitMQ returns an
    Erlang map."""
    if isinstance(value, dict):
        return {key: sorted_value(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_value(item) for item in value]
    return value


def shape(vhost: str, component: str, name: str, value: object) -> dict:
    return {"value": sorted_value(value), "vhost": vhost, "component": component, "name": name}


OWNER = "user_who_performed_action"  # RabbitMQ's name for the acting user (in its events)


VHOST_LIMITS = "vhost-limits"


def vhost_parameters(broker, v, component: str | None = None, owners: bool = False) -> list[dict]:
    """The vhost's parameters (its limits first), of one component or all;
    with `owners` (definitions export), each with the user who set it."""
    out = []
    if v.limits and component in (None, VHOST_LIMITS):
        out.append(shape(v.name, VHOST_LIMITS, "limits", dict(v.limits)))
    for row in broker.list_parameters(v.name, component):
        item = shape(*row)
        owner = v.parameter_owners.get((row[1], row[2]))
        if owners and owner is not None:
            item[OWNER] = owner
        out.append(item)
    return out


def parameters(req) -> list:
    """/api/parameters, /api/parameters/{component} and .../{component}/{vhost}."""
    name = req.params.get("vhost")
    vhosts = access.visible_vhosts(req.user, req.broker) if name is None else [req.vhost(name)]
    return [item for v in vhosts for item in vhost_parameters(req.broker, v, req.params.get("component"))]


def parameter(req) -> dict:
    v = access.policy_vhost(req)
    key = (req.params["component"], req.params["name"])
    if v is not None and key == (VHOST_LIMITS, "limits") and v.limits:
        return shape(v.name, *key, dict(v.limits))
    if v is None or key not in v.parameters:
        raise not_found()
    return shape(v.name, *key, v.parameters[key])


def validation_failed(exc: ValueError, escape: bool = True) -> ApiError:
    """RabbitMQ's 400 for a refused parameter or policy."""
    reason = html.escape(str(exc), quote=False) if escape else str(exc)
    return bad_request("Validation failed\n\n%s\n" % reason)


def put_parameter(req):
    v = access.policy_vhost(req)
    if v is None:
        raise ApiError(404, "not_found", "vhost_not_found")
    body = req.body()
    missing_keys(body, ("value",))
    key = (req.params["component"], req.params["name"])
    existed = key in v.parameters
    try:
        req.broker.set_parameter(v.name, *key, body["value"], owner=req.user.name,
                                 may_connect=req.node.links.may_connect(req.user.name))
    except ValueError as exc:
        raise validation_failed(exc) from None
    return NO_CONTENT if existed else CREATED


def delete_parameter(req):
    v = access.policy_vhost(req)
    key = (req.params["component"], req.params["name"])
    if v is None or key not in v.parameters:
        raise not_found()
    req.broker.clear_parameter(v.name, *key)
    return NO_CONTENT


# -- global parameters ----------------------------------------------------------


def global_parameters(req) -> list:
    return [{"name": name, "value": sorted_value(value)}
            for name, value in sorted(req.broker.global_parameters.items())]


def global_parameter(req) -> dict:
    name = req.params["name"]
    if name not in req.broker.global_parameters:
        raise not_found()
    return {"value": sorted_value(req.broker.global_parameters[name]), "name": name}


def put_global_parameter(req):
    body = req.body()
    missing_keys(body, ("value",))
    name = req.params["name"]
    existed = name in req.broker.global_parameters
    req.broker.set_global_parameter(name, body["value"])
    return NO_CONTENT if existed else CREATED


def delete_global_parameter(req):
    name = req.params["name"]
    if name not in req.broker.global_parameters:
        raise not_found()
    req.broker.clear_global_parameter(name)
    return NO_CONTENT
