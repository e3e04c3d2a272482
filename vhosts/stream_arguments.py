"""Stream queues' arguments, policies and consumer offsets, as RabbitMQ 3.10.

`queue_type(arguments)` names the type of a declared queue (classic,
quorum -- served as classic --, or stream) or raises RabbitMQ's 406.
`validate_stream` checks a stream's declaration in RabbitMQ's order: the
values of the arguments a stream takes, then the arguments only other types
take ("... of queue type rabbit_stream_queue"), then the properties
(auto-delete, exclusive, non-durable), then the segment-size ceiling and
the Bloom filter size (x-stream-filter-size-bytes, 16..255: RabbitMQ 4.x's
checks and texts; 3.10 does not know the argument).
`retention(arguments, policy)` is what the log keeps: for each limit the
smaller of argument and policy wins. `start_of(value)` reads a consumer's
x-stream-offset, `filters_of` its x-stream-filter and
x-stream-match-unfiltered.

Beyond RabbitMQ 3.10 (which answers 541 INTERNAL_ERROR and closes the
connection): an x-max-age of "-1s" and an x-stream-offset of an unknown
string or type are refused with a 406 naming the argument.
"""
from __future__ import annotations

import datetime
import re

from storage.stream_log import LogSettings
from vhosts.errors import NOT_IMPLEMENTED, PRECONDITION_FAILED, AMQPError, field_type
from vhosts.queue_types import CLASSIC, STREAM, check_locator, check_type_argument
DEFAULT_SEGMENT_BYTES = LogSettings.segment_bytes  # RabbitMQ's stream default, 500,000,000
MAX_SEGMENT_BYTES = 3_000_000_000
# Arguments RabbitMQ knows for other queue types only, in its order.
NOT_FOR_STREAMS = (
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
    "x-max-in-memory-length", "x-max-in-memory-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
    "x-single-active-consumer", "x-quorum-initial-group-size", "x-delivery-limit", "x-queue-master-locator",
)
# Consumer arguments that only classic queues take.
CONSUMER_NOT_FOR_STREAMS = ("x-priority", "x-cancel-on-ha-failover")
_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^([0-9]+)([YMDhms])$")


def queue_type(queue: str, vhost: str, arguments: dict) -> str:
    value = arguments.get("x-queue-type", CLASSIC)
    problem = check_type_argument(value)
    if problem is None:
        return value
    raise AMQPError(PRECONDITION_FAILED,
                    "invalid arg 'x-queue-type' for queue '%s' in vhost '%s': %s" % (queue, vhost, problem))


def duration(text: object) -> int | None:
    """Seconds of a RabbitMQ duration ("7D", "1h": a positive integer and
    one of the units Y M D h m s), or None when it is not one."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or not int(match.group(1)):
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


def _non_negative_integer(value: object) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return '"expected integer, got %s"' % field_type(value)
    return "{value_negative,%d}" % value if value < 0 else None


def _max_age(value: object) -> str | None:
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    return None if duration(value) is not None else "invalid_max_age"


_CHECKS = (
    ("x-max-length-bytes", _non_negative_integer),
    ("x-max-age", _max_age),
    ("x-stream-max-segment-size-bytes", _non_negative_integer),
    ("x-stream-filter-size-bytes", _non_negative_integer),
)
# The Bloom filter size a stream may ask for (RabbitMQ 3.13+; osiris's
# range). hutch filters exactly and keeps no Bloom filter, but checks it as
# RabbitMQ does so a declaration means the same on both.
FILTER_SIZE_BYTES = range(16, 256)


def validate_stream(queue: str, vhost: str, durable: bool, exclusive: bool, auto_delete: bool,
                    arguments: dict) -> None:
    where = "for queue '%s' in vhost '%s'" % (queue, vhost)
    for key, check in _CHECKS:
        if key in arguments and (problem := check(arguments[key])) is not None:
            raise AMQPError(PRECONDITION_FAILED, "invalid arg '%s' %s: %s" % (key, where, problem))
    check_locator(queue, vhost, STREAM, arguments)
    for key in NOT_FOR_STREAMS:
        if key in arguments:
            raise AMQPError(PRECONDITION_FAILED, "invalid arg '%s' %s of queue type rabbit_stream_queue" % (key, where))
    for refused, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
        if refused:
            raise AMQPError(PRECONDITION_FAILED, "invalid property '%s' %s" % (name, where))
    if arguments.get("x-stream-max-segment-size-bytes", 0) > MAX_SEGMENT_BYTES:
        raise AMQPError(PRECONDITION_FAILED, "Exceeded max value for x-stream-max-segment-size-bytes")
    if arguments.get("x-stream-filter-size-bytes", FILTER_SIZE_BYTES.start) not in FILTER_SIZE_BYTES:
        raise AMQPError(PRECONDITION_FAILED, "Invalid value for x-stream-filter-size-bytes")


def retention(arguments: dict, policy: dict | None) -> LogSettings:
    """The limits a stream applies: argument and policy (`max-length-bytes`,
    `max-age`, `stream-max-segment-size-bytes`), the smaller winning. A
    policy value that is not valid is ignored."""
    policy = policy or {}

    def smaller(*values):
        values = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        return min(values) if values else 0

    return LogSettings(
        segment_bytes=smaller(arguments.get("x-stream-max-segment-size-bytes"),
                              policy.get("stream-max-segment-size-bytes")) or DEFAULT_SEGMENT_BYTES,
        max_bytes=smaller(arguments.get("x-max-length-bytes"), policy.get("max-length-bytes")),
        max_age=smaller(duration(arguments.get("x-max-age")), duration(policy.get("max-age"))),
    )


# Where a consumer starts: (FIRST|LAST|NEXT, None), (OFFSET, n), (TIME, seconds since the epoch).
FIRST, LAST, NEXT, OFFSET, TIME = "first", "last", "next", "offset", "time"


def start_of(queue: str, vhost: str, arguments: dict, now: float) -> tuple[str, float | int | None]:
    """A basic.consume's x-stream-offset (default: next)."""
    value = arguments.get("x-stream-offset", NEXT)
    if isinstance(value, str):
        if value in (FIRST, LAST, NEXT):
            return value, None
        seconds = duration(value)
        if seconds is not None:
            return TIME, now - seconds
    elif isinstance(value, int) and not isinstance(value, bool):
        return OFFSET, value
    elif isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return TIME, value.timestamp()
    shown = '<<"%s">>' % value if isinstance(value, str) else repr(value)
    raise AMQPError(PRECONDITION_FAILED,
                    "invalid arg 'x-stream-offset' for queue '%s' in vhost '%s': {invalid_stream_offset_arg,{%s,%s}}"
                    % (queue, vhost, field_type(value), shown))


def check_consume(queue: str, vhost: str, no_ack: bool, prefetch_count: int, arguments: dict) -> None:
    """Check a basic.consume of a stream as RabbitMQ 3.10 does (which lets
    an exclusive consumer share a stream): on the shard of the client's
    channel too, when the stream lives on another (vhosts.remote_queue)."""
    start_of(queue, vhost, arguments, 0)
    check_consumer_arguments(queue, vhost, arguments)
    filters_of(queue, vhost, arguments)
    if not prefetch_count:
        raise AMQPError(PRECONDITION_FAILED, "consumer prefetch count is not set for 'queue '%s' in vhost '%s''"
                        % (queue, vhost))
    if no_ack:
        raise not_supported("automatic acknowledgement", queue, vhost)


def not_supported(what: str, queue: str, vhost: str) -> AMQPError:
    """RabbitMQ 3.10's refusal (540) of `what` on a stream: basic.get,
    queue.purge, basic.nack and basic.reject, automatic acknowledgement."""
    return AMQPError(NOT_IMPLEMENTED, "%s not supported by stream queues queue '%s' in vhost '%s'"
                     % (what, queue, vhost))


def check_consumer_arguments(queue: str, vhost: str, arguments: dict) -> None:
    for key in CONSUMER_NOT_FOR_STREAMS:
        if key in arguments:
            raise AMQPError(PRECONDITION_FAILED, "invalid arg '%s' for queue '%s' in vhost '%s' of queue type "
                            "rabbit_stream_queue" % (key, queue, vhost))


def filters_of(queue: str, vhost: str, arguments: dict) -> tuple[frozenset[bytes] | None, bool]:
    """A basic.consume's filter as RabbitMQ 3.13-4.x reads it (its
    rabbit_stream_queue:filter_spec): x-stream-filter is one string or a
    list, whose non-string members are left out; any other value means no
    filtering (None), as does an absent one. x-stream-match-unfiltered
    counts only when it is a boolean (else false). A list without a string
    is refused with 406: RabbitMQ's reader crashes on an empty filter list
    (osiris_bloom:init_matcher has no clause for it)."""
    value = arguments.get("x-stream-filter")
    if isinstance(value, list):
        values = [v for v in value if isinstance(v, (str, bytes))]
        if not values:
            raise AMQPError(PRECONDITION_FAILED, "invalid arg 'x-stream-filter' for queue '%s' in vhost '%s': "
                            "no filter value (a string) in the list" % (queue, vhost))
    elif isinstance(value, (str, bytes)):
        values = [value]
    else:
        return None, False
    unfiltered = arguments.get("x-stream-match-unfiltered", False)
    return (frozenset(v.encode("utf-8") if isinstance(v, str) else v for v in values),
            unfiltered if isinstance(unfiltered, bool) else False)
