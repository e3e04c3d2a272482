"""RabbitMQ's checks of a published message's properties, whichever face
it arrives through (an AMQP channel, the management API's publish)."""
from __future__ import annotations

import re

from vhosts.errors import PRECONDITION_FAILED, AMQPError

_INTEGER_PREFIX = re.compile(r"[+-]?[0-9]+")
MAX_EXPIRATION = 315360000000  # ten years in ms, RabbitMQ's limit


def check_properties(props, user) -> None:
    """RabbitMQ's publish checks of user_id and expiration (in that order),
    for a message published by `user` (over AMQP or the management API)."""
    if props.user_id is not None and props.user_id != user.name and "impersonator" not in user.tags:
        raise AMQPError(
            PRECONDITION_FAILED,
            "user_id property set to '%s' but authenticated user was '%s'" % (props.user_id, user.name),
        )
    if props.expiration is not None:
        problem = _expiration_problem(props.expiration)
        if problem:
            raise AMQPError(PRECONDITION_FAILED, "invalid expiration '%s': %s" % (props.expiration, problem))


def _expiration_problem(text: str) -> str | None:
    """Why RabbitMQ refuses an expiration (Erlang's string:to_integer, then
    rabbit_misc:check_expiry), in its own words; None when it is valid."""
    match = _INTEGER_PREFIX.match(text)
    if match is None:
        return "no_integer"
    rest = text[match.end():]
    if rest:
        return "{leftover_string,%s}" % _erlang_string(rest)
    value = int(match.group())
    if value < 0:
        return "{value_negative,%d}" % value
    if value > MAX_EXPIRATION:
        return "{value_too_large,%d}" % value
    return None


def _erlang_string(text: str) -> str:
    """A string as Erlang's ~p prints it: quoted when printable, else a list of bytes."""
    raw = text.encode("utf-8")
    if all(32 <= b < 127 for b in raw):
        return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')
    return "[%s]" % ",".join(str(b) for b in raw)
