"""A queue that another shard of this node owns (docs/scaling.md).

Every shard knows every queue (routing happens where a publish arrives);
the shard that owns a queue holds its messages, consumers and deliveries,
and the others hold a `RemoteQueue`: its declaration, and the way to the
owner through the node's shard port (`ShardPort`, given by the composition
root: amqp_server.shards.port).

Theory of operation, on the shard of the client:
- publish: the message goes to the owner; a publish that waits for a
  confirm counts the owner among the queues it waits for (DURABLE_PENDING),
  and `on_durable` runs when the owner has it on disk.
- consume: a local `Consumer` (the client's channel's) is registered here
  and at the owner, which runs a stand-in consumer of the same tag,
  priority, exclusivity and per-consumer prefetch, and the channel's
  global prefetch (which follows the channel's basic.qos: `qos`), so the
  owner's queue chooses among all consumers of every shard as it would
  among local ones. The owner accepts or refuses it (exclusivity is its to
  judge) before its first delivery: `answered(None or the AMQPError)`.
  The owner's deliveries arrive as `RemoteEntry`s, wait in `pending` for
  the client's channel to take them (its own prefetch and output), and go
  out through the channel's ordinary `deliver`; acks, rejects and requeues
  of them go back to the owner by entry id.
- basic.cancel (`cancel_consumer`) ends when the owner says so, behind
  every delivery it sent the consumer: a no-ack one the owner let go when
  it sent it, so each reaches the client before the cancel's answer (as
  RabbitMQ delivers what a queue handed the channel before a cancel; one
  process never holds one unsent, it stays in the queue). An ack-mode one
  not yet delivered goes back. A channel that closes forgets its consumers
  at once (`remove_consumer`): no-ack deliveries still on their way are
  lost with it, as with RabbitMQ's channel.
- basic.get: `get` starts a fetch at the owner and answers None while it
  is out, with `message_count` positive, so the channel waits on
  `when_available` exactly as it waits for a message read back from disk;
  a channel that closed meanwhile gives the answer back (`not_wanted`).
- The owner is gone (its shard ended): consumers are cancelled (the client
  hears basic.cancel, as when a queue's node fails), unconfirmed publishes
  are nacked (a tx.commit waiting for them fails: amqp_server.amqp.channel),
  and acks of its deliveries are dropped (the owner's restart recovers
  every message it had not seen acked, flagged redelivered).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from storage import Message, QueueEntry
from vhosts.errors import NOT_FOUND, PRECONDITION_FAILED, AMQPError
from vhosts.node import NODE
from vhosts.queue_arguments import consumer_priority
from vhosts.queue_types import STREAM, queue_type
from vhosts.stream_arguments import check_consume, not_supported
from vhosts.stats import MessageStats

if TYPE_CHECKING:
    from vhosts.consumer import Consumer

# vhosts.queue's publish outcomes (the same values)
ACCEPTED, DURABLE_PENDING = 0, 1


class ShardPort(Protocol):
    here: int  # this shard's index

    def place(self, vhost: str, name: str, local: bool, stream: bool) -> int: ...

    def publish(self, queue: "RemoteQueue", message: Message, on_durable: Callable[[], None] | None) -> None: ...

    # The owner answers with queue.consume_answered(tag, None or an AMQPError).
    def consume(self, queue: "RemoteQueue", consumer: "Consumer") -> None: ...

    # answered: the owner's queue.owner_cancelled(tag) ends it, after what it sent before.
    def cancel(self, queue: "RemoteQueue", consumer: "Consumer", answered: bool = False) -> None: ...

    # The consumer's channel's global prefetch is now `global_prefetch`.
    def qos(self, queue: "RemoteQueue", consumer: "Consumer", global_prefetch: int) -> None: ...

    def settle(self, queue: "RemoteQueue", entries: list["RemoteEntry"], outcome: str) -> None: ...

    def fetch(self, queue: "RemoteQueue") -> None: ...

    # queue.purge: done(count, or an AMQPError) once the owner purged it.
    def purge(self, queue: "RemoteQueue", done: Callable[[object], None]) -> None: ...

    # Refresh a RemoteQueue's counts from its owner, then done(None), or done(an AMQPError)
    # when the owner is down; asked on the link its consume and settlements take, so the
    # owner's deliveries sent before come first.
    def counts(self, queue: "RemoteQueue", done: Callable[[AMQPError | None], None]) -> None: ...

    # A definition changed here (a tuple: amqp_server.shards.definitions); inside `nested()`
    # only the outermost change is reported.
    def changed(self, change: tuple) -> None: ...

    def nested(self): ...

    # A direct reply to a token of a channel on another shard (vhosts.reply_to).
    def reply(self, vhost: str, token: str, message: Message) -> None: ...

    # done(whether the channel of a token of another shard still lives).
    def reply_token(self, vhost: str, token: str, done: Callable[[bool], None]) -> None: ...

    # The broker's count of (kind, name) here is now `count` (vhosts.broker: node-wide limits).
    def tallied(self, kind: str, name: str, count: int) -> None: ...

    # The other shards' count of (kind, name).
    def elsewhere(self, kind: str, name: str) -> int: ...

    # The answer of the service `service` (a name in the owner's `services`) of shard `peer`;
    # raises ShardGone if that shard ends first (amqp_server.links.federation asks its demand).
    async def ask(self, peer: int, service: str, *args) -> object: ...

    # A message died here: shard 0 appends `record` (a storage.dead_letter_log.DeadLetter) to the
    # vhost's dead-letter log, the node's one; on_durable() once it is on disk there.
    def dead_letter(self, vhost: str, record: object, on_durable: Callable[[], None]) -> None: ...


def owner_down(queue: "RemoteQueue") -> AMQPError:
    """What RabbitMQ answers for a queue whose node is down (rabbit_amqqueue's
    with_or_die): here its shard ended, or has been unreachable for a heartbeat."""
    return AMQPError(NOT_FOUND, "home node '%s' of %squeue '%s' in vhost '%s' is down or inaccessible"
                     % (NODE, "durable " if queue.durable else "", queue.name, queue.vhost))


class RemoteEntry(QueueEntry):
    """A delivery from the owner: `seq` is the owner's id for it, valid only
    in the owner's `incarnation` that handed it out (the port's token for
    it): a settle of it reaches that incarnation or nothing, never a later
    one that numbers its deliveries anew."""

    __slots__ = ("consumer", "incarnation")

    def __init__(self, seq: int, message: Message, redelivered: bool, deliveries: int, consumer,
                 incarnation: object) -> None:
        super().__init__(seq, message)
        self.redelivered = redelivered
        self.deliveries = deliveries
        self.consumer = consumer  # the local Consumer it was sent to; None for a basic.get
        self.incarnation = incarnation


class RemoteQueue:
    remote = True
    LINK_FULL = "link full"  # a reason it is held (`held`)

    def __init__(self, name: str, vhost: str, shard: int, durable: bool, exclusive_owner: object | None,
                 auto_delete: bool, arguments: dict, port: ShardPort) -> None:
        self.name = name
        self.vhost = vhost
        self.shard = shard
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.port = port
        self.kind = queue_type(arguments)
        self.consumers: dict[str, Consumer] = {}  # the local ones, by tag
        self.pending: dict[str, deque[RemoteEntry]] = {}
        # Consumers the owner has not answered yet, and those being cancelled: tag -> answered(error or None).
        self.subscribing: dict[str, Callable[[AMQPError | None], None]] = {}
        self.cancelling: dict[str, Callable[[AMQPError | None], None]] = {}
        self.stats = MessageStats()
        self.deleted = False
        self.policy = None
        # basic.get: None (no fetch out), True (out), or its answer (an entry, or False: empty)
        self._fetched: object = None
        self._get_waiters: list[Callable[[], None]] = []
        # the owner's counts as it last reported them (declare-ok, listings)
        self.message_count = 0
        self.consumer_count = 0
        # Credit flow: the owner's queue asked its publishers here to wait (`held`).
        self.backed_up = False
        self._holding: set[str] = set()  # what holds it back (`held`)
        self.flow_waiters: set = set()

    # -- publish --------------------------------------------------------------

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> int:
        self.port.publish(self, message, on_durable)
        return DURABLE_PENDING if on_durable is not None else ACCEPTED

    def throttle(self, publisher) -> None:
        """`publisher` waits until the owner's queue lets go (`held`)."""
        self.flow_waiters.add(publisher)
        publisher.throttled_by(self)

    def held(self, holding: bool, why: str = "owner") -> None:
        """The owner's queue is backed up (credit flow, vhosts.queue: "owner"), or the
        links to its shard are full (LINK_FULL); or no longer. Publishers wait while
        either holds."""
        if holding:
            self._holding.add(why)
        else:
            self._holding.discard(why)
        self.backed_up = bool(self._holding)
        if not self.backed_up:
            waiters, self.flow_waiters = self.flow_waiters, set()
            for waiter in waiters:
                waiter.unblocked(self)

    def released(self) -> None:
        """The link to the owner's shard is lost (whose holds they were): nothing holds its publishers."""
        self._holding.clear()
        self.held(False)

    # -- consumers ---------------------------------------------------------------

    def accept_consumer(self, no_ack: bool, prefetch_count: int, exclusive: bool, arguments: dict) -> int:
        """The arguments are checked here (a stream's as its owner checks
        them, so the client hears the same refusal); exclusivity at the
        owner, which refuses the consumer in its answer (`add_consumer`)."""
        if self.kind == STREAM:
            check_consume(self.name, self.vhost, no_ack, prefetch_count, arguments)
            return 0
        return consumer_priority(self.vhost, self.name, arguments)

    def add_consumer(self, consumer: "Consumer",
                     answered: Callable[[AMQPError | None], None] | None = None) -> None:
        """answered(None, or the owner's refusal) once the owner answered, before any
        delivery to it; without `answered` a refusal cancels the consumer (basic.cancel)."""
        self.consumers[consumer.tag] = consumer
        self.pending[consumer.tag] = deque()
        if answered is not None:
            self.subscribing[consumer.tag] = answered
        self.port.consume(self, consumer)

    def consume_answered(self, tag: str, error: AMQPError | None) -> None:
        """The owner accepted the consumer `tag` (error None) or refused it."""
        answered = self.subscribing.pop(tag, None)
        if error is None:
            if answered is not None:
                answered(None)
            return
        consumer = self.consumers.pop(tag, None)
        self.pending.pop(tag, None)
        if answered is not None:
            answered(error)
        elif consumer is not None:
            consumer.channel.consumer_cancelled(consumer)

    def qos(self, consumer: "Consumer", global_prefetch: int) -> None:
        """The channel of `consumer` changed its global prefetch."""
        if consumer.tag in self.consumers:
            self.port.qos(self, consumer, global_prefetch)

    def remove_consumer(self, consumer: "Consumer") -> bool:
        """Forget it at once (its channel closes). Auto-delete is the owner's to decide."""
        tag = consumer.tag
        if self.consumers.pop(tag, None) is None:
            return False
        left = self.pending.pop(tag, ())
        if left:
            self.port.settle(self, list(left), "requeue")
        self.port.cancel(self, consumer)
        # A consume or cancel still waiting for the owner ends with the channel (which
        # answers nothing more: it no longer holds the consumer).
        for waiting in (self.subscribing.pop(tag, None), self.cancelling.pop(tag, None)):
            if waiting is not None:
                waiting(None)
        return False

    def cancel_consumer(self, consumer: "Consumer", done: Callable[[AMQPError | None], None]) -> None:
        """basic.cancel: done(None) once the owner stopped the consumer, every
        no-ack delivery it sent before delivered (see the opening comment)."""
        tag = consumer.tag
        if tag not in self.consumers:
            done(None)
            return
        self.cancelling[tag] = done
        waiting = self.pending[tag]
        back = [entry for entry in waiting if entry.seq]
        if back:
            self.pending[tag] = deque(entry for entry in waiting if not entry.seq)
            self.port.settle(self, back, "requeue")
        self.port.cancel(self, consumer, answered=True)

    def received(self, tag: str, entry: RemoteEntry) -> None:
        """A delivery from the owner to the local consumer `tag`."""
        waiting = self.pending.get(tag)
        if waiting is None or (entry.seq and tag in self.cancelling):  # cancelled meanwhile: back to the owner
            self.port.settle(self, [entry], "requeue")
            return
        consumer = self.consumers[tag]
        channel = consumer.channel
        if not waiting and channel.can_deliver(consumer):
            channel.deliver(consumer, self, entry)
        else:
            waiting.append(entry)

    def dispatch(self, now: int = 0) -> None:
        for tag, waiting in self.pending.items():
            consumer = self.consumers[tag]
            channel = consumer.channel
            while waiting and channel.can_deliver(consumer):
                channel.deliver(consumer, self, waiting.popleft())

    def owner_cancelled(self, tag: str) -> None:
        """The owner ended the consumer (queue deleted, shard gone), or answered its cancel."""
        consumer = self.consumers.pop(tag, None)
        left = self.pending.pop(tag, ())
        done = self.cancelling.pop(tag, None)
        if done is not None:
            for entry in left:  # no-ack ones only (cancel_consumer), each due before the answer
                consumer.channel.deliver(consumer, self, entry)
            done(None)
            return
        answered = self.subscribing.pop(tag, None)
        if answered is not None:
            answered(owner_down(self))
        elif consumer is not None:
            consumer.channel.consumer_cancelled(consumer)

    # -- basic.get -------------------------------------------------------------

    def get(self) -> QueueEntry | None:
        if self.kind == STREAM:  # refused here as its owner refuses it
            raise not_supported("basic.get", self.name, self.vhost)
        fetched = self._fetched
        if fetched is None:
            self._fetched = True
            self.message_count = max(self.message_count, 1)  # the channel waits (when_available)
            self.port.fetch(self)
            return None
        if fetched is True:
            return None
        self._fetched = None
        if fetched is False:
            self.message_count = 0
            return None
        return fetched

    def when_available(self, callback: Callable[[], None]) -> None:
        self._get_waiters.append(callback)

    def not_wanted(self) -> None:
        """A channel that waited for the fetch closed: the entry goes back to the
        owner unless another waiter took it (redelivered, as a closing channel's
        unacked message goes back)."""
        fetched = self._fetched
        if isinstance(fetched, RemoteEntry):
            self._fetched = None
            self.port.settle(self, [fetched], "requeue")

    def fetched(self, entry: RemoteEntry | None, message_count: int) -> None:
        self._fetched = entry if entry is not None else False
        self.message_count = message_count
        waiters, self._get_waiters = self._get_waiters, []
        for callback in waiters:
            callback()

    # -- settlement --------------------------------------------------------------

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        self.port.settle(self, list(entries), "ack")

    def reject(self, entries: list[QueueEntry]) -> None:
        self.port.settle(self, list(entries), "reject")

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        self.port.settle(self, list(entries), "requeue")

    def check_return(self) -> None:
        """Only a stream refuses returns (as its owner does)."""
        if self.kind == STREAM:
            raise not_supported("basic.nack and basic.reject", self.name, self.vhost)

    def check_purge(self) -> None:
        """queue.purge, before it travels to the owner: a stream refuses it (as its owner does)."""
        if self.kind == STREAM:
            raise not_supported("queue.purge", self.name, self.vhost)

    def read_log(self, start: int, limit: int, done, max_bytes: int) -> None:
        raise AMQPError(PRECONDITION_FAILED, "queue '%s' in vhost '%s' is not a stream" % (self.name, self.vhost))

    # -- declarations and their end ---------------------------------------------

    def touch(self) -> None:
        """x-expires is the owner's."""

    def apply_policy(self, definition: dict | None) -> None:
        self.policy = definition

    def purge(self) -> int:
        """A purge made here at once (the management API's): the AMQP face
        purges through the port instead (amqp_server.amqp.declarations)."""
        raise AMQPError(PRECONDITION_FAILED, "queue '%s' in vhost '%s' lives on shard %d: purge it there"
                        % (self.name, self.vhost, self.shard))

    @property
    def delete_ok_count(self) -> int:
        return self.message_count

    def delete(self) -> list:
        """The owner deletes its queue; here, the local consumers are told. A consume
        still waiting for the owner is answered as a consume of a missing queue, and a
        cancel waiting for it ends: neither hears a basic.cancel."""
        self.deleted = True
        subscribing, self.subscribing = self.subscribing, {}
        cancelling, self.cancelling = self.cancelling, {}
        consumers = [consumer for tag, consumer in self.consumers.items()
                     if tag not in subscribing and tag not in cancelling]
        self.consumers.clear()
        self.pending.clear()
        self.fetched(None, 0)
        for answered in subscribing.values():
            answered(AMQPError(NOT_FOUND, "no queue '%s' in vhost '%s'" % (self.name, self.vhost)))
        for done in cancelling.values():
            done(None)
        return consumers
