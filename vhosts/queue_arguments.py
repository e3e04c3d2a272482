"""Queue arguments and policies: declare-time validation and the settings a
queue runs with.

`validate` checks the x-arguments of a queue.declare as RabbitMQ 3.10 does
(same order, same 406 texts). `effective(arguments, policy)` merges the
arguments with a policy definition (RabbitMQ's keys, without the x- prefix)
by RabbitMQ's rules: for the numeric limits (message-ttl, expires,
max-length, max-length-bytes, delivery-limit) the smaller value wins; for the
others (overflow, dead-letter-exchange, dead-letter-routing-key) the
argument wins. A key set on one side only is taken from that side.

Beyond RabbitMQ 3.10: `x-delivery-limit` is accepted on every queue (3.10
refuses it on classic queues).
"""
from __future__ import annotations

from dataclasses import dataclass

from vhosts.errors import PRECONDITION_FAILED, AMQPError, field_type

MAX_EXPIRY = 315360000000  # ten years in ms: RabbitMQ's limit for TTLs and x-expires
OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """What TTL, expiry, length limits and dead-lettering a queue applies
    (None: no such limit)."""

    message_ttl: int | None = None  # ms
    expires: int | None = None  # ms without use before the queue is deleted
    max_length: int | None = None  # ready messages
    max_length_bytes: int | None = None  # body bytes of ready messages
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None  # returns allowed before dead-lettering

    @property
    def length_limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


# (argument, policy key, combine rule): "min" for numeric limits, "arg" when the argument wins.
_KEYS = (
    ("x-message-ttl", "message-ttl", "min", "message_ttl"),
    ("x-expires", "expires", "min", "expires"),
    ("x-max-length", "max-length", "min", "max_length"),
    ("x-max-length-bytes", "max-length-bytes", "min", "max_length_bytes"),
    ("x-overflow", "overflow", "arg", "overflow"),
    ("x-dead-letter-exchange", "dead-letter-exchange", "arg", "dead_letter_exchange"),
    ("x-dead-letter-routing-key", "dead-letter-routing-key", "arg", "dead_letter_routing_key"),
    ("x-delivery-limit", "delivery-limit", "min", "delivery_limit"),
)

NO_SETTINGS = QueueSettings()


def effective(arguments: dict | None, policy: dict | None) -> QueueSettings:
    """The settings of a queue declared with `arguments` under `policy` (a
    policy definition dict, or None)."""
    arguments = arguments or {}
    policy = policy or {}
    values = {}
    for arg_key, policy_key, rule, field in _KEYS:
        arg = arguments.get(arg_key)
        pol = policy.get(policy_key)
        if arg is None:
            value = pol
        elif pol is None or rule == "arg":
            value = arg
        else:
            value = min(arg, pol)
        if value is not None:
            values[field] = value
    if not values:
        return NO_SETTINGS
    return QueueSettings(**values)


# -- validation ----------------------------------------------------------------


def _integer(value: object) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return '"expected integer, got %s"' % field_type(value)


def _non_negative(value: object) -> str | None:
    problem = _integer(value)
    if problem is None and value < 0:
        return "{value_negative,%d}" % value
    return problem


def _expiry(value: object) -> str | None:
    problem = _non_negative(value)
    if problem is None and value > MAX_EXPIRY:
        return "{value_too_large,%d}" % value
    return problem


def _expires(value: object) -> str | None:
    problem = _expiry(value)
    if problem is None and value == 0:
        return "{value_zero,0}"
    return problem


def _dead_letter_routing_key(value: object, arguments: dict) -> str | None:
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    if "x-dead-letter-exchange" not in arguments:
        return "routing_key_but_no_dlx_defined"
    return None


def _overflow(value: object) -> str | None:
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    if value not in OVERFLOWS:
        return "invalid_overflow"
    return None


# In RabbitMQ's order (rabbit_amqqueue:declare_args), so the first bad one is reported.
_CHECKS = (
    ("x-expires", _expires),
    ("x-message-ttl", _expiry),
    ("x-dead-letter-exchange", None),
    ("x-dead-letter-routing-key", _dead_letter_routing_key),
    ("x-max-length", _non_negative),
    ("x-max-length-bytes", _non_negative),
    ("x-overflow", _overflow),
    ("x-delivery-limit", _non_negative),
)


def validate(queue: str, vhost: str, arguments: dict) -> None:
    """Raise RabbitMQ's 406 for the first argument it would refuse."""
    for key, check in _CHECKS:
        if key not in arguments:
            continue
        value = arguments[key]
        if check is None:  # x-dead-letter-exchange: any exchange name, even one that does not exist
            if not isinstance(value, str):
                raise AMQPError(
                    PRECONDITION_FAILED,
                    "invalid type '%s' for arg '%s' in queue '%s' in vhost '%s'" % (
                        field_type(value), key, queue, vhost))
            continue
        problem = check(value, arguments) if check is _dead_letter_routing_key else check(value)
        if problem is not None:
            raise AMQPError(
                PRECONDITION_FAILED,
                "invalid arg '%s' for queue '%s' in vhost '%s': %s" % (key, queue, vhost, problem))
