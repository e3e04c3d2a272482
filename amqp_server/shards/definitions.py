"""Definition changes on a node of several shards: made on every shard, in
one order (docs/scaling.md).

Shard 0 orders them. A change a client asks of any shard (an AMQP
exchange.* or queue.* method) travels to shard 0 as an *order*: the
method's name and arguments, the user and vhost, and the connection that
asked (its shard and id). Shard 0 runs it through the same vhost call a
single process makes, permission checks and reply codes included, and
turns what changed into *applies*: resolved changes that need no check
(a server-generated queue name and the queue's shard are filled in). It
applies them itself, sends them to every other shard, and answers the
order once every shard has applied them; the asking shard answers its
client only then, so a client that was answered may use the change on any
connection. A refused order changes nothing anywhere.

Each shard keeps every durable definition in its own definitions store (a
queue's row names its shard), so a restarted shard restores its own queues
before serving; a shard that comes back takes shard 0's copy of what
changed meanwhile (`linked`, not yet: docs/scaling.md says what is left).

Changes a queue's own shard decides (an exclusive queue whose connection
closed, an auto-delete queue's last consumer gone, x-expires) are sent to
shard 0 as `removed` orders the same way.
"""
from __future__ import annotations

import logging
import weakref

from routing import Destination
from vhosts.access import Access
from vhosts.errors import INTERNAL_ERROR, AMQPError
from vhosts.remote_queue import RemoteQueue

log = logging.getLogger("hutch.shards")


def _refusal(code: int, text: str) -> AMQPError:
    """The error shard 0 answered, its text as it was (already "NAME - ...")."""
    error = AMQPError(code, "")
    error.reply_text = text
    return error


class RemoteOwner:
    """Stands for a connection on another shard: the exclusive owner of its
    queues here (identity is what `VirtualHost.queue` compares)."""

    __slots__ = ("key", "__weakref__")

    def __init__(self, key: tuple) -> None:
        self.key = key


class Definitions:
    def __init__(self, node) -> None:
        self.node = node
        self.origin = node.here  # the shard whose connection asked for the change being made
        self._connections: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._replaying = False

    # -- who asked -----------------------------------------------------------------

    def key_of(self, connection) -> tuple:
        key = (self.node.here, id(connection))
        self._connections[key[1]] = connection
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

    # -- the order (Broker.order_definition) --------------------------------------------

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
                done(_refusal(record[2], record[3]))
            else:
                done(AMQPError(INTERNAL_ERROR, "shard 0 ended before it answered; try again"))

        self.node.request(0, lambda ticket: ("define", ticket, op), answered)

    def ordered(self, link, ticket: int, op: tuple) -> None:
        """Shard 0: an order from another shard."""
        def done(result):
            if isinstance(result, AMQPError):
                link.send(("refused", ticket, result.reply_code, result.reply_text))
            else:
                link.send(("defined", ticket, result))

        self._order(op, done)

    def _order(self, op: tuple, done) -> None:
        try:
            result, applies = self._execute(op)
        except AMQPError as exc:
            done(exc)
            return
        except Exception:
            log.exception("shard 0: failed to order %r", op[:2])
            done(AMQPError(INTERNAL_ERROR, "internal error"))
            return
        peers = [peer for peer in self.node.outgoing]
        if not applies or not peers:
            done(result)
            return
        left = set(peers)

        def applied(peer):
            def callback(_record):
                left.discard(peer)
                if not left:
                    done(result)
            return callback

        for peer in peers:
            self.node.request(peer, lambda ticket: ("apply", ticket, applies), applied(peer))

    # -- shard 0 runs an order --------------------------------------------------------------

    def _execute(self, op: tuple) -> tuple[object, list]:
        kind = op[0]
        if kind == "removed":
            _kind, vhost, name = op
            host = self.node.broker.vhosts.get(vhost)
            queue = host.queues.get(name) if host is not None else None
            if queue is not None:
                self._replaying = True
                try:
                    host.remove_queue(queue)
                finally:
                    self._replaying = False
            return None, [("queue-", vhost, name)]
        _kind, method, user_name, vhost_name, key, args = op
        broker = self.node.broker
        user = broker.users.get(user_name)
        host = broker.vhosts.get(vhost_name)
        if user is None or host is None:
            raise AMQPError(INTERNAL_ERROR, "user or vhost gone")
        access = Access(user, vhost_name)
        owner = self.owner(key)
        self.origin = key[0]
        self._replaying = True
        try:
            return getattr(self, "_" + method)(host, access, owner, key, *args)
        finally:
            self.origin = self.node.here
            self._replaying = False

    def _queue_declare(self, host, access, owner, key, name, passive, durable, exclusive, auto_delete, arguments):
        before = name in host.queues
        queue = host.declare_queue(name, owner, passive, durable, exclusive, auto_delete, arguments, access)
        result = (queue.name, queue.message_count, queue.consumer_count)
        if before or passive or queue.name not in host.queues:
            return result, []
        return result, [("queue", host.name, queue.name, durable, key if exclusive else None, auto_delete,
                         queue.arguments, getattr(queue, "shard", 0))]

    def _queue_delete(self, host, access, owner, key, name, if_unused, if_empty):
        existed = name in host.queues
        count = host.delete_queue(name, owner, if_unused, if_empty, access)
        return count, ([("queue-", host.name, name)] if existed and name not in host.queues else [])

    def _queue_bind(self, host, access, owner, key, queue, exchange, routing_key, arguments):
        dest = Destination("queue", queue)
        had = self._has(host, exchange, dest, routing_key, arguments)
        host.bind_queue(queue, exchange, routing_key, arguments, owner, access)
        return None, ([] if had else [("bind", host.name, exchange, "queue", queue, routing_key, arguments)])

    def _queue_unbind(self, host, access, owner, key, queue, exchange, routing_key, arguments):
        dest = Destination("queue", queue)
        had = self._has(host, exchange, dest, routing_key, arguments)
        host.unbind_queue(queue, exchange, routing_key, arguments, owner, access)
        return None, ([("unbind", host.name, exchange, "queue", queue, routing_key, arguments)] if had else [])

    def _exchange_declare(self, host, access, owner, key, name, type_, passive, durable, auto_delete, internal,
                          arguments):
        before = name in host.exchanges
        host.declare_exchange(name, type_, passive, durable, auto_delete, internal, arguments, access)
        if before or passive:
            return None, []
        return None, [("exchange", host.name, name, type_, durable, auto_delete, internal, arguments)]

    def _exchange_delete(self, host, access, owner, key, name, if_unused):
        existed = name in host.exchanges
        host.delete_exchange(name, if_unused, access)
        return None, ([("exchange-", host.name, name)] if existed and name not in host.exchanges else [])

    def _exchange_bind(self, host, access, owner, key, destination, source, routing_key, arguments):
        dest = Destination("exchange", destination)
        had = self._has(host, source, dest, routing_key, arguments)
        host.bind_exchange(destination, source, routing_key, arguments, access)
        return None, ([] if had else [("bind", host.name, source, "exchange", destination, routing_key, arguments)])

    def _exchange_unbind(self, host, access, owner, key, destination, source, routing_key, arguments):
        dest = Destination("exchange", destination)
        had = self._has(host, source, dest, routing_key, arguments)
        host.unbind_exchange(destination, source, routing_key, arguments, access)
        return None, ([("unbind", host.name, source, "exchange", destination, routing_key, arguments)]
                      if had else [])

    @staticmethod
    def _has(host, source, dest, routing_key, arguments) -> bool:
        x = host.exchanges.get(source)
        return x is not None and x.table.has_binding(dest, routing_key, arguments)

    # -- every other shard applies ----------------------------------------------------------

    def apply(self, applies: list) -> None:
        self._replaying = True
        try:
            for change in applies:
                try:
                    self._apply(change)
                except Exception:
                    log.exception("shard %d: failed to apply %r", self.node.here, change[:3])
        finally:
            self._replaying = False

    def _apply(self, change: tuple) -> None:
        kind, vhost = change[0], change[1]
        host = self.node.broker.vhosts.get(vhost)
        if host is None:
            return
        if kind == "queue":
            _kind, _vhost, name, durable, key, auto_delete, arguments, shard = change
            if name not in host.queues:
                host.adopt_queue(name, durable, self.owner(key), auto_delete, arguments, shard)
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
            (host.bind if kind == "bind" else host.unbind)(source, Destination(dest_kind, dest), routing_key,
                                                          arguments)

    # -- a queue's own shard removed it --------------------------------------------------------

    def removed(self, vhost: str, queue) -> None:
        """VirtualHost.remove_queue ran here outside an order or an apply."""
        if self._replaying or isinstance(queue, RemoteQueue):
            return
        self.order(("removed", vhost, queue.name), lambda _result: None)

    # -- links ------------------------------------------------------------------------------------

    def linked(self, peer: int) -> None:
        """A link to `peer` is open (what a restarted shard missed: docs/scaling.md)."""

    def peer_gone(self, peer: int) -> None:
        """Nothing waits for a gone shard: `request` answers its tickets as lost."""
