"""Definition changes on a node of several shards: made on every shard, in
one order (docs/scaling.md).

Shard 0 orders them. Everything that changes definitions runs there: the
management API, MQTT, the stream protocol and the links are served by
shard 0 only, and an AMQP exchange.* or queue.* method that reaches
another shard travels to shard 0 as an *order* (the vhost call's name and
arguments, the user and vhost, and the connection that asked: its shard
and id), where it runs through the same vhost call a single process makes,
permission checks and reply codes included.

The domain reports each change it makes (`changed`: a queue, an exchange,
a binding made or removed; a Broker call such as add_user, whose own
effects are part of it: `nested`) as a tuple that needs no check (a
server-generated queue name and the queue's shard filled in). Shard 0
sends them, in order, to every other shard, which makes them too
(`apply`); its replies that promise a change (declare-ok and friends, the
management API's answers: `Broker.durability_barrier`) wait until every
running shard has applied every change made so far (`barrier`), so a
client that was answered may use the change on any connection. A shard
makes only changes of a kind the domain reports, each of its fields' types
(`CHANGES`; a Broker call only if every shard makes it: `BROKER_CHANGES`),
and shard 0 runs an order only if it names one of its AMQP calls
(`AMQP_ORDERS`): anything else is logged and refused.

A shard's own changes besides these (an exclusive queue whose connection
closed, an auto-delete queue's last consumer gone, x-expires) are queue
removals, sent to shard 0 as `removed` orders.

Each shard keeps every durable definition in its own definitions store (a
queue's row names its shard), so a restarted shard restores its own queues
before serving; it then asks shard 0 for everything (`sync`) and makes the
difference (what it lacks, and undoing what it has that shard 0 has not),
before it opens its listeners (a queue whose messages it holds is never
undone: if shard 0 lacks it, it is kept and said). Shard 0's end restarts the whole node
(amqp_server.process.shards): the others' transient definitions were known
to it only.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

from amqp_server.shards.codec import pack
from amqp_server.shards.records import NONE, Kinds
from routing import Destination
from vhosts.access import Access
from vhosts.broker import Broker
from vhosts.errors import INTERNAL_ERROR, AMQPError
from vhosts.remote_queue import RemoteQueue

log = logging.getLogger("hutch.shards")


class RemoteOwner:
    """Stands for a connection on another shard: the exclusive owner of its
    queues here (identity is what `VirtualHost.queue` compares)."""

    __slots__ = ("key", "__weakref__")

    def __init__(self, key: tuple) -> None:
        self.key = key


# The definition changes the domain reports (`changed`), by kind: all that an "apply" or a sync
# may carry (the exclusive owner of a queue: `key_of`).
_BINDING = {"vhost": str, "source": str, "destination_kind": str, "destination": str, "routing_key": str,
            "arguments": (dict, NONE)}
CHANGES = Kinds("definition change", {
    "queue": {"vhost": str, "name": str, "durable": bool, "owner": (tuple, NONE), "auto_delete": bool,
              "arguments": (dict, NONE), "shard": int},
    "queue-": {"vhost": str, "name": str},
    "exchange": {"vhost": str, "name": str, "type": str, "durable": bool, "auto_delete": bool, "internal": bool,
                 "arguments": (dict, NONE)},
    "exchange-": {"vhost": str, "name": str},
    "bind": _BINDING,
    "unbind": _BINDING,
    "broker": {"method": str, "args": tuple, "kwargs": dict},
})
# The Broker calls a "broker" change may name: those every shard makes (vhosts.broker's _every_shard).
BROKER_CHANGES = frozenset(name for name, call in vars(Broker).items() if getattr(call, "every_shard", False))
# The orders another shard may send shard 0 ("define"): an AMQP method of one of its
# connections (a vhost call, `AMQP_ORDERS`), or a queue it removed.
ORDERS = Kinds("order", {
    "amqp": {"method": str, "user": str, "vhost": str, "connection": (tuple, NONE), "args": tuple},
    "removed": {"vhost": str, "name": str},
})


def change_fault(change) -> str | None:
    """None if `change` is a definition change; else what it is not."""
    fault = CHANGES.fault(change)
    if fault is None and change[0] == "broker" and change[1] not in BROKER_CHANGES:
        return "%r is not a definition change" % (change[1],)
    return fault


def order_fault(op) -> str | None:
    """None if `op` is an order shard 0 makes; else what it is not."""
    fault = ORDERS.fault(op)
    if fault is None and op[0] == "amqp" and op[1] not in Definitions.AMQP_ORDERS:
        return "%r is not an AMQP method shard 0 orders" % (op[1],)
    return fault


# What undoes a change a shard has and shard 0 has not (`sync`).
_UNDO = {
    "add_vhost": lambda args, kwargs: ("delete_vhost", (args[0],)),
    "put_user": lambda args, kwargs: ("delete_user", (args[0],)),
    "set_permissions": lambda args, kwargs: ("clear_permissions", (args[0], args[1])),
    "set_topic_permissions": lambda args, kwargs: ("clear_topic_permissions", (args[0], args[1], args[2])),
    "set_vhost_limits": lambda args, kwargs: ("clear_vhost_limits", (args[0],)),
    "set_user_limits": lambda args, kwargs: ("clear_user_limits", (args[0],)),
    "set_policy": lambda args, kwargs: ("clear_policy", (args[0], args[1], kwargs.get("operator", False))),
    "set_parameter": lambda args, kwargs: ("clear_parameter", (args[0], args[1], args[2])),
    "set_global_parameter": lambda args, kwargs: ("clear_global_parameter", (args[0],)),
}


class Definitions:
    def __init__(self, node) -> None:
        self.node = node
        self.origin = node.here  # the shard whose connection asked for the change being made
        self._connections: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._depth = 0  # inside a Broker call or an apply: its changes are not reported
        self._pending: list[tuple] = []  # shard 0: changes made, not sent yet
        self._flush_armed = False
        self._batch = 0  # shard 0: batches sent
        self._acked: dict[int, int] = {}  # shard 0: peer -> last batch it applied
        self._waiters: list[tuple[int, object]] = []  # (batch, done)
        self.synced = asyncio.Event()
        self._early: list[tuple] = []  # batches that came before this shard's sync
        self._followers: set[int] = set()  # shard 0: the peers synced on their current link (its batches go there)

    # -- who asked ---------------------------------------------------------------------

    def key_of(self, owner) -> tuple | None:
        if owner is None:
            return None
        if isinstance(owner, RemoteOwner):
            return owner.key
        key = (self.node.here, id(owner))
        self._connections[key[1]] = owner
        return key

    def owner(self, key: tuple | None):
        if key is None:
            return None
        if key[0] == self.node.here:
            return self._connections.get(key[1])
        owner = self._owners.get(key)
        if owner is None:
            owner = self._owners[key] = RemoteOwner(key)
        return owner

    # -- what the domain reports (vhosts.remote_queue.ShardPort) ---------------------------

    @contextlib.contextmanager
    def nested(self):
        self._depth += 1
        try:
            yield self._depth == 1
        finally:
            self._depth -= 1

    def changed(self, change: tuple) -> None:
        if self._depth:
            return
        if change[0] == "queue":
            change = change[:4] + (self.key_of(change[4]),) + change[5:]
        if self.node.here != 0:
            if change[0] == "queue-":
                self._removed(change[1], change[2])
            elif self.synced.is_set():
                log.error("shard %d: a change outside an order: %r", self.node.here, change[:3])
            return
        self._pending.append(change)
        if not self._flush_armed:
            self._flush_armed = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _removed(self, vhost: str, name: str) -> None:
        """Shard 0 hears that this shard removed its queue `name`; asked again
        when the order is lost with its link (shard 0 may live), ahead of the
        next link's sync, which would otherwise make the queue here again."""
        def answered(record):
            if record[0] == "lost" and answered.link is not None:
                self._removed(vhost, name)

        self.node.request(0, lambda ticket: ("define", ticket, ("removed", vhost, name)), answered)

    def _flush(self) -> None:
        self._flush_armed = False
        if not self._pending:
            return
        changes, self._pending = self._pending, []
        self._batch += 1
        batch = self._batch
        for peer in list(self._followers):
            self.node.request(peer, lambda ticket: ("apply", ticket, batch, changes), self._applied(peer, batch))

    def _applied(self, peer: int, batch: int):
        def callback(record) -> None:
            if record[0] == "applied" and peer in self._acked:
                self._acked[peer] = max(self._acked[peer], batch)
                self._release()
        return callback

    def _release(self) -> None:
        # A shard counts from its sync on (`synced_peer`) until its link is lost (`link_lost`).
        done_upto = min(self._acked.values(), default=self._batch)
        ready = [done for batch, done in self._waiters if batch <= done_upto]
        self._waiters = [(batch, done) for batch, done in self._waiters if batch > done_upto]
        for done in ready:
            done()

    def barrier(self, done) -> None:
        """Shard 0 (Broker.durability_barrier): done() once every running
        shard applied every change made so far."""
        if self._pending:
            self._flush()
        self._waiters.append((self._batch, done))
        self._release()

    # -- orders ----------------------------------------------------------------------------

    def order_amqp(self, method: str, args: tuple, connection, vhost, done) -> None:
        """Broker.order_definition: an AMQP exchange.* or queue.* method of
        `connection` (`method`: the vhost call, amqp_server.amqp.declarations)."""
        self.order(("amqp", method, connection.user.name, vhost.name, self.key_of(connection), args), done)

    def order(self, op: tuple, done) -> None:
        """`op` made on every shard; done(result or AMQPError) after."""
        if self.node.here == 0:
            self._order(op, done)
            return

        def answered(record):
            if record[0] == "defined":
                done(record[2])
            elif record[0] == "refused":
                done(AMQPError.from_reply(record[2], record[3]))
            else:
                done(AMQPError(INTERNAL_ERROR, "shard 0, which orders definitions, did not answer: its link was lost"))

        self.node.request(0, lambda ticket: ("define", ticket, op), answered)

    def ordered(self, link, ticket: int, op: tuple) -> None:
        """Shard 0: an order from another shard (refused unless it is one)."""
        fault = order_fault(op)
        if fault is not None:
            log.error("shard 0: an order from shard %s refused: %s", link.peer, fault)
            link.send(("refused", ticket, INTERNAL_ERROR, "INTERNAL_ERROR - not an order: %s" % fault))
            return

        def done(result):
            if isinstance(result, AMQPError):
                link.send(("refused", ticket, result.reply_code, result.reply_text))
            else:
                link.send(("defined", ticket, result))

        self._order(op, done)

    def _order(self, op: tuple, done) -> None:
        if op[0] == "amqp" and op[1] == "queue_delete":
            # if-empty, if-unused and the count answered are the owner's
            host = self.node.broker.vhosts.get(op[3])
            queue = host.queues.get(op[5][0]) if host is not None else None
            if isinstance(queue, RemoteQueue):
                # an owner that is down answers RabbitMQ's 404, and its queue stays
                self.node.counts(queue, lambda error: done(error) if error else self._order_now(op, done))
                return
        self._order_now(op, done)

    def _order_now(self, op: tuple, done) -> None:
        try:
            result = self._execute(op)
        except AMQPError as exc:
            done(exc)
            return
        except Exception:
            log.exception("shard 0: failed to make %r", op[:2])
            done(AMQPError(INTERNAL_ERROR, "internal error"))
            return
        self.barrier(lambda: done(result))

    def _execute(self, op: tuple):
        broker = self.node.broker
        if op[0] == "removed":
            _kind, vhost, name = op
            host = broker.vhosts.get(vhost)
            queue = host.queues.get(name) if host is not None else None
            if queue is not None:
                host.remove_queue(queue)
            else:  # gone here already: the others still hear of it
                self.changed(("queue-", vhost, name))
            return None
        _kind, method, user_name, vhost_name, key, args = op
        user = broker.users.get(user_name)
        host = broker.vhosts.get(vhost_name)
        if user is None or host is None:
            raise AMQPError(INTERNAL_ERROR, "the user or the vhost was deleted meanwhile")
        access = Access(user, vhost_name)
        owner = self.owner(key)
        self.origin = key[0]
        try:
            return self.AMQP_ORDERS[method](host, access, owner, *args)
        finally:
            self.origin = self.node.here

    @staticmethod
    def _queue_declare(host, access, owner, name, passive, durable, exclusive, auto_delete, arguments):
        queue = host.declare_queue(name, owner, passive, durable, exclusive, auto_delete, arguments, access)
        return (queue.name,)

    @staticmethod
    def _queue_delete(host, access, owner, name, if_unused, if_empty):
        return host.delete_queue(name, owner, if_unused, if_empty, access)

    @staticmethod
    def _queue_bind(host, access, owner, queue, exchange, routing_key, arguments):
        host.bind_queue(queue, exchange, routing_key, arguments, owner, access)

    @staticmethod
    def _queue_unbind(host, access, owner, queue, exchange, routing_key, arguments):
        host.unbind_queue(queue, exchange, routing_key, arguments, owner, access)

    @staticmethod
    def _exchange_declare(host, access, owner, name, type_, passive, durable, auto_delete, internal, arguments):
        host.declare_exchange(name, type_, passive, durable, auto_delete, internal, arguments, access)

    @staticmethod
    def _exchange_delete(host, access, owner, name, if_unused):
        host.delete_exchange(name, if_unused, access)

    @staticmethod
    def _exchange_bind(host, access, owner, destination, source, routing_key, arguments):
        host.bind_exchange(destination, source, routing_key, arguments, access)

    @staticmethod
    def _exchange_unbind(host, access, owner, destination, source, routing_key, arguments):
        host.unbind_exchange(destination, source, routing_key, arguments, access)

    # an AMQP order's method -> the vhost call it makes (amqp_server.amqp.declarations names them)
    AMQP_ORDERS = {
        "queue_declare": _queue_declare, "queue_delete": _queue_delete, "queue_bind": _queue_bind,
        "queue_unbind": _queue_unbind, "exchange_declare": _exchange_declare, "exchange_delete": _exchange_delete,
        "exchange_bind": _exchange_bind, "exchange_unbind": _exchange_unbind,
    }

    # -- every other shard applies -------------------------------------------------------------

    def batch(self, link, ticket: int, batch: int, changes: list) -> None:
        """A batch of shard 0's changes; one made before this shard's sync is
        kept until the sync, and then made only if the sync did not include it."""
        changes = self.definition_changes(changes)
        if not self.synced.is_set():
            self._early.append((link, ticket, batch, changes))
            return
        self.apply(changes)
        link.send(("applied", ticket))

    def definition_changes(self, changes: list, source: int = 0) -> list:
        """The definition changes of `changes` (shard `source`'s); anything else is logged and left out."""
        kept = []
        for change in changes:
            fault = change_fault(change)
            if fault is None:
                kept.append(change)
            else:
                log.error("shard %d: a change from shard %s refused: %s", self.node.here, source, fault)
        return kept

    def apply(self, changes: list) -> None:
        with self.nested():
            for change in changes:
                try:
                    self._apply(change)
                except Exception:
                    log.exception("shard %d: failed to apply %r", self.node.here, change[:3])

    def _apply(self, change: tuple) -> None:
        broker = self.node.broker
        if change[0] == "broker":
            _kind, method, args, kwargs = change
            getattr(broker, method)(*args, **kwargs)  # one of BROKER_CHANGES (definition_changes)
            return
        kind, vhost = change[0], change[1]
        host = broker.vhosts.get(vhost)
        if host is None:
            return
        if kind == "queue":
            _kind, _vhost, name, durable, key, auto_delete, arguments, shard = change
            if name not in host.queues:
                host.adopt_queue(name, durable, self.owner(key), auto_delete, arguments, shard,
                                 restoring=durable and key is None and shard == self.node.here)
        elif kind == "queue-":
            queue = host.queues.get(change[2])
            if queue is not None:
                host.remove_queue(queue)
        elif kind == "exchange":
            _kind, _vhost, name, type_, durable, auto_delete, internal, arguments = change
            if name not in host.exchanges:
                host.declare_exchange(name, type_, False, durable, auto_delete, internal, arguments)
        elif kind == "exchange-":
            if change[2] in host.exchanges:
                host.delete_exchange(change[2])
        elif kind in ("bind", "unbind"):
            _kind, _vhost, source, dest_kind, dest, routing_key, arguments = change
            if source in host.exchanges:
                (host.bind if kind == "bind" else host.unbind)(source, Destination(dest_kind, dest), routing_key,
                                                              arguments)

    # -- everything, for a shard that (re)starts ---------------------------------------------------

    def everything(self) -> list[tuple]:
        """Every definition of this shard, as the changes that make it."""
        broker = self.node.broker
        changes = []
        for name, host in broker.vhosts.items():
            changes.append(("broker", "add_vhost", (name, host.description, list(host.tags)), {}))
            if host.limits:
                changes.append(("broker", "set_vhost_limits", (name, host.limits), {}))
            if host.tracing:
                changes.append(("broker", "set_tracing", (name, True), {}))
        for user in broker.users.values():
            changes.append(("broker", "put_user", (user.name, user.password_hash, list(user.tags)), {}))
            if user.limits:
                changes.append(("broker", "set_user_limits", (user.name, user.limits), {}))
            for vhost, permission in user.permissions.items():
                changes.append(("broker", "set_permissions", (user.name, vhost, permission), {}))
            for (vhost, exchange), topic in user.topic_permissions.items():
                changes.append(("broker", "set_topic_permissions", (user.name, vhost, exchange, topic.write,
                                                                    topic.read), {}))
        for name, value in broker.global_parameters.items():
            changes.append(("broker", "set_global_parameter", (name, value), {}))
        for name, host in broker.vhosts.items():
            for operator, policies in ((False, host.policies), (True, host.operator_policies)):
                for policy in policies.values():
                    changes.append(("broker", "set_policy", (name, policy.name, policy.pattern, policy.definition,
                                                             policy.priority, policy.apply_to),
                                    {"operator": True} if operator else {}))
            for (component, parameter), value in host.parameters.items():
                changes.append(("broker", "set_parameter", (name, component, parameter, value),
                                {"owner": host.parameter_owners.get((component, parameter))}))
            for x in host.exchanges.values():
                if not x.builtin:
                    changes.append(("exchange", name, x.name, x.type, x.durable, x.auto_delete, x.internal,
                                    x.arguments))
            for queue in host.queues.values():
                changes.append(("queue", name, queue.name, queue.durable, self.key_of(queue.exclusive_owner),
                                queue.auto_delete, queue.arguments, getattr(queue, "shard", self.node.here)))
            for source, dest, routing_key, arguments in host.bindings():
                changes.append(("bind", name, source, dest.kind, dest.name, routing_key, arguments))
        return changes

    def sync(self, theirs: list[tuple]) -> None:
        """Make this shard's definitions shard 0's: undo what it has that
        shard 0 has not, then make what it lacks."""
        theirs = self.definition_changes(theirs)
        ours = self.everything()
        keys = {pack(change): change for change in theirs}  # equal changes encode equally
        mine = {pack(change): change for change in ours}
        missing = [keys[key] for key in keys if key not in mine]
        extra = [mine[key] for key in mine if key not in keys]
        undo = []
        for change in reversed(extra):
            if change[0] == "bind":
                undo.append(("unbind",) + change[1:])
            elif change[0] == "queue":
                if any(c[0] == "queue" and c[1:3] == change[1:3] for c in missing):
                    continue  # both have it, differently: below
                host = self.node.broker.vhosts.get(change[1])
                if isinstance(host.queues.get(change[2]), RemoteQueue):
                    undo.append(("queue-", change[1], change[2]))
                else:  # its messages are here: never dropped because shard 0 lacks it (a lost store?)
                    log.error("shard %d: queue '%s' in vhost '%s' is this shard's, but shard 0 does not know it: "
                              "kept, not served to the other shards", self.node.here, change[2], change[1])
            elif change[0] == "exchange":
                undo.append(("exchange-", change[1], change[2]))
            elif change[0] == "broker" and change[1] in _UNDO:
                if not any(c[0] == "broker" and c[1] == change[1] and c[2][:1] == change[2][:1] for c in missing):
                    method, args = _UNDO[change[1]](change[2], change[3])
                    undo.append(("broker", method, args, {}))
        # a queue both sides have, differently: shard 0's wins, unless this
        # shard holds it (its messages are here: kept, and said)
        for change in missing:
            if change[0] == "queue" and any(c[0] == "queue" and c[1:3] == change[1:3] for c in extra):
                host = self.node.broker.vhosts.get(change[1])
                if isinstance(host.queues.get(change[2]), RemoteQueue):
                    undo.append(("queue-", change[1], change[2]))
                else:
                    log.error("shard %d: queue '%s' in vhost '%s' is this shard's, but shard 0 knows it "
                              "otherwise: kept as it is", self.node.here, change[2], change[1])
        self.apply(undo + missing)
        log.info("shard %d: definitions synced with shard 0 (%d made, %d undone)", self.node.here, len(missing),
                 len(undo))

    def linked(self, peer: int, first: bool) -> None:
        """A link to `peer` opened: a shard other than 0 syncs with shard 0, each
        time (what shard 0 sent on a lost link may never have come). It offers
        its transient definitions (`transients`) on the `first` link to an
        incarnation of shard 0 only (a new group 0 leader): one it links to
        again knows them, and may have deleted some meanwhile."""
        if peer != 0 or self.node.here == 0:
            return

        def answered(record):
            if record[0] != "synced":
                return  # its link was lost: the next one syncs again
            _kind, _ticket, changes, upto = record
            self.sync(changes)
            self.synced.set()
            early, self._early = self._early, []
            for link, ticket, batch, batch_changes in early:
                if batch > upto:
                    self.apply(batch_changes)
                link.send(("applied", ticket))

        offer = self.transients() if first else []
        self.node.request(0, lambda ticket: ("sync", ticket, offer), answered)

    def up(self) -> list[int]:
        """Shard 0: the other shards that are up (synced and linked)."""
        return sorted(self._followers)

    def send_pending(self) -> None:
        """Shard 0: the changes made so far go on the links now, ahead of what
        is sent next (Mesh.link_to)."""
        if self._pending:
            self._flush()

    def transients(self) -> list[tuple]:
        """What only this shard may still know after shard 0 ended: its own
        transient queues (exclusive ones too: their connections are here) and
        every transient exchange, with the bindings that name one of them. In a
        cluster group 0's new leader knows the durable definitions only (they
        are replicated); a shard that lives on offers these at its sync (`adopt`)."""
        here = self.node.here
        offer = []
        for name, host in self.node.broker.vhosts.items():
            exchanges = {x.name for x in host.exchanges.values() if not x.builtin and not x.durable}
            queues = {q.name for q in host.queues.values()
                      if not q.durable and not isinstance(q, RemoteQueue) and getattr(q, "shard", here) == here}
            for x in host.exchanges.values():
                if x.name in exchanges:
                    offer.append(("exchange", name, x.name, x.type, x.durable, x.auto_delete, x.internal,
                                  x.arguments))
            for queue_name in queues:
                queue = host.queues[queue_name]
                offer.append(("queue", name, queue.name, queue.durable, self.key_of(queue.exclusive_owner),
                              queue.auto_delete, queue.arguments, here))
            for source, dest, routing_key, arguments in host.bindings():
                named = source in exchanges or (dest.name in (queues if dest.kind == "queue" else exchanges))
                if named:
                    offer.append(("bind", name, source, dest.kind, dest.name, routing_key, arguments))
        return offer

    def adopt(self, peer: int, offer: list) -> None:
        """Shard 0: what a syncing shard offers (`transients`) and shard 0 lacks
        is made here, and so reaches every shard: a queue only as the offering
        shard's own, never one shard 0 knows otherwise (its definition wins)."""
        adopted = 0
        for change in self.definition_changes(offer, peer):
            kind, host = change[0], self.node.broker.vhosts.get(change[1])
            if host is None:
                continue
            try:
                if kind == "queue" and change[2] not in host.queues and change[7] == peer:
                    _kind, _vhost, name, durable, key, auto_delete, arguments, shard = change
                    host.adopt_queue(name, durable, self.owner(key), auto_delete, arguments, shard)
                elif kind == "exchange" and change[2] not in host.exchanges:
                    _kind, _vhost, name, type_, durable, auto_delete, internal, arguments = change
                    host.declare_exchange(name, type_, False, durable, auto_delete, internal, arguments)
                elif kind == "bind":
                    _kind, _vhost, source, dest_kind, dest, routing_key, arguments = change
                    there = host.queues if dest_kind == "queue" else host.exchanges
                    if source not in host.exchanges or dest not in there:
                        continue
                    host.bind(source, Destination(dest_kind, dest), routing_key, arguments)
                else:
                    continue
            except Exception:
                log.exception("shard 0: cannot adopt %r of shard %d", change[:3], peer)
                continue
            adopted += 1
        if adopted:
            log.info("shard 0: %d transient definitions of shard %d adopted at its sync", adopted, peer)

    def synced_peer(self, link) -> tuple[list, int]:
        """Shard 0: the shard at the other end of `link` asks for everything:
        from now on it gets every batch on that link, after this answer, and
        takes part in the barrier."""
        self.send_pending()
        self._acked[link.peer] = self._batch
        self._followers.add(link.peer)
        return self.everything(), self._batch

    def link_lost(self, peer: int) -> None:
        """Shard 0: `peer`'s link is lost. A batch sent on it may not have
        reached it, so it follows again only once it synced on its next link,
        and meanwhile the barrier does not wait for it; its queues stay (it may
        well live: `peer_ended`)."""
        self._followers.discard(peer)
        if self._acked.pop(peer, None) is not None:
            self._release()

    def peer_ended(self, peer: int) -> None:
        """Shard 0: shard `peer` ended (amqp_server.shards.mesh knows when). Its
        transient queues ended with it (as RabbitMQ's do with their node), and
        so did its connections' exclusive queues; its durable queues stay,
        unreachable until it is back."""
        if self.node.here != 0:
            return
        for host in list(self.node.broker.vhosts.values()):
            for queue in list(host.queues.values()):
                owner = queue.exclusive_owner
                gone = owner is not None and getattr(owner, "key", (None,))[0] == peer
                kept = queue.durable and owner is None  # what a restart recovers
                if gone or (getattr(queue, "shard", 0) == peer and not kept):
                    host.remove_queue(queue)
