"""A virtual host: its exchanges, queues and bindings, and publish routing.

Invariants:
- `queues` and `exchanges` hold live objects only; a deleted queue is marked
  `deleted` so late acks and requeues from channels become no-ops.
- `_bound_from[dest]` is the set of exchange names with at least one binding to
  `dest`, so deleting a queue or exchange touches only the tables that route
  to it (never a scan of every exchange).
- Every error is an `AMQPError` carrying RabbitMQ's reply code and text.
- Durable definitions: with a `definitions` store (the methods of
  `storage.definitions.DefinitionStore`; None keeps nothing), every change to
  a durable exchange, a durable non-exclusive queue, or a binding whose two
  ends are such (RabbitMQ's rule) is written before the change is made in
  memory, and one operation with the auto-deletes it triggers is one
  transaction. Exclusive queues are never stored (RabbitMQ does not recover
  them); durable auto-delete queues and exchanges are.
- Permissions: methods taking `access` (a vhosts.access.Access) check it at
  the point where RabbitMQ's channel does, so a client sees the same error
  first; `access` None is an administrator's call and checks nothing.
- Policies: every queue and exchange carries the definition of the one
  policy that applies to it (vhosts.policies), set when it is declared or
  restored and by `apply_policies` whenever the vhost's policies change.
- Dead-lettering (`dead_letter`) is the one way messages die: every message
  rejected without requeue, expired, dropped by a length limit or past its
  delivery limit passes there, first through every callback in
  `on_dead_letter` (called as `callback(queue, reason, message, death)`,
  whether or not the queue has a dead letter exchange), then to the dead
  letter exchange. At-least-once: the source queue acks the message only
  after every target queue holds it (on disk when it is persistent and the
  target durable), and after every callback that returned a hold (a
  function `hold(done)`, e.g. the dead-letter log's append) has called
  `done`, so a crash in between may duplicate it, never lose it.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
from typing import Callable

import routing
from routing import Destination
from storage import MemoryQueue, Message, QueueEntry
from storage.priority_queue import PriorityQueue, level_name
from vhosts import reply_to
from vhosts.access import Access
from vhosts.clock import Clock, LoopClock
from vhosts.dead_letter import Death, dead_lettered, is_cycle, routing_keys as death_routing_keys
from vhosts.errors import (
    ACCESS_REFUSED,
    AMQPError,
    COMMAND_INVALID,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    erl_binary,
    field_type,
    fmt_value,
)
from vhosts.delayed import DELAYED, Delayer, check_delayed_type, delay_of
from vhosts.exchange import PREDECLARED, TRACE_EXCHANGE, Exchange
from vhosts.move import move
from vhosts.policies import Policy, effective, matching
from vhosts.queue import DURABLE_PENDING, HANDED_OFF, REJECTED, Queue
from vhosts.queue_arguments import max_priority, validate as validate_queue_arguments
from vhosts.queue_location import CLIENT_LOCAL, placement
from vhosts.queue_types import CLASSIC, STREAM, check_declare as check_queue_type, check_server_named
from vhosts.remote_queue import RemoteQueue, ShardPort
from vhosts.stream_arguments import queue_type, retention, validate_stream
from vhosts.stream_queue import StreamQueue
from vhosts.users import limit_reached
from vhosts.stats import Churn, ExchangeStats, VhostStats

# Arguments whose values must match on re-declaration (rabbit_amqqueue's list);
# other arguments are ignored by the equivalence check, as in RabbitMQ.
QUEUE_EQUIVALENT_ARGS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-queue-master-locator",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
)
EXCHANGE_EQUIVALENT_ARGS = ("alternate-exchange",)
# Every exchange type that can be declared: routing's, and the delayed-message one.
EXCHANGE_TYPES = routing.EXCHANGE_TYPES | {DELAYED}


def _check_x_match(value: object) -> None:
    """A headers binding's x-match, validated as rabbit_exchange_type_headers does."""
    if isinstance(value, str):
        if value in ("all", "any", "all-with-x", "any-with-x"):
            return
        raise AMQPError(
            PRECONDITION_FAILED,
            "Invalid x-match field value %s; expected all, any, all-with-x, or any-with-x" % erl_binary(value),
        )
    raise AMQPError(
        PRECONDITION_FAILED,
        "Invalid x-match field type %s (value %s); expected longstr" % (field_type(value), fmt_value(value)),
    )


def _classic_by_default(current: dict, received: dict) -> tuple[dict, dict]:
    """As RabbitMQ, no x-queue-type is equivalent to x-queue-type classic."""
    if ("x-queue-type" in current) == ("x-queue-type" in received):
        return current, received  # the common case: compared as they are
    if current.get("x-queue-type", CLASSIC) == received.get("x-queue-type", CLASSIC) == CLASSIC:
        return {**current, "x-queue-type": CLASSIC}, {**received, "x-queue-type": CLASSIC}
    return current, received


def new_queue_name() -> str:
    """Server-named queue, RabbitMQ style: amq.gen- + 22 chars of url-safe base64."""
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


log = logging.getLogger("hutch.vhost")


class VirtualHost:
    def __init__(self, name: str, definitions=None, message_storage=None, clock: Clock | None = None) -> None:
        self.name = name
        # Free-form metadata for operators (the management API's description and tags); kept by the Broker.
        self.description = ""
        self.tags: list[str] = []
        self.clock = clock or LoopClock()
        # Called for every message that dies (see the module docstring).
        self.on_dead_letter: list[Callable] = []
        # Where durable definitions are kept (see the module docstring).
        self.definitions = definitions
        # A `storage.vhost_storage.VhostStorage`: durable queues keep their
        # messages there; None keeps every queue in memory.
        self.message_storage = message_storage
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        # max-connections, max-queues (vhosts.users.VHOST_LIMITS); kept by the Broker.
        self.limits: dict = {}
        # name -> Policy; set by the Broker, which calls apply_policies after a change.
        self.policies: dict[str, Policy] = {}
        # name -> OperatorPolicy, the same way (vhosts.policies: they cap queue limits).
        self.operator_policies: dict[str, Policy] = {}
        # (component, name) -> JSON value: runtime parameters (vhosts.parameters); kept by the Broker.
        self.parameters: dict[tuple[str, str], object] = {}
        # (component, name) -> the user who set it, for those a user set (the links check its access)
        self.parameter_owners: dict[tuple[str, str], str] = {}
        self._bound_from: dict[Destination, set[str]] = {}
        # The names of the x-delayed-message exchanges, which publish looks
        # up first, and what holds their delayed messages.
        self.delayed_exchanges: set[str] = set()
        self.delayer = Delayer(self._deliver_delayed,
                               message_storage.delayed_store() if message_storage is not None else None)
        # The default exchange's counters (it is no `Exchange`), and those of deleted exchanges and of
        # publishes committed after their exchange went: the vhost's publishes are the sum (vhosts.stats).
        self.default_exchange_stats = ExchangeStats()
        self.retired_exchange_stats = ExchangeStats()
        self.stats = VhostStats(self._exchange_stats)
        self.churn = Churn()  # the broker's, once it adopts this vhost
        for xname, xtype in PREDECLARED:
            self.exchanges[xname] = Exchange(xname, xtype, durable=True, builtin=True)
        self.exchanges[TRACE_EXCHANGE] = Exchange(TRACE_EXCHANGE, "topic", durable=True, internal=True, builtin=True)
        # The firehose is on (vhosts.firehose); not kept across restarts, as in RabbitMQ.
        self.tracing = False
        # Direct reply-to: live reply token -> deliver(message) of its channel's
        # reply consumer (amqp_server.amqp.direct_reply_to registers them).
        self.reply_consumers: dict[str, Callable[[Message], None]] = {}
        # The node's other shards (vhosts.remote_queue.ShardPort), when it has
        # several: a queue another shard owns is a RemoteQueue here.
        self.shards: ShardPort | None = None
        self.last_targets: list = []  # the queues the latest publish reached

    def _exchange_stats(self):
        yield self.default_exchange_stats
        yield self.retired_exchange_stats
        for x in self.exchanges.values():
            yield x.stats

    # -- lookups -------------------------------------------------------------

    def _where(self) -> str:
        return "in vhost '%s'" % self.name

    def exchange(self, name: str) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise AMQPError(NOT_FOUND, "no exchange '%s' %s" % (name, self._where()))
        return x

    def queue(self, name: str, owner: object) -> Queue:
        """The queue, checked for exclusive access by connection `owner`."""
        q = self.queues.get(name)
        if q is None:
            raise self.no_queue(name)
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name)
        return q

    def no_queue(self, name: str) -> AMQPError:
        return AMQPError(NOT_FOUND, "no queue '%s' %s" % (name, self._where()))

    def _locked(self, name: str) -> AMQPError:
        return AMQPError(
            RESOURCE_LOCKED,
            "cannot obtain exclusive access to locked queue '%s' %s. It could be originally "
            "declared on another connection or the exclusive property value does not match "
            "that of the original declaration." % (name, self._where()),
        )

    def _not_default(self, name: str) -> None:
        if name == "":
            raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange")

    def _inequivalent(self, what: str, name: str, key: str, received: object, current: object) -> AMQPError:
        return AMQPError(
            PRECONDITION_FAILED,
            "inequivalent arg '%s' for %s '%s' %s: received '%s' but current is '%s'"
            % (key, what, name, self._where(), fmt_value(received), fmt_value(current)),
        )

    # -- policies ----------------------------------------------------------------

    def policy_for(self, kind: str, name: str) -> Policy | None:
        """The policy that applies to the queue or exchange (`kind`) `name`."""
        return matching(self.policies.values(), kind, name) if self.policies else None

    def operator_policy_for(self, kind: str, name: str) -> Policy | None:
        """The operator policy that applies to the queue or exchange `name`."""
        return matching(self.operator_policies.values(), kind, name) if self.operator_policies else None

    def _definition_for(self, kind: str, name: str) -> dict | None:
        return effective(self.policy_for(kind, name), self.operator_policy_for(kind, name))

    def apply_policies(self) -> None:
        """Give every queue and exchange the policy that now applies to it."""
        for x in self.exchanges.values():
            x.policy = self._definition_for("exchange", x.name)
        for q in self.queues.values():
            q.apply_policy(self._definition_for("queue", q.name))

    # -- durable definitions ---------------------------------------------------

    def _transaction(self):
        """One store transaction around an operation and its cascades."""
        if self.definitions is None:
            return contextlib.nullcontext()
        return self.definitions.transaction()

    @staticmethod
    def _stored(q: Queue) -> bool:
        """RabbitMQ recovers durable queues, but never exclusive ones."""
        return q.durable and q.exclusive_owner is None

    def _durable_binding(self, x: Exchange, dest: Destination) -> bool:
        """RabbitMQ keeps a binding only when its source and destination are durable."""
        if not x.durable:
            return False
        if dest.kind == "exchange":
            d = self.exchanges.get(dest.name)
            return d is not None and d.durable
        q = self.queues.get(dest.name)
        return q is not None and self._stored(q)

    def restore(self, exchanges, queues, bindings) -> None:
        """Rebuild durable definitions read from the store at start (rows of
        `storage.definitions`); nothing is written back. Queues come back
        without consumers or owner, as after a RabbitMQ restart."""
        for row in exchanges:
            if row.name in self.exchanges or row.type not in EXCHANGE_TYPES:
                log.warning("not restoring exchange '%s' (type %s) %s", row.name, row.type, self._where())
                continue
            self.exchanges[row.name] = Exchange(
                row.name, row.type, row.durable, row.auto_delete, row.internal, row.arguments
            )
            if row.type == DELAYED:
                self.delayed_exchanges.add(row.name)
        for row in queues:
            self.queues[row.name] = self._new_queue(
                row.name, row.durable, None, row.auto_delete, row.arguments, restoring=True, shard=row.shard)
        for row in bindings:
            dest = Destination(row.destination_kind, row.destination)
            x = self.exchanges.get(row.source)
            ends = self.queues if dest.kind == "queue" else self.exchanges
            if x is None or dest.name not in ends:
                log.warning("not restoring a binding from '%s' to %s '%s' %s: an end is missing",
                            row.source, dest.kind, dest.name, self._where())
                continue
            if x.table.bind(dest, row.routing_key, row.arguments):
                self._bound_from.setdefault(dest, set()).add(row.source)
        self.apply_policies()

    def _check_args(self, what: str, name: str, keys, current: dict, received: dict) -> None:
        for key in keys:
            old, new = current.get(key), received.get(key)
            if old == new and type(old) is type(new):
                continue
            if new is None:
                detail = "received none but current is the value '%s' of type '%s'" % (
                    fmt_value(old), field_type(old))
            elif old is None:
                detail = "received the value '%s' of type '%s' but current is none" % (
                    fmt_value(new), field_type(new))
            else:
                raise self._inequivalent(what, name, key, new, old)
            raise AMQPError(
                PRECONDITION_FAILED,
                "inequivalent arg '%s' for %s '%s' %s: %s" % (key, what, name, self._where(), detail),
            )

    # -- exchanges -----------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type: str,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
        access: Access | None = None,
    ) -> Exchange:
        # RabbitMQ's order: the type, then the default exchange, then the
        # configure permission, then (only for a new exchange) the reserved
        # prefix; existing amq.* may be redeclared. `access` None: no
        # permission checks (an administrator's operation).
        if not passive and type not in EXCHANGE_TYPES:
            raise AMQPError(COMMAND_INVALID, "unknown exchange type '%s'" % type)
        self._not_default(name)
        if passive:
            return self.exchange(name)
        if access is not None:
            access.check("exchange", name, "configure")
        arguments = arguments or {}
        x = self.exchanges.get(name)
        if x is None:
            if name.startswith("amq."):
                raise AMQPError(ACCESS_REFUSED, "exchange name '%s' contains reserved prefix 'amq.*'" % name)
            ae = arguments.get("alternate-exchange")
            if ae is not None and not isinstance(ae, str):
                raise AMQPError(
                    PRECONDITION_FAILED,
                    "invalid type '%s' for arg 'alternate-exchange' in exchange '%s' %s"
                    % (field_type(ae), name, self._where()),
                )
            if ae is not None and access is not None:
                access.check("exchange", name, "read")
                access.check("exchange", ae, "write")
            if type == DELAYED:
                check_delayed_type(arguments, routing.EXCHANGE_TYPES)
            x = Exchange(name, type, durable, auto_delete, internal, arguments)
            x.policy = self._definition_for("exchange", name)
            if durable and self.definitions is not None:
                self.definitions.upsert_exchange(self.name, name, type, durable, auto_delete, internal, arguments)
            self.exchanges[name] = x
            if type == DELAYED:
                self.delayed_exchanges.add(name)
            if self.shards is not None:
                self.shards.changed(("exchange", self.name, name, type, durable, auto_delete, internal, arguments))
            return x
        for key, received, current in (
            ("type", type, x.type),
            ("durable", durable, x.durable),
            ("auto_delete", auto_delete, x.auto_delete),
            ("internal", internal, x.internal),
        ):
            if received != current:
                raise self._inequivalent("exchange", name, key, received, current)
        self._check_args("exchange", name, EXCHANGE_EQUIVALENT_ARGS, x.arguments, arguments)
        return x

    def delete_exchange(self, name: str, if_unused: bool = False, access: Access | None = None) -> None:
        self._not_default(name)
        if name.startswith("amq."):  # RabbitMQ refuses any amq.* name, existing or not
            raise AMQPError(ACCESS_REFUSED, "deletion of system exchange '%s' %s not allowed" % (name, self._where()))
        if access is not None:
            access.check("exchange", name, "configure")
        x = self.exchanges.get(name)
        if x is None:
            return
        if if_unused and len(x.table):
            raise AMQPError(PRECONDITION_FAILED, "exchange '%s' %s in use" % (name, self._where()))
        with self._transaction():
            self._remove_exchange(x)

    def _remove_exchange(self, x: Exchange) -> None:
        if x.durable and self.definitions is not None:
            self.definitions.delete_exchange(self.name, x.name)  # and its bindings, both ways
        del self.exchanges[x.name]
        self.retired_exchange_stats.fold(x.stats)
        self.delayed_exchanges.discard(x.name)
        for dest, _key, _args in list(x.table.bindings()):
            self._forget_binding(x.name, dest)
        self._remove_destination(Destination("exchange", x.name))
        if self.shards is not None:
            self.shards.changed(("exchange-", self.name, x.name))

    def _remove_destination(self, dest: Destination) -> None:
        """Drop every binding to `dest`, auto-deleting sources left with none."""
        for source in self._bound_from.pop(dest, ()):
            x = self.exchanges.get(source)
            if x is None:
                continue
            x.table.remove_destination(dest)
            self._maybe_auto_delete(x)

    def _forget_binding(self, source: str, dest: Destination) -> None:
        sources = self._bound_from.get(dest)
        if sources is not None:
            sources.discard(source)
            if not sources:
                del self._bound_from[dest]

    def _maybe_auto_delete(self, x: Exchange) -> None:
        if x.auto_delete and not len(x.table) and x.name in self.exchanges:
            self._remove_exchange(x)

    # -- bindings ------------------------------------------------------------

    def bind(self, source: str, dest: Destination, key: str, arguments: dict | None) -> None:
        self._not_default(source)
        x = self.exchange(source)
        if isinstance(x.table, routing.HeadersTable) and arguments and "x-match" in arguments:
            _check_x_match(arguments["x-match"])
        new = not x.table.has_binding(dest, key, arguments)
        if self.definitions is not None and self._durable_binding(x, dest) and new:
            self.definitions.add_binding(self.name, source, dest.kind, dest.name, key, arguments)
        if x.table.bind(dest, key, arguments):
            self._bound_from.setdefault(dest, set()).add(source)
        if new and self.shards is not None:
            self.shards.changed(("bind", self.name, source, dest.kind, dest.name, key, arguments))

    def unbind(self, source: str, dest: Destination, key: str, arguments: dict | None) -> None:
        """Idempotent, as in RabbitMQ: a missing source, destination or binding is fine."""
        self._not_default(source)
        x = self.exchanges.get(source)
        if x is None or not x.table.has_binding(dest, key, arguments):
            return
        with self._transaction():
            if self.definitions is not None and self._durable_binding(x, dest):
                self.definitions.remove_binding(self.name, source, dest.kind, dest.name, key, arguments)
            x.table.unbind(dest, key, arguments)
            if not x.table.has_destination(dest):
                self._forget_binding(source, dest)
            if self.shards is not None:
                self.shards.changed(("unbind", self.name, source, dest.kind, dest.name, key, arguments))
            self._maybe_auto_delete(x)

    def _check_binding(self, access: Access | None, source: str, dest: Destination, key: str) -> None:
        """RabbitMQ's checks of a binding or unbinding, in its order: write on
        the destination, neither end the default exchange, read on the
        source, then the topic permission of the binding key."""
        if access is None:
            return
        access.check(dest.kind, dest.name, "write")
        if dest.kind == "exchange":
            self._not_default(dest.name)
        self._not_default(source)
        access.check("exchange", source, "read")
        access.topic(self.exchanges.get(source), key, "read")

    def bind_queue(self, queue: str, exchange: str, key: str, arguments: dict | None, owner: object,
                   access: Access | None = None) -> None:
        self._check_binding(access, exchange, Destination("queue", queue), key)
        self._not_default(exchange)
        self.exchange(exchange)  # as RabbitMQ: a missing source is reported before a missing queue
        self.queue(queue, owner)
        self.bind(exchange, Destination("queue", queue), key, arguments)

    def unbind_queue(self, queue: str, exchange: str, key: str, arguments: dict | None, owner: object,
                     access: Access | None = None) -> None:
        self._check_binding(access, exchange, Destination("queue", queue), key)
        # As RabbitMQ: exclusivity is checked only when the binding exists.
        x = self.exchanges.get(exchange)
        if queue in self.queues and x is not None and x.table.has_binding(Destination("queue", queue), key, arguments):
            self.queue(queue, owner)
        self.unbind(exchange, Destination("queue", queue), key, arguments)

    def bind_exchange(self, destination: str, source: str, key: str, arguments: dict | None,
                      access: Access | None = None) -> None:
        self._check_binding(access, source, Destination("exchange", destination), key)
        self._not_default(destination)
        self._not_default(source)
        self.exchange(source)  # as RabbitMQ: a missing source is reported first
        self.exchange(destination)
        self.bind(source, Destination("exchange", destination), key, arguments)

    def unbind_exchange(self, destination: str, source: str, key: str, arguments: dict | None,
                        access: Access | None = None) -> None:
        self._check_binding(access, source, Destination("exchange", destination), key)
        self._not_default(destination)
        self._not_default(source)
        self.unbind(source, Destination("exchange", destination), key, arguments)

    def bindings(self):
        """(source, destination, key, arguments) for every explicit binding."""
        for x in self.exchanges.values():
            for dest, key, args in x.table.bindings():
                yield x.name, dest, key, args

    # -- queues --------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        owner: object,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict | None = None,
        access: Access | None = None,
    ) -> Queue:
        # RabbitMQ's order: the name, the configure permission (on the
        # generated name for a server-named queue); for a new queue the
        # vhost's queue limit, then read on it and write on its DLX.
        if passive:
            q = self.queue(name, owner)
            q.touch()  # any declare renews an x-expires lease, as in RabbitMQ
            return q
        arguments = arguments or {}
        kind = queue_type(name, self.name, arguments) if name not in self.queues else None
        if not name:
            if kind == STREAM:
                raise AMQPError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type rabbit_stream_queue")
            check_server_named(arguments)
            name = new_queue_name()
        elif name.startswith("amq."):
            raise AMQPError(ACCESS_REFUSED, "queue name '%s' contains reserved prefix 'amq.*'" % name)
        if access is not None:
            access.check("queue", name, "configure")
        self.churn.queue_declared += 1
        q = self.queues.get(name)
        if q is None:
            limit = limit_reached(self.limits, "max-queues", len(self.queues))
            if limit is not None:
                raise AMQPError(
                    PRECONDITION_FAILED,
                    "cannot declare queue '%s': queue limit in vhost '%s' (%d) is reached" % (name, self.name, limit),
                )
            dlx = arguments.get("x-dead-letter-exchange")
            if isinstance(dlx, str) and access is not None:
                access.check("queue", name, "read")
                access.check("exchange", dlx, "write")
            # As RabbitMQ: arguments are validated for a new queue; an existing
            # one only checks them for equivalence.
            if kind == STREAM:
                validate_stream(name, self.name, durable, exclusive, auto_delete, arguments)
            else:
                validate_queue_arguments(name, self.name, arguments)
                check_queue_type(name, self.name, durable, exclusive, auto_delete, arguments)
            return self.adopt_queue(name, durable, owner if exclusive else None, auto_delete, arguments)
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name)
        if q.durable != durable:
            raise self._inequivalent("queue", name, "durable", durable, q.durable)
        if q.auto_delete != auto_delete:
            raise self._inequivalent("queue", name, "auto_delete", auto_delete, q.auto_delete)
        if (q.exclusive_owner is not None) != exclusive:
            raise self._locked(name)
        self._check_args("queue", name, QUEUE_EQUIVALENT_ARGS, *_classic_by_default(q.arguments, arguments))
        q.touch()
        return q

    def adopt_queue(self, name: str, durable: bool, exclusive_owner: object | None, auto_delete: bool,
                    arguments: dict, shard: int | None = None, restoring: bool = False) -> Queue:
        """Make a queue a declaration created, checked already (here, or on
        the shard that orders definitions: amqp_server.shards)."""
        q = self._new_queue(name, durable, exclusive_owner, auto_delete, arguments, restoring, shard)
        q.apply_policy(self._definition_for("queue", name))
        if self.definitions is not None and self._stored(q):
            self.definitions.upsert_queue(self.name, name, durable, auto_delete, arguments,
                                          getattr(q, "shard", self.shards.here if self.shards else 0))
        self.queues[name] = q
        self.churn.queue_created += 1
        if self.shards is not None:
            self.shards.changed(("queue", self.name, name, durable, exclusive_owner, auto_delete, arguments,
                                 getattr(q, "shard", self.shards.here)))
        return q

    def _new_queue(self, name: str, durable: bool, exclusive_owner: object | None, auto_delete: bool,
                   arguments: dict, restoring: bool = False, shard: int | None = None) -> Queue | StreamQueue:
        """A new queue object (declared, or restored at start). A stream
        keeps its messages in a log of its own (vhosts.stream_queue); the
        others in the message storage, which pages them to disk under memory
        pressure; only a durable, non-exclusive queue keeps persistent
        messages across restarts (exclusive queues are never recovered).
        A priority queue has one backing queue per priority level. On a
        node of several shards a queue lives on `shard` (placed now when
        None) and is a RemoteQueue on the others."""
        shards = self.shards
        if shards is not None:
            if shard is None:
                local = exclusive_owner is not None or auto_delete or \
                    placement(arguments, self._definition_for("queue", name)) == CLIENT_LOCAL
                shard = shards.place(self.name, name, local, arguments.get("x-queue-type") == STREAM)
            if shard != shards.here:
                return RemoteQueue(name, self.name, shard, durable, exclusive_owner, auto_delete, arguments, shards)
        storage = self.message_storage
        if arguments.get("x-queue-type") == STREAM:
            if storage is None:
                raise AMQPError(NOT_IMPLEMENTED, "stream queues need a data directory")
            policy = self._definition_for("queue", name)
            log = storage.stream_log(name, retention(arguments, policy), restoring)
            return StreamQueue(name, self.name, log, arguments, self.clock, policy)

        def backing_for(stored_as: str):
            if storage is None:
                return MemoryQueue()
            if restoring:
                return storage.recover_queue(stored_as)
            return storage.new_queue(stored_as, durable and exclusive_owner is None)

        top = max_priority(arguments)
        if top:
            backing = PriorityQueue([backing_for(level_name(name, level)) for level in range(top + 1)])
        else:
            backing = backing_for(name)
        return Queue(
            name,
            self.name,
            backing,
            durable=durable,
            exclusive_owner=exclusive_owner,
            auto_delete=auto_delete,
            arguments=arguments,
            host=self,
            clock=self.clock,
        )

    def delete_queue(self, name: str, owner: object, if_unused: bool = False, if_empty: bool = False,
                     access: Access | None = None) -> int:
        if access is not None:
            access.check("queue", name, "configure")
        q = self.queues.get(name)
        if q is None:
            return 0
        self.queue(name, owner)
        if if_unused and q.consumer_count:
            raise AMQPError(PRECONDITION_FAILED, "queue '%s' %s in use" % (name, self._where()))
        if if_empty and q.message_count:
            raise AMQPError(PRECONDITION_FAILED, "queue '%s' %s not empty" % (name, self._where()))
        return self.remove_queue(q)

    def remove_queue(self, q: Queue) -> int:
        """Delete `q` unconditionally (exclusive owner gone, auto-delete, ...)."""
        if self.queues.get(q.name) is not q:
            return 0
        count = q.delete_ok_count
        with self._transaction():
            if self.definitions is not None and self._stored(q):
                self.definitions.delete_queue(self.name, q.name)  # and the bindings to it
            del self.queues[q.name]
            self._remove_destination(Destination("queue", q.name))
        self.churn.queue_deleted += 1
        for consumer in q.delete():
            consumer.channel.consumer_cancelled(consumer)
        if self.shards is not None:
            self.shards.changed(("queue-", self.name, q.name))
        return count

    def queue_expired(self, q: Queue) -> None:
        """x-expires: `q` went unused for its expiry period."""
        self.remove_queue(q)

    def dead_letter(self, queue: Queue, entries: list[QueueEntry], reason: str) -> None:
        """Entries that left `queue`'s ready set die (see the module docstring);
        each is acked in `queue` once its dead-letter targets hold it."""
        settings = queue.settings
        dlx = settings.dead_letter_exchange
        if dlx is not None and dlx != "" and dlx not in self.exchanges:
            dlx = None  # RabbitMQ drops what would go to a missing exchange
        now = self.clock.now()
        for entry in entries:
            message = entry.message
            death = Death(reason, queue.name, now, message.exchange, death_routing_keys(message), dlx,
                          entry.deliveries)
            holds = [hold for hold in (callback(queue, reason, message, death) for callback in self.on_dead_letter)
                     if hold is not None]
            if dlx is None:
                if holds:
                    self._hand_over(queue, entry, message, [], holds)
                else:
                    queue.ack((entry,))
                continue
            dead, keys, deaths = dead_lettered(message, death, settings.dead_letter_routing_key)
            targets = self.route(dlx, keys, dead.headers)
            if reason != "rejected":
                targets = [q for q in targets if not is_cycle(q.name, deaths)]
            self._hand_over(queue, entry, dead, targets, holds)

    @staticmethod
    def _hand_over(source: Queue, entry: QueueEntry, message: Message, targets: list[Queue],
                   holds: list[Callable[[Callable[[], None]], None]]) -> None:
        """Publish a dead-lettered message to its targets, then ack it in the
        source once every target that writes it has it on disk and every
        hold has called back."""
        pending = [1]  # the hand-over itself, released last

        def durable() -> None:
            pending[0] -= 1
            if not pending[0]:
                source.ack((entry,))

        for hold in holds:
            pending[0] += 1
            hold(durable)
        for q in targets:
            if q.publish(message, durable) == DURABLE_PENDING:
                pending[0] += 1
        durable()

    def storage_ready(self) -> None:
        """After restoring (or creating) the vhost: finish the message
        storage's recovery before serving (blocking, at start)."""
        if self.message_storage is not None:
            self.delayer.recover()
            self.message_storage.finish_recovery()

    def purge_queue(self, name: str, owner: object, access: Access | None = None) -> int:
        if access is not None:
            access.check("queue", name, "read")
        return self.queue(name, owner).purge()

    # -- peek and move (admin operations) ------------------------------------

    def _existing_queue(self, name: str) -> Queue:
        """For admin operations: any queue, exclusive ones included."""
        q = self.queues.get(name)
        if q is None:
            raise AMQPError(NOT_FOUND, "no queue '%s' %s" % (name, self._where()))
        return q

    async def peek_queue(self, name: str, count: int) -> list[QueueEntry]:
        """The first `count` ready messages of queue `name`, in delivery
        order, left where they are: entries with `redelivered` and `message`
        (`exchange`, `routing_key`, `properties`, `headers`, `body`); to be
        treated as read-only. Paged-out messages are read back off the loop."""
        q = self._existing_queue(name)
        if count <= 0:
            return []
        peeked = asyncio.get_running_loop().create_future()
        q.peek(count, lambda result: peeked.done() or peeked.set_result(result))
        result = await peeked
        if isinstance(result, Exception):
            raise result
        return result

    async def move_messages(self, source: str, destination: str, kind: str = "queue",
                            count: int | None = None, routing_key: str | None = None) -> int:
        """Move up to `count` messages (None: all ready now) from the head of
        queue `source` to queue `destination` (kind "queue": the messages are
        unchanged) or through exchange `destination` (kind "exchange", "" the
        default one: published with their routing key, or `routing_key`).
        Each leaves the source only once the destination holds it (durably
        when persistent); a message routed nowhere stays in the source and
        ends the move. Returns how many moved (see vhosts.move)."""
        q = self._existing_queue(source)
        if kind == "queue":
            target = self._existing_queue(destination)
            if target is q:
                raise AMQPError(PRECONDITION_FAILED, "cannot move messages of queue '%s' %s to itself"
                                % (source, self._where()))

            def route(message: Message):
                return message, ([] if target.deleted else [target])
        elif kind == "exchange":
            if destination:
                self.exchange(destination)

            def route(message: Message):
                key = message.routing_key if routing_key is None else routing_key
                moved = Message(destination, key, message.header, message.body)
                return moved, self.route(destination, [key], message.headers)
        else:
            raise ValueError("kind must be 'queue' or 'exchange', not %r" % (kind,))
        limit = q.message_count if count is None else max(count, 0)
        return await move(q, route, limit)

    # -- publish -------------------------------------------------------------

    def route(self, exchange: str, routing_keys: list[str], headers: dict | None) -> list[Queue]:
        """The queues a message published to `exchange` reaches."""
        queues = self.queues
        if exchange == "":
            if len(routing_keys) == 1:
                q = queues.get(routing_keys[0])
                return [q] if q is not None else []
            found = {queues.get(k) for k in routing_keys}
            found.discard(None)
            return list(found)
        names = routing.resolve(exchange, routing_keys, headers, self.exchanges.get)
        return [queues[n] for n in names if n in queues]

    def _deliver_delayed(self, message: Message, routing_keys: list[str]) -> None:
        """A delayed message is due: route it as its exchange now does (none
        when the exchange is gone) and enqueue it."""
        if message.exchange not in self.delayed_exchanges:
            return
        for q in self.route(message.exchange, routing_keys, message.headers):
            q.publish(message)

    def _deliver_replies(self, message: Message, routing_keys: list[str]) -> None:
        """Direct reply-to: each distinct key naming a live reply token hands
        the message to that token's channel. As in RabbitMQ 3.10 this is not
        routing: the publisher sees it as unroutable (a mandatory reply is
        returned too), and nothing is stored."""
        for key in sorted(set(routing_keys)):
            deliver = self.reply_consumers.get(key)
            if deliver is not None:
                deliver(message)
            elif reply_to.elsewhere(self, key):  # a token of a channel on another shard
                self.shards.reply(self.name, key, message)

    def check_publish(self, exchange: str) -> Exchange | None:
        """The exchange a publish goes to (None: the default exchange)."""
        if exchange == "":
            return None
        x = self.exchanges.get(exchange)
        if x is None:
            raise AMQPError(NOT_FOUND, "no exchange '%s' %s" % (exchange, self._where()))
        if x.internal:
            raise AMQPError(ACCESS_REFUSED, "cannot publish to internal exchange '%s' %s" % (exchange, self._where()))
        return x

    def publish(
        self,
        message: Message,
        routing_keys: list[str],
        headers: dict | None,
        publisher,
        on_durable: Callable[[], None] | None = None,
    ) -> tuple[int, int, bool]:
        """Route and enqueue. Returns (queues reached, how many of them will
        call `on_durable` once the message is on disk, whether a queue
        refused it: reject-publish, the publisher gets a nack). `publisher`
        (with `throttled_by(queue)`) is told which queues ask it to wait
        (credit flow, see vhosts.queue)."""
        name = message.exchange
        if name:
            x = self.exchanges.get(name)
            counted = x.stats if x is not None else self.retired_exchange_stats  # a commit after its deletion
        else:
            counted = self.default_exchange_stats
        counted.publish_in += 1
        waits = 0
        rejected = False
        if name in self.delayed_exchanges and (delay := delay_of(headers)):
            # Held by the exchange (vhosts.delayed): no queue now, but its
            # alternate exchange, if any, gets it at once, as with the plugin.
            x = self.exchanges[message.exchange]
            waits = int(self.delayer.delay(message, delay, routing_keys, x.durable, on_durable))
            ae = x.alternate_exchange
            targets = self.route(ae, routing_keys, headers) if ae is not None else []
        else:
            targets = self.route(message.exchange, routing_keys, headers)
            if (self.reply_consumers or self.shards is not None) and message.exchange == "" \
                    and len(targets) < len(routing_keys):
                self._deliver_replies(message, routing_keys)
        self.last_targets = targets  # which queues (which shards: amqp_server.amqp.hand_over)
        for q in targets:
            outcome = q.publish(message, on_durable)
            if outcome == HANDED_OFF:
                continue  # nothing waits for it and the queue is not backed up
            if outcome == DURABLE_PENDING:
                waits += 1
            elif outcome == REJECTED:
                rejected = True
            if q.backed_up:
                q.throttle(publisher)
        storage = self.message_storage
        if storage is not None and storage.writer.backlogged:
            storage.writer.flow_waiters.add(publisher)
            publisher.throttled_by(storage.writer)
        reached = len(targets)
        # RabbitMQ 3.10 counts the one queue a single-key publish to the default
        # exchange names as routed to even when it does not exist.
        if reached != 1 and (name or len(routing_keys) != 1):
            counted.routed_beyond_one += reached - 1
        return reached, waits, rejected
