"""Queue types: what `x-queue-type` selects, and the declare-time rules of
each type as RabbitMQ 3.10 applies them.

hutch has one queue implementation. The type changes what a declare accepts
and a few details a client can observe; in a cluster every durable queue is
replicated whatever its type (docs/cluster.md), so a quorum queue's group
size is accepted and has no further effect.

quorum (RabbitMQ 3.10's rules): no server-named queue (checked first); then,
after the argument values:
- a known argument the type does not support (the classic-only and
  stream-only ones) is refused, the first in the client's order, with
  "... of queue type rabbit_quorum_queue";
- then the properties, in RabbitMQ's order: auto-delete, exclusive,
  non-durable ("invalid property '...'");
- x-delivery-limit is not validated: a non-integer means no limit and a
  negative one acts as 0 (queue_arguments.effective);
- basic.get carries x-delivery-count from the first delivery on, and a
  consumer on a channel with a global prefetch is refused (540).

classic and stream: unchanged (hutch's classic queue also accepts
x-delivery-limit, see queue_arguments).
"""
from __future__ import annotations

from vhosts.errors import PRECONDITION_FAILED, AMQPError, field_type
from vhosts.queue_location import leader_locator_problem, master_locator_problem

CLASSIC, QUORUM, STREAM = "classic", "quorum", "stream"
TYPES = (CLASSIC, QUORUM, STREAM)

# The arguments RabbitMQ 3.10 knows for some type but refuses on a quorum
# queue (rabbit_queue_type's union minus rabbit_quorum_queue's capabilities).
_NOT_QUORUM = frozenset((
    "x-max-priority", "x-queue-mode", "x-queue-version", "x-queue-master-locator",
    "x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
))


def queue_type(arguments: dict) -> str:
    """The type of a queue declared with (validated) `arguments`."""
    return arguments.get("x-queue-type") or CLASSIC


def check_type_argument(value: object) -> str | None:
    """The problem with an x-queue-type value, as RabbitMQ words it, or None."""
    if not isinstance(value, str):
        return "{unacceptable_type,%s}" % field_type(value)
    if value not in TYPES:
        return "\"unsupported queue type '%s'\"" % value
    return None


def check_server_named(arguments: dict) -> None:
    """A quorum queue needs a name the client chose (checked before anything else)."""
    if arguments.get("x-queue-type") == QUORUM:
        raise AMQPError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type rabbit_quorum_queue")


def check_declare(queue: str, vhost: str, durable: bool, exclusive: bool, auto_delete: bool,
                  arguments: dict) -> None:
    """Raise RabbitMQ's 406 when a new queue breaks its type's rules."""
    kind = queue_type(arguments)
    check_locator(queue, vhost, kind, arguments)
    if kind != QUORUM:
        return
    for key in arguments:
        if key in _NOT_QUORUM:
            raise AMQPError(
                PRECONDITION_FAILED,
                "invalid arg '%s' for queue '%s' in vhost '%s' of queue type rabbit_quorum_queue" % (
                    key, queue, vhost))
    for refused, prop in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
        if refused:
            raise AMQPError(PRECONDITION_FAILED,
                            "invalid property '%s' for queue '%s' in vhost '%s'" % (prop, queue, vhost))


def check_locator(queue: str, vhost: str, kind: str, arguments: dict) -> None:
    """The leader locator a queue of type `kind` takes (vhosts.queue_location),
    checked as RabbitMQ 3.10.8 does, after the other arguments' values: a
    classic queue refuses x-queue-leader-locator whatever its value, a
    quorum queue or a stream checks its value before its type's other rules."""
    key, check = ("x-queue-master-locator", master_locator_problem) if kind == CLASSIC else \
        ("x-queue-leader-locator", leader_locator_problem)
    if kind == CLASSIC and "x-queue-leader-locator" in arguments:
        raise AMQPError(PRECONDITION_FAILED, "invalid arg 'x-queue-leader-locator' for queue '%s' in vhost '%s' of "
                                             "queue type rabbit_classic_queue" % (queue, vhost))
    if key in arguments and (problem := check(arguments[key])) is not None:
        raise AMQPError(PRECONDITION_FAILED,
                        "invalid arg '%s' for queue '%s' in vhost '%s': %s" % (key, queue, vhost, problem))
