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
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from storage import BackingQueue, Message, QueueEntry
from vhosts.consumer import Consumer
from vhosts.stats import MessageStats

FLOW_HIGH = 2000
FLOW_LOW = 1000


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

    @property
    def message_count(self) -> int:
        return self.backing.ready

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> bool:
        """Enqueue and dispatch. True when `on_durable` was taken: it will be
        called once the message is on disk (persistent message, durable queue)."""
        self.stats.publish += 1
        waits = on_durable is not None and self.backing.persists(message)
        self.backing.publish(message, on_durable if waits else None)
        if self.consumers:
            self.dispatch()
        return waits

    @property
    def backed_up(self) -> bool:
        """Credit flow: the publisher should wait (see the module docstring)."""
        return bool(self.consumers) and self.backing.ready > FLOW_HIGH and self._output_bound()

    def _output_bound(self) -> bool:
        return any(c.channel.output_blocked for c in self.consumers)

    def dispatch(self) -> None:
        consumers = self.consumers
        backing = self.backing
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

    def get(self) -> QueueEntry | None:
        """The head message, or None: the queue is empty, or (when
        `message_count` is still positive) its head is being read back from
        disk, and `when_available` calls back once it is in RAM."""
        return self.backing.fetch()

    def when_available(self, callback: Callable[[], None]) -> None:
        self.get_waiters.append(callback)

    def _available(self) -> None:
        waiters, self.get_waiters = self.get_waiters, []
        for callback in waiters:
            callback()
        self.dispatch()

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        """Also after deletion: the backing queue releases what it stored."""
        self.backing.ack(entries)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        """Give delivered entries back; they return to their original place
        (a deleted queue just lets them go)."""
        if self.deleted:
            self.backing.ack(entries)
            return
        self.backing.requeue(entries)
        if self.consumers:
            self.dispatch()

    def add_consumer(self, consumer: Consumer) -> None:
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
        return self.auto_delete and not self.consumers and self.had_consumers

    def purge(self) -> int:
        return self.backing.purge()

    def delete(self) -> list[Consumer]:
        """Drop every ready message; returns the consumers to notify."""
        self.deleted = True
        self.backing.delete()
        self.release_waiters()
        consumers = list(self.consumers)
        self.consumers.clear()
        return consumers
