"""Handlers for topic permissions (RabbitMQ's /api/topic-permissions
routes and the per-user and per-vhost listings; administrators only).

A user has at most one topic permission per (vhost, exchange); PUT sets one
exchange's, DELETE clears all of the user's in the vhost, as RabbitMQ's
API does. Changes go through `vhosts.Broker`, which stores them.
"""
from __future__ import annotations

import re

from amqp_server.management.errors import bad_request, missing_keys, not_found
from amqp_server.management.http import CREATED, NO_CONTENT
from amqp_server.management.listing import present


def shape(user_name: str, vhost_name: str, rule) -> dict:
    return {"user": user_name, "vhost": vhost_name, "exchange": rule.exchange, "write": rule.write,
            "read": rule.read}


def _rows(users, vhost_name: str | None = None) -> list[dict]:
    return [shape(u.name, vhost, rule) for u in users
            for (vhost, _x), rule in sorted(u.topic_permissions.items()) if vhost_name in (None, vhost)]


def _sorted_users(req) -> list:
    return [req.broker.users[name] for name in sorted(req.broker.users)]


def topic_permissions(req) -> list:
    return present(_rows(_sorted_users(req)), req.query)


def vhost_topic_permissions(req) -> list:
    name = req.params["vhost"]
    req.vhost(name)
    return present(_rows(_sorted_users(req), name), req.query)


def user_topic_permissions(req) -> list:
    found = req.broker.users.get(req.params["user"])
    if found is None:
        raise not_found()
    return present(_rows([found]), req.query)


def topic_permission(req) -> list:
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    rows = _rows([found], name) if found is not None and name in req.broker.vhosts else []
    if not rows:
        raise not_found()
    return present(rows, req.query)


def _pattern(value) -> str:
    """A regular expression, refused with RabbitMQ's Erlang-shaped reason."""
    if not isinstance(value, str):
        raise bad_request(["not_string", value])
    try:
        re.compile(value)
    except re.error as exc:
        raise bad_request(["invalid_regexp", value, [str(exc), exc.pos or 0]]) from None
    return value


def put_topic_permission(req):
    body = req.body()
    missing_keys(body, ("exchange", "write", "read"))
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    if found is None or name not in req.broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    exchange = body["exchange"]
    if not isinstance(exchange, str):
        raise bad_request(["not_string", exchange])
    write, read = _pattern(body["write"]), _pattern(body["read"])
    existed = (name, exchange) in found.topic_permissions
    req.broker.set_topic_permissions(found.name, name, exchange, write, read)
    return NO_CONTENT if existed else CREATED


def delete_topic_permission(req):
    found = req.broker.users.get(req.params["user"])
    name = req.params["vhost"]
    if found is None or not any(vhost == name for vhost, _x in found.topic_permissions):
        raise not_found()
    req.broker.clear_topic_permissions(found.name, name)
    return NO_CONTENT
