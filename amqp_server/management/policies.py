"""Handlers for policies and operator policies (RabbitMQ's /api/policies and
/api/operator-policies routes).

Listing needs only the management tag and shows the policies of the vhosts
the user may see; reading, setting or clearing one policy needs the
administrator tag, or the policymaker tag and a permission in its vhost,
refused with RabbitMQ's "User not authorised to access object". Changes go through
`vhosts.Broker.set_policy` / `clear_policy`, which store them and apply
them at once to existing queues and exchanges. Operator policies are for
administrators only (the route's tag); RabbitMQ does not escape their
validation errors for HTML, so neither do we.
"""
from __future__ import annotations

from amqp_server.management import access
from amqp_server.management.errors import ApiError, bad_request, missing_keys, not_found
from amqp_server.management.http import CREATED, NO_CONTENT
from amqp_server.management.listing import present
from amqp_server.management.parameters import validation_failed


def shape(policy) -> dict:
    return {"vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern, "apply-to": policy.apply_to,
            "definition": policy.definition, "priority": policy.priority}


def _table(req, v) -> dict:
    """The vhost's policies, or its operator policies on an operator route."""
    return v.operator_policies if req.params.get("operator") else v.policies


def policies(req) -> list:
    name = req.params.get("vhost")
    vhosts = access.visible_vhosts(req.user, req.broker) if name is None else [req.vhost(name)]
    return present([shape(_table(req, v)[p]) for v in vhosts for p in sorted(_table(req, v))], req.query)


def operator(handler):
    """The handler on an /api/operator-policies route."""
    def on_operator_policies(req):
        req.params["operator"] = True
        return handler(req)
    return on_operator_policies


def policy(req) -> dict:
    v = access.policy_vhost(req)
    found = _table(req, v).get(req.params["name"]) if v is not None else None
    if found is None:
        raise not_found()
    return shape(found)


def _priority(body: dict) -> int:
    """RabbitMQ takes the priority as a number or a numeric string."""
    value = body.get("priority", 0)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def put_policy(req):
    v = access.policy_vhost(req)
    if v is None:
        raise ApiError(404, "not_found", "vhost_not_found")
    body = req.body()
    missing_keys(body, ("pattern", "definition"))
    name = req.params["name"]
    is_operator = bool(req.params.get("operator"))
    existed = name in _table(req, v)
    if not isinstance(body["pattern"], str):
        raise bad_request("Validation failed\n\npattern should be a string\n")
    try:
        req.broker.set_policy(v.name, name, body["pattern"], body["definition"], _priority(body),
                              body.get("apply-to", "all"), operator=is_operator)
    except ValueError as exc:
        raise validation_failed(exc, escape=not is_operator) from None
    return NO_CONTENT if existed else CREATED


def delete_policy(req):
    v = access.policy_vhost(req)
    if v is None or req.params["name"] not in _table(req, v):
        raise not_found()
    req.broker.clear_policy(v.name, req.params["name"], operator=bool(req.params.get("operator")))
    return NO_CONTENT
