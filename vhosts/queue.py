"""A queue: ready messages (in its backing queue), consumers and dispatch.

Theory of operation:
- Ready messages live in `backing` (a `storage.BackingQueue`); a delivered
  message leaves the ready set and is owned by the channel that received it
  until that channel acks (`ack`) or gives it back (`requeue`).
- `dispatch` hands ready messages to consumers round-robin: the consumer list
  is a deque rotated one step per delivery, and a consumer whose channel says
  it cannot take more (prefetch, flow, a paused socket) is skipped. Dispatch
  stops when no consumer can take a message; whoever frees capacity (an ack,
  a resumed socket, a new consumer) calls `dispatch` again.
- Invariant: at most one consumer when `exclusive_consumer` is set.
- Credit flow (RabbitMQ's idea, simplified): when more than FLOW_HIGH messages
  are ready and a consumer is held back only by its connection's output (a
  full socket, a long write list), the queue cannot keep up, so `publish`
  tells the caller to stop reading from the publisher; the publisher waits in
  `flow_waiters` until the backlog falls under FLOW_LOW or no consumer is
  output-bound any more (then the queue is idle as far as RabbitMQ's rule
  goes: consumers at their prefetch limit never throttle publishers).
- TTL (docs/queue-semantics.md): a message gets its expiry when it is
  enqueued (the smaller of the queue's message TTL and its expiration);
  `expiry` (vhosts.message_expiry) holds one timer for the whole queue and
  removes an expired message wherever it is. Dispatch and get first expire
  what is due, so an expired message is never delivered.
- Length limits: with drop-head the queue is trimmed from the head after a
  publish; with reject-publish(-dlx) a publish that would exceed a limit is
  refused (`REJECTED`: the publisher gets a nack).
- Every message that dies (rejected without requeue, expired, dropped by a
  length limit, past its delivery limit) leaves the ready set and goes to
  the vhost's `dead_letter`, which acks it here once every dead-letter
  target holds it (at-least-once; see vhosts.vhost).
- Delivery counting: each return (requeue) of a delivered message counts;
  past `delivery_limit` returns it dies instead (reason delivery_limit).
- Queue expiry (x-expires): while the queue has no consumers, one timer
  deletes it after `expires` ms without a get or a redeclare.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from storage import BackingQueue, Message, QueueEntry
from storage.backing_queue import READY
from vhosts.clock import Clock, LoopClock
from vhosts.consumer import Consumer
from vhosts.message_expiry import MessageExpiry
from vhosts.queue_arguments import QueueSettings, effective
from vhosts.stats import MessageStats

FLOW_HIGH = 2000
FLOW_LOW = 1000

# What `Queue.publish` did with a message.
ACCEPTED, DURABLE_PENDING, REJECTED = 0, 1, 2
# Why a message died (x-death reasons).
REJECTED_REASON, EXPIRED, MAXLEN, DELIVERY_LIMIT = "rejected", "expired", "maxlen", "delivery_limit"


class Queue:
    __slots__ = (
        "name",
        "vhost",
        "durable",
        "exclusive_owner",
        "auto_delete",
        "arguments",
        "backing",
        "consumers",
        "exclusive_consumer",
        "had_consumers",
        "deleted",
        "flow_waiters",
        "get_waiters",
        "stats",
        "settings",
        "policy",
        "host",
        "clock",
        "expiry",
        "_unused_timer",
    )

    def __init__(
        self,
        name: str,
        vhost: str,
        backing: BackingQueue,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict | None = None,
        host=None,
        clock: Clock | None = None,
        policy: dict | None = None,
    ) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        # The connection that declared an exclusive queue; None otherwise.
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.backing = backing
        self.consumers: deque[Consumer] = deque()
        self.exclusive_consumer = False
        self.had_consumers = False
        self.deleted = False
        # Publishers (objects with `unblocked(source)`) waiting on credit flow.
        self.flow_waiters: set = set()
        # basic.get calls waiting for messages the backing queue reads back from disk.
        self.get_waiters: list = []
        self.stats = MessageStats()
        backing.on_available = self._available
        backing.on_loaded = self._loaded
        # The vhost: `dead_letter(queue, entries, reason)` and
        # `queue_expired(queue)`; None (unit tests) drops dead messages.
        self.host = host
        self.clock = clock or LoopClock()
        self.expiry = MessageExpiry(self.clock, self.expire, lambda: self.backing.delta_expiry)
        self._unused_timer = None
        self.policy = policy
        self.settings: QueueSettings = effective(self.arguments, policy)
        self._arm_unused()
        if backing.delta_expiry:  # recovered messages with an expiry wait on disk
            self.expiry.arm()

    @property
    def message_count(self) -> int:
        return self.backing.ready

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> int:
        """Enqueue and dispatch. DURABLE_PENDING when `on_durable` was taken:
        it will be called once the message is on disk (persistent message,
        durable queue); REJECTED when a length limit refused it."""
        self.stats.publish += 1
        settings = self.settings
        expiry = 0
        if settings.message_ttl is not None or message.has_expiration:
            expiry = self._expiry_of(message)
        if settings.length_limited and settings.overflow != "drop-head" and self._would_overflow(message):
            if settings.overflow == "reject-publish-dlx":
                self._die([QueueEntry(-1, message)], MAXLEN)
            return REJECTED
        waits = on_durable is not None and self.backing.persists(message)
        entry = self.backing.publish(message, on_durable if waits else None, expiry)
        if expiry:
            self.expiry.track(entry)
        if self.consumers:
            self.dispatch()
        if settings.length_limited:
            self._drop_head()
        if expiry and entry.state == READY and expiry <= self.clock.now():
            self.expire()  # TTL 0: delivered at once or never
        return DURABLE_PENDING if waits else ACCEPTED

    def _expiry_of(self, message: Message) -> int:
        ttl = self.settings.message_ttl
        if message.has_expiration:
            expiration = message.expiration
            ttl = expiration if ttl is None else min(ttl, expiration)
        return self.clock.now() + ttl

    def _would_overflow(self, message: Message) -> bool:
        settings = self.settings
        backing = self.backing
        return ((settings.max_length is not None and backing.ready + 1 > settings.max_length)
                or (settings.max_length_bytes is not None
                    and backing.ready_bytes + len(message.body) > settings.max_length_bytes))

    def _over_limit(self) -> bool:
        settings = self.settings
        backing = self.backing
        return ((settings.max_length is not None and backing.ready > settings.max_length)
                or (settings.max_length_bytes is not None and backing.ready_bytes > settings.max_length_bytes))

    def _drop_head(self) -> None:
        """drop-head: dead-letter from the head while over a limit (a head
        being read back from disk is dropped once it is in RAM)."""
        if self.settings.overflow != "drop-head":
            return
        dropped = []
        while self._over_limit():
            entry = self.backing.fetch()
            if entry is None:
                break
            dropped.append(entry)
        if dropped:
            self._die(dropped, MAXLEN)

    def expire(self) -> None:
        """Dead-letter every ready message whose expiry has come (the timer's
        callback, and before any delivery), then re-arm the timer."""
        if self.deleted:
            return
        expiry = self.expiry
        now = self.clock.now()
        due = expiry.due(now)
        if due:
            self._die(self.backing.remove(due), EXPIRED)
        at = self.backing.delta_expiry
        if at and at <= now:
            self.backing.expire_delta(now, self._expired_on_disk)
        expiry.arm()

    def _expired_on_disk(self, entries: list[QueueEntry]) -> None:
        """`expire_delta` found these expired among the paged-out messages."""
        if not self.deleted:
            if entries:
                self._die(entries, EXPIRED)
            self.expiry.arm()
        else:
            self.backing.ack(entries)

    def _die(self, entries: list[QueueEntry], reason: str) -> None:
        """Entries out of the ready set die: the vhost dead-letters them and
        acks them here; without a vhost they are just acked."""
        if self.host is None:
            self.backing.ack(entries)
        else:
            self.host.dead_letter(self, entries, reason)

    def _loaded(self, entries: list[QueueEntry]) -> None:
        """Entries read back from disk: their expiries are watched again."""
        track = self.expiry.track
        for entry in entries:
            if entry.expiry:
                track(entry)

    @property
    def backed_up(self) -> bool:
        """Credit flow: the publisher should wait (see the module docstring)."""
        return bool(self.consumers) and self.backing.ready > FLOW_HIGH and self._output_bound()

    def _output_bound(self) -> bool:
        return any(c.channel.output_blocked for c in self.consumers)

    def dispatch(self) -> None:
        consumers = self.consumers
        backing = self.backing
        if len(self.expiry):
            self._expire_due()
        while backing.ready and consumers:
            for _ in range(len(consumers)):
                consumer = consumers[0]
                consumers.rotate(-1)
                if consumer.channel.can_deliver(consumer):
                    break
            else:
                break
            entry = backing.fetch()
            if entry is None:
                break  # the head is being read back from disk: `_available` resumes
            consumer.channel.deliver(consumer, self, entry)
        if self.flow_waiters and (backing.ready < FLOW_LOW or not self._output_bound()):
            self.release_waiters()

    def release_waiters(self) -> None:
        waiters = self.flow_waiters
        self.flow_waiters = set()
        for waiter in waiters:
            waiter.unblocked(self)

    def _expire_due(self) -> None:
        """Before a delivery: expire what is past due. A message whose expiry
        is this very millisecond (TTL 0) may still go to a waiting consumer."""
        at = self.expiry.next_expiry()
        if at and at < self.clock.now():
            self.expire()

    def get(self) -> QueueEntry | None:
        """The head message, or None: the queue is empty, or (when
        `message_count` is still positive) its head is being read back from
        disk, and `when_available` calls back once it is in RAM."""
        self.touch()
        if len(self.expiry):
            self._expire_due()
        return self.backing.fetch()

    def when_available(self, callback: Callable[[], None]) -> None:
        self.get_waiters.append(callback)

    def _available(self) -> None:
        if self.settings.length_limited:
            self._drop_head()
        waiters, self.get_waiters = self.get_waiters, []
        for callback in waiters:
            callback()
        self.dispatch()

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        """Also after deletion: the backing queue releases what it stored."""
        self.backing.ack(entries)

    def reject(self, entries: list[QueueEntry]) -> None:
        """Delivered entries rejected or nacked without requeue: they die
        (a deleted queue just lets them go)."""
        if self.deleted:
            self.backing.ack(entries)
        else:
            self._die(entries, REJECTED_REASON)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """Give delivered entries back; they return to their original place
        (a deleted queue just lets them go). Each return counts; one past the
        delivery limit dead-letters the entry instead."""
        if self.deleted:
            self.backing.ack(entries)
            return
        limit = self.settings.delivery_limit
        back = []
        spent = []
        for entry in entries:
            entry.deliveries += 1
            (spent if limit is not None and entry.deliveries > limit else back).append(entry)
        self.backing.requeue(back)
        for entry in back:
            if entry.expiry:
                self.expiry.track(entry)
        if spent:
            self._die(spent, DELIVERY_LIMIT)
        if self.settings.length_limited:
            self._drop_head()
        if self.consumers:
            self.dispatch()
        elif len(self.expiry):
            self._expire_due()

    def add_consumer(self, consumer: Consumer) -> None:
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        self.consumers.append(consumer)
        self.exclusive_consumer = consumer.exclusive
        self.had_consumers = True
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> bool:
        """Remove it; True when the queue should now be auto-deleted."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return False
        if consumer.exclusive:
            self.exclusive_consumer = False
        if self.flow_waiters and not self._output_bound():
            self.release_waiters()
        if not self.consumers:
            self._arm_unused()
        return self.auto_delete and not self.consumers and self.had_consumers

    # -- queue expiry (x-expires) ------------------------------------------------

    def touch(self) -> None:
        """A redeclare or a basic.get: the queue was used (x-expires restarts)."""
        if self._unused_timer is not None:
            self._arm_unused()

    def _arm_unused(self) -> None:
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        expires = self.settings.expires
        if expires is not None and not self.consumers and not self.deleted and self.host is not None:
            self._unused_timer = self.clock.call_later(expires, self._unused_expired)

    def _unused_expired(self) -> None:
        self._unused_timer = None
        if not self.consumers and not self.deleted:
            self.host.queue_expired(self)

    # -- policies ------------------------------------------------------------------

    def apply_policy(self, definition: dict | None) -> None:
        """A policy (a RabbitMQ policy definition) now applies to this queue,
        or none does (None): recompute the settings and act on them at once
        (a lower max-length trims, a new x-expires restarts its timer).
        Messages already queued keep the expiry they were given."""
        self.policy = definition
        old = self.settings
        self.settings = effective(self.arguments, definition)
        if self.settings.expires != old.expires:
            self._arm_unused()
        if self.settings.length_limited:
            self._drop_head()

    # -- purge and delete --------------------------------------------------------

    def purge(self) -> int:
        count = self.backing.purge()
        self.expiry.clear()
        return count

    def delete(self) -> list[Consumer]:
        """Drop every ready message; returns the consumers to notify."""
        self.deleted = True
        self.expiry.clear()
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        self.backing.delete()
        self.release_waiters()
        consumers = list(self.consumers)
        self.consumers.clear()
        return consumers
