"""Validation of the queue and consumer arguments behind priorities and
single active consumer, with RabbitMQ 3.10's reply texts (rabbit_amqqueue's
check_*_arg functions; the values were observed against RabbitMQ).

Only a new queue's arguments are checked: a redeclaration is compared for
equivalence instead, as RabbitMQ does.
"""
from __future__ import annotations

from vhosts.errors import AMQPError, PRECONDITION_FAILED, field_type

MAX_PRIORITY = 255


def _invalid(vhost: str, key: str, queue: str, detail: str) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, "invalid arg '%s' for queue '%s' in vhost '%s': %s"
                     % (key, queue, vhost, detail))


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_queue_arguments(vhost: str, queue: str, arguments: dict) -> None:
    """x-max-priority (an integer 0..255) and x-single-active-consumer (a bool)."""
    if "x-max-priority" in arguments:
        value = arguments["x-max-priority"]
        if not _is_integer(value):
            detail = '"expected integer, got %s"' % field_type(value)
        elif value < 0:
            detail = "{value_negative,%d}" % value
        elif value > MAX_PRIORITY:
            detail = "{max_value_exceeded,%d}" % value
        else:
            detail = None
        if detail is not None:
            raise _invalid(vhost, "x-max-priority", queue, detail)
    if "x-single-active-consumer" in arguments:
        value = arguments["x-single-active-consumer"]
        if not isinstance(value, bool):
            raise _invalid(vhost, "x-single-active-consumer", queue,
                           "{unacceptable_type,%s}" % field_type(value))


def consumer_priority(vhost: str, queue: str, arguments: dict) -> int:
    """A basic.consume's x-priority (any integer; 0 when absent)."""
    value = arguments.get("x-priority", 0)
    if not _is_integer(value):
        raise _invalid(vhost, "x-priority", queue, '"expected integer, got %s"' % field_type(value))
    return value


def max_priority(arguments: dict) -> int:
    """The number of priority levels above 0 of a validated queue (0: not a priority queue)."""
    return arguments.get("x-max-priority", 0)
