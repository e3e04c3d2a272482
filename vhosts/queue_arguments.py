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
refuses it on classic queues). The arguments only quorum queues have are
checked on quorum queues only, and a quorum queue's x-delivery-limit is not
checked at all, as in 3.10 (vhosts.queue_types).
"""
from __future__ import annotations

from dataclasses import dataclass

from vhosts.errors import PRECONDITION_FAILED, AMQPError, field_type
from vhosts.queue_types import QUORUM, check_type_argument

MAX_EXPIRY = 315360000000  # ten years in ms: RabbitMQ's limit for TTLs and x-expires
MAX_PRIORITY = 255
OVERFLOWS = ("drop-head", "reject-publish", "reject-publish-dlx")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")


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
        if field == "delivery_limit" and arg is not None:
            arg = _delivery_limit(arg)
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


def _delivery_limit(value: object) -> int | None:
    """A quorum queue's unvalidated x-delivery-limit as RabbitMQ 3.10 applies
    it: a non-integer is no limit, a negative one acts as 0 (validated
    classic ones pass unchanged)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return max(value, 0)


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


def _max_priority(value: object) -> str | None:
    problem = _non_negative(value)
    if problem is None and value > MAX_PRIORITY:
        return "{max_value_exceeded,%d}" % value
    return problem


def _dead_letter_strategy(value: object) -> str | None:
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    if value not in DEAD_LETTER_STRATEGIES:
        return "invalid_dlx_strategy"
    return None


def _group_size(value: object) -> str | None:
    problem = _non_negative(value)
    if problem is None and value == 0:
        return "{value_zero,0}"
    return problem


def _boolean(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    return "{unacceptable_type,%s}" % field_type(value)


# In RabbitMQ's order (rabbit_amqqueue:declare_args), so the first bad one is
# reported; the third column: checked on every queue (ALL) or on one type only.
ALL, QUORUM_ONLY, NOT_QUORUM = "all", "quorum only", "not quorum"
_CHECKS = (
    ("x-expires", _expires, ALL),
    ("x-message-ttl", _expiry, ALL),
    ("x-dead-letter-exchange", None, ALL),
    ("x-dead-letter-routing-key", _dead_letter_routing_key, ALL),
    ("x-dead-letter-strategy", _dead_letter_strategy, QUORUM_ONLY),
    ("x-max-length", _non_negative, ALL),
    ("x-max-length-bytes", _non_negative, ALL),
    ("x-max-in-memory-length", _non_negative, QUORUM_ONLY),
    ("x-max-in-memory-bytes", _non_negative, QUORUM_ONLY),
    ("x-max-priority", _max_priority, ALL),
    ("x-overflow", _overflow, ALL),
    ("x-single-active-consumer", _boolean, ALL),
    ("x-queue-type", check_type_argument, ALL),
    ("x-quorum-initial-group-size", _group_size, QUORUM_ONLY),
    ("x-delivery-limit", _non_negative, NOT_QUORUM),
)


def validate(queue: str, vhost: str, arguments: dict) -> None:
    """Raise RabbitMQ's 406 for the first argument it would refuse."""
    quorum = arguments.get("x-queue-type") == QUORUM
    for key, check, applies in _CHECKS:
        if key not in arguments or applies == (NOT_QUORUM if quorum else QUORUM_ONLY):
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


def max_priority(arguments: dict) -> int:
    """The number of priority levels above 0 of a validated queue (0: not a priority queue)."""
    return arguments.get("x-max-priority", 0)


def consumer_priority(vhost: str, queue: str, arguments: dict) -> int:
    """A basic.consume's x-priority (any integer; 0 when absent)."""
    value = arguments.get("x-priority", 0)
    problem = _integer(value)
    if problem is not None:
        raise AMQPError(PRECONDITION_FAILED,
                        "invalid arg 'x-priority' for queue '%s' in vhost '%s': %s" % (queue, vhost, problem))
    return value
