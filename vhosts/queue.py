"""A queue: ready messages (in its backing queue), consumers and dispatch.

Theory of operation:
- Ready messages live in `backing` (a `storage.BackingQueue`); a delivered
  message leaves the ready set and is owned by the channel that received it
  until that channel acks (`ack`) or gives it back (`requeue`).
- `dispatch` hands ready messages to consumers; `_pick` chooses the next
  consumer that can take one (a consumer whose channel says it cannot take
  more -- prefetch, flow, a paused socket -- is skipped), and dispatch stops
  when there is none; whoever frees capacity (an ack, a resumed socket, a new
  consumer) calls `dispatch` again. `_pick` is one of:
  - `_round_robin` (all consumers of equal priority, the common case): the
    deque is rotated one step per consumer looked at;
  - `_by_priority` (consumer priorities, `x-priority`): the first consumer in
    order that can take a message gets it and moves to the back of its
    priority group, so equals share round-robin and a lower-priority consumer
    gets a message only when every higher one is blocked;
  - `_single_active` (`x-single-active-consumer`): only `active` receives;
    when it goes, the highest-priority, longest-registered one takes over
    from the next dispatch on.
- Invariants: `consumers` is ordered by descending priority (registration
  order within a priority, up to rotation); at most one consumer when
  `exclusive_consumer` is set; `active` is set iff the queue is
  single-active-consumer and has consumers.
- Credit flow (RabbitMQ's idea, simplified), two rules; a publisher that
  routes into a queue where one holds waits in `flow_waiters` (`throttle`)
  until neither does (`_holding`):
  - output: more than FLOW_HIGH messages are ready and a consumer is held
    back only by its connection's output (a full socket, a long write
    list); it lets go under FLOW_LOW or when no consumer is output-bound.
  - pacing: a queue with consumers and more than PACE_ABOVE messages ready
    (about to page its backlog to disk, or paging) takes publishes against
    `_credit`, which its deliveries grant back one for one (between 0 and
    PACE_CREDIT: publishes that never wait, dead-lettering and moves, do
    not run it into debt): its publishers run at its consumers' pace, so the
    backlog stays in RAM instead of being written out and read back while
    the consumers starve for CPU (RabbitMQ gets this from its busy queue
    process). Publishers wait until PACE_RESUME credit is back. A consumer
    at its prefetch limit never blocks publishers for good: every
    PACE_INTERVAL ms that publishers wait, the queue grants PACE_FLOOR
    credit minus what it delivered meanwhile, so a stalled or slow
    consumer's queue still takes at least PACE_FLOOR per PACE_INTERVAL and
    pages (one timer per queue, only while publishers wait). A queue
    without consumers is never paced.
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
  deletes it after `expires` ms without a get or a declare (passive too).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from storage import BackingQueue, Message, QueueEntry
from storage.backing_queue import READY
from storage.message import EXPIRATION_BIT, EXPIRATION_BYTE
from vhosts.clock import Clock, LoopClock
from vhosts.consumer import Consumer
from vhosts.errors import ACCESS_REFUSED, PRECONDITION_FAILED, AMQPError
from vhosts.message_expiry import MessageExpiry
from vhosts.queue_arguments import QueueSettings, consumer_priority, effective
from vhosts.queue_types import queue_type
from vhosts.stats import MessageStats

FLOW_HIGH = 2000
FLOW_LOW = 1000
# Pacing (module docstring): above this many ready messages (half the RAM
# window of storage.variable_queue) publishes take credit; PACE_CREDIT more
# keeps the head within the window, so a paced queue does not page.
PACE_ABOVE = 1024
PACE_CREDIT = 800
PACE_RESUME = 200
# ms, and credit: the least a queue whose consumers do not keep up takes.
PACE_INTERVAL = 50
PACE_FLOOR = 500
# ms: how soon to look again at expired messages held back for a scan of the disk
# (the scan's end looks at once; this only covers a scan that takes longer).
HOLD_RETRY = 50

# What `Queue.publish` did with a message. HANDED_OFF: accepted and delivered at once (nothing
# ready in the queue, so it cannot be backed up).
ACCEPTED, DURABLE_PENDING, REJECTED, HANDED_OFF = 0, 1, 2, 3
# Why a message died (x-death reasons).
REJECTED_REASON, EXPIRED, MAXLEN, DELIVERY_LIMIT = "rejected", "expired", "maxlen", "delivery_limit"


class Queue:
    remote = False  # this shard owns it (vhosts.remote_queue.RemoteQueue: another does)
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
        "policy",
        "single_active",
        "kind",
        "active",
        "_pick",
        "stats",
        "settings",
        "host",
        "clock",
        "expiry",
        "_unused_timer",
        "_plain",
        "_credit",
        "_paced_deliveries",
        "_pace_timer",
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
        # Pacing: publishes still taken before publishers wait; deliveries
        # since the pacing timer was armed (or last fired); that timer.
        self._credit = PACE_CREDIT
        self._paced_deliveries = 0
        self._pace_timer = None
        # basic.get calls waiting for messages the backing queue reads back from disk.
        self.get_waiters: list = []
        self.single_active = self.arguments.get("x-single-active-consumer") is True
        self.kind = queue_type(self.arguments)  # classic or quorum (the management API shows it)
        self.active: Consumer | None = None
        self._pick = self._single_active if self.single_active else self._round_robin
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
        # No TTL and no length limit: publish takes the fast path.
        self._plain = self.settings.message_ttl is None and not self.settings.length_limited
        self._arm_unused()
        if backing.delta_expiry:  # recovered messages with an expiry wait on disk
            self.expiry.arm()

    @property
    def message_count(self) -> int:
        return self.backing.ready

    @property
    def delete_ok_count(self) -> int:
        """The message count of a queue.delete-ok: the messages dropped."""
        return self.backing.ready

    @property
    def size(self) -> int:
        """Body bytes of the ready messages."""
        return self.backing.ready_bytes

    def state_counts(self) -> dict[str, int]:
        return self.backing.state_counts()

    def peek(self, count: int, done: Callable[[list[QueueEntry] | Exception], None]) -> None:
        """The first `count` ready entries, left in place (BackingQueue.peek)."""
        self.backing.peek(count, done)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> int:
        """Enqueue and dispatch. DURABLE_PENDING when `on_durable` was taken:
        it will be called once the message is on disk (persistent message,
        durable queue); REJECTED when a length limit refused it."""
        self.stats.publish += 1
        if self._plain and not message.header[EXPIRATION_BYTE] & EXPIRATION_BIT:
            # The fast path: no TTL, no length limit.
            backing = self.backing
            persists = backing.persists(message)
            waits = on_durable is not None and persists
            if not waits:
                on_durable = None
            if self.consumers and not backing.ready and self._hand_off(message, persists, on_durable):
                return DURABLE_PENDING if waits else HANDED_OFF
            backing.publish(message, on_durable)
            if self.consumers:
                self.dispatch()
                if self.backing.ready > PACE_ABOVE and self._credit > 0:
                    self._credit -= 1
            return DURABLE_PENDING if waits else ACCEPTED
        settings = self.settings
        expiry = now = 0
        if settings.message_ttl is not None or message.has_expiration:
            now = self.clock.now()
            expiry = self._expiry_of(message, now)
        if settings.length_limited and settings.overflow != "drop-head" and self._over_limit(1, len(message.body)):
            if settings.overflow == "reject-publish-dlx":
                self._die([QueueEntry(-1, message)], MAXLEN)
            return REJECTED
        waits = on_durable is not None and self.backing.persists(message)
        entry = self.backing.publish(message, on_durable if waits else None, expiry)
        if expiry:
            self.expiry.track(entry)
        if self.consumers:
            # The time the expiry was computed from: a TTL-0 message goes to
            # a consumer that can take it even when the clock ticked meanwhile.
            self.dispatch(now)
            if self.backing.ready > PACE_ABOVE and self._credit > 0:
                self._credit -= 1
        if settings.length_limited:
            self._drop_head()
        if expiry and entry.state == READY and expiry <= self.clock.now():
            self.expire()  # TTL 0: delivered at once or never
        return DURABLE_PENDING if waits else ACCEPTED

    def _hand_off(self, message: Message, persists: bool, on_durable: Callable[[], None] | None) -> bool:
        """Direct hand-off: a message published to a queue with nothing ready (so nothing it
        would overtake) goes to the next consumer that can take it at once, as `dispatch` would
        have sent it. A no-ack consumer gets one that will not be written with no queue entry
        (`deliver_fresh`), so the backing queue does not see it at all; otherwise the backing
        queue makes the entry already taken (`publish_delivered`: written, and `on_durable`
        called once it is on disk, when it `persists`), which an acking consumer can requeue
        in order. False, having done nothing, when no consumer can take it now."""
        consumer = self._pick()
        if consumer is None:
            return False
        if consumer.no_ack and not persists:
            consumer.channel.deliver_fresh(consumer, self, message)
        else:
            consumer.channel.deliver(consumer, self, self.backing.publish_delivered(message, on_durable))
        self._paced_deliveries += 1
        if self._credit < PACE_CREDIT:
            self._credit += 1
        if self.flow_waiters and not self._holding():
            self.release_waiters()
        return True

    def _expiry_of(self, message: Message, now: int) -> int:
        ttl = self.settings.message_ttl
        if message.has_expiration:
            expiration = message.expiration
            ttl = expiration if ttl is None else min(ttl, expiration)
        return now + ttl

    def _over_limit(self, count: int = 0, size: int = 0) -> bool:
        """Whether the ready messages, plus `count` more of `size` bytes,
        exceed a length limit."""
        settings = self.settings
        backing = self.backing
        return ((settings.max_length is not None and backing.ready + count > settings.max_length)
                or (settings.max_length_bytes is not None
                    and backing.ready_bytes + size > settings.max_length_bytes))

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

    def expire(self, now: int = 0) -> None:
        """Dead-letter every ready message whose expiry has come (the timer's
        callback, and before any delivery), then re-arm the timer."""
        if self.deleted:
            return
        expiry = self.expiry
        backing = self.backing
        now = now or self.clock.now()
        due = expiry.due(now)
        later = 0
        if due:
            on_disk = backing.disk_due(now)
            if on_disk >= 0:
                # Expired messages wait on disk: older ones die first, so the
                # newer ones in RAM wait for the scan that finds them.
                held = [e for e in due if e.seq >= on_disk]
                if held:
                    due = [e for e in due if e.seq < on_disk]
                    expiry.defer(held)
                    later = max(backing.delta_expiry, now + HOLD_RETRY)
            if due:
                self._die(backing.remove(due), EXPIRED)
        at = backing.delta_expiry
        if at and at <= now:
            backing.expire_delta(now, self._expired_on_disk)
        expiry.arm(later)

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
        if not self.consumers:
            return False
        ready = self.backing.ready
        return ((ready > PACE_ABOVE and self._credit <= 0)
                or (ready > FLOW_HIGH and self._output_bound()))

    def _holding(self) -> bool:
        """Whether publishers that wait must keep waiting (`backed_up` with
        its low marks)."""
        if not self.consumers:
            return False
        ready = self.backing.ready
        return ((ready > PACE_ABOVE and self._credit < PACE_RESUME)
                or (ready >= FLOW_LOW and self._output_bound()))

    def throttle(self, publisher) -> None:
        """`publisher` (with `throttled_by` / `unblocked`) waits for this
        queue; while it is paced, the pacing timer guarantees progress."""
        self.flow_waiters.add(publisher)
        publisher.throttled_by(self)
        if self._pace_timer is None and self._credit <= 0:
            self._paced_deliveries = 0
            self._pace_timer = self.clock.call_later(PACE_INTERVAL, self._pace_tick)

    def _pace_tick(self) -> None:
        """PACE_INTERVAL ms of pacing: grant what the deliveries did not, up
        to PACE_FLOOR, and look again while publishers still wait."""
        self._pace_timer = None
        if not self.flow_waiters or self.deleted:
            return
        self._credit += max(0, PACE_FLOOR - self._paced_deliveries)
        self._paced_deliveries = 0
        if self._holding():
            self._pace_timer = self.clock.call_later(PACE_INTERVAL, self._pace_tick)
        else:
            self.release_waiters()

    def _output_bound(self) -> bool:
        return any(c.channel.output_blocked for c in self.consumers)

    def dispatch(self, now: int = 0) -> None:
        """Deliver to consumers that can take messages; `now` (ms, 0: read
        the clock) is the time expiry is judged at."""
        consumers = self.consumers
        backing = self.backing
        pick = self._pick
        if self.expiry.items:
            self._expire_due(now)
        delivered = 0
        while backing.ready and consumers:
            consumer = pick()
            if consumer is None:
                break
            entry = backing.fetch()
            if entry is None:
                break  # the head is being read back from disk: `_available` resumes
            consumer.channel.deliver(consumer, self, entry)
            delivered += 1
        if delivered:
            self._paced_deliveries += delivered
            self._credit = min(self._credit + delivered, PACE_CREDIT)
        if self.flow_waiters and not self._holding():
            self.release_waiters()

    def _round_robin(self) -> Consumer | None:
        consumers = self.consumers
        for _ in range(len(consumers)):
            consumer = consumers[0]
            consumers.rotate(-1)
            if consumer.channel.can_deliver(consumer):
                return consumer
        return None

    def _by_priority(self) -> Consumer | None:
        consumers = self.consumers
        for i, consumer in enumerate(consumers):
            if consumer.channel.can_deliver(consumer):
                del consumers[i]
                end = i
                while end < len(consumers) and consumers[end].priority == consumer.priority:
                    end += 1
                consumers.insert(end, consumer)
                return consumer
        return None

    def _single_active(self) -> Consumer | None:
        consumer = self.active
        if consumer is not None and consumer.channel.can_deliver(consumer):
            return consumer
        return None

    def release_waiters(self) -> None:
        waiters = self.flow_waiters
        self.flow_waiters = set()
        for waiter in waiters:
            waiter.unblocked(self)

    def _expire_due(self, now: int = 0) -> None:
        """Before a delivery: expire what is past due at `now` (0: the
        clock's time). A message whose expiry is this very millisecond (TTL
        0) may still go to a waiting consumer."""
        at = self.expiry.next_expiry()
        now = now or self.clock.now()
        if at and at < now:
            self.expire(now)

    def get(self) -> QueueEntry | None:
        """The head message, or None: the queue is empty, or (when
        `message_count` is still positive) its head is being read back from
        disk, and `when_available` calls back once it is in RAM."""
        if self._unused_timer is not None:
            self._arm_unused()  # used: x-expires starts again
        if self.expiry.items:
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
        elif self.expiry.items:
            self._expire_due()

    def accept_consumer(self, no_ack: bool, prefetch_count: int, exclusive: bool, arguments: dict) -> int:
        """Check a basic.consume (its arguments, then exclusivity); its priority (x-priority)."""
        priority = consumer_priority(self.vhost, self.name, arguments)
        if self.exclusive_consumer or (exclusive and (self.consumers or self.single_active)):
            raise AMQPError(ACCESS_REFUSED, "queue '%s' in vhost '%s' in exclusive use" % (self.name, self.vhost))
        return priority

    def read_log(self, start: int, limit: int, done, max_bytes: int) -> None:
        """Only a stream is read by offset."""
        raise AMQPError(PRECONDITION_FAILED, "queue '%s' in vhost '%s' is not a stream" % (self.name, self.vhost))

    def check_return(self) -> None:
        """A client's basic.nack or basic.reject: a classic queue takes it."""

    def add_consumer(self, consumer: Consumer) -> None:
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        consumers = self.consumers
        at = len(consumers)
        while at and consumers[at - 1].priority < consumer.priority:
            at -= 1
        consumers.insert(at, consumer)
        if self.single_active:
            if self.active is None:
                self.active = consumer
        elif consumers[0].priority != consumers[-1].priority:
            self._pick = self._by_priority
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
        if consumer is self.active:
            # The first of the highest priority: `consumers` is in that order.
            # It receives at the queue's next dispatch (a publish, an ack, a
            # requeue), not now: RabbitMQ 3.10 hands over the same way.
            self.active = self.consumers[0] if self.consumers else None
        elif not self.single_active and (not self.consumers
                                         or self.consumers[0].priority == self.consumers[-1].priority):
            self._pick = self._round_robin
        if self.flow_waiters and not self._holding():
            self.release_waiters()
        if not self.consumers:
            self._arm_unused()
        return self.auto_delete and not self.consumers and self.had_consumers

    # -- queue expiry (x-expires) ------------------------------------------------

    def touch(self) -> None:
        """A declare (passive too) or a basic.get: the queue was used (x-expires restarts)."""
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
        self._plain = self.settings.message_ttl is None and not self.settings.length_limited
        if self.settings.expires != old.expires:
            self._arm_unused()
        if self.settings.length_limited:
            self._drop_head()

    # -- purge and delete --------------------------------------------------------

    def purge(self) -> int:
        count = self.backing.purge()
        self.expiry.clear()
        if self.flow_waiters:
            self.release_waiters()
        return count

    def delete(self) -> list[Consumer]:
        """Drop every ready message; returns the consumers to notify."""
        self.deleted = True
        self.expiry.clear()
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        if self._pace_timer is not None:
            self._pace_timer.cancel()
            self._pace_timer = None
        self.backing.delete()
        self.release_waiters()
        consumers = list(self.consumers)
        self.consumers.clear()
        self.active = None
        self._available()  # whoever waits for a read back from disk sees the queue gone
        return consumers
