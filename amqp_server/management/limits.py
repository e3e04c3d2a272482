"""Handlers for vhost and user limits (RabbitMQ's /api/vhost-limits and
/api/user-limits routes).

A limit is set or cleared one name at a time (PUT {"value": N} / DELETE
.../{name}); listings show every limit of a vhost or user as one object.
Listing needs the management tag (vhost limits of the vhosts the user may
see; user limits of every user, as RabbitMQ shows them); changes need the
administrator tag. Validation is the domain's (`vhosts.users.check_limits`)
with RabbitMQ's HTTP wording around it.
"""
from __future__ import annotations

from vhosts.errors import erl_term
from vhosts.users import USER_LIMITS

from amqp_server.management import access
from amqp_server.management.errors import ApiError, bad_request, missing_keys, not_found
from amqp_server.management.http import NO_CONTENT
from amqp_server.management.listing import present


def vhost_limits(req) -> list:
    name = req.params.get("vhost")
    vhosts = access.visible_vhosts(req.user, req.broker) if name is None else [access.visible_vhost(req, name)]
    return present([{"vhost": v.name, "value": v.limits} for v in vhosts if v.limits], req.query)


def _value(req):
    body = req.body()
    missing_keys(body, ("value",))
    return body["value"]


def _limited_vhost(req):
    v = req.broker.vhosts.get(req.params["vhost"])
    if v is None:
        raise ApiError(404, "not_found", "vhost_not_found")
    return v


def put_vhost_limit(req):
    v = _limited_vhost(req)
    try:
        req.broker.set_vhost_limits(v.name, {**v.limits, req.params["name"]: _value(req)})
    except ValueError as exc:
        raise bad_request("Validation failed\n\n%s\n" % exc) from None
    return NO_CONTENT


def delete_vhost_limit(req):
    v = _limited_vhost(req)
    req.broker.set_vhost_limits(v.name, {k: value for k, value in v.limits.items() if k != req.params["name"]})
    return NO_CONTENT


def user_limits(req) -> list:
    name = req.params.get("user")
    if name is None:
        users = [req.broker.users[n] for n in sorted(req.broker.users)]
    elif name in req.broker.users:
        users = [req.broker.users[name]]
    else:
        raise not_found()
    return present([{"user": u.name, "value": u.limits} for u in users if u.limits], req.query)


def put_user_limit(req):
    name, limit = req.params["user"], req.params["name"]
    value = _value(req)
    if name not in req.broker.users:
        raise bad_request(["no_such_user", name])
    if limit not in USER_LIMITS:
        raise bad_request("Unrecognised terms [{%s,%s}] in user-limits" % (erl_term(limit), erl_term(value)))
    try:
        req.broker.set_user_limits(name, {limit: value})
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return NO_CONTENT


def delete_user_limit(req):
    if req.params["user"] not in req.broker.users:
        raise not_found()
    req.broker.clear_user_limits(req.params["user"], req.params["name"])
    return NO_CONTENT
