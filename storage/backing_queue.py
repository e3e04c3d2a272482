"""The interface between a queue (`vhosts.queue`) and where its messages live.

A queue owns ordering decisions only through this interface:
- `publish` appends at the tail and returns the entry; when the backing queue
  keeps the message durably (`persists(message)`), `on_durable` is called on
  the event loop once it is on disk, and a publisher confirm waits for that;
- `fetch` removes the head *ready* entry (it becomes "unacked" until `ack` or
  `requeue`);
- `requeue` returns fetched entries to the ready set at their original place:
  ready entries are always served in ascending `seq` order;
- `peek` reads the first ready entries without changing anything.
- `remove` takes given ready entries out of the ready set wherever they are
  (an expired message in the middle of the queue); like fetched entries they
  then wait for `ack`. `entry.state` says where an entry is: READY (a ready
  entry in RAM), OUT (fetched or removed), or PAGED (its message went to
  disk: this object is no longer the queue's, the seq is served from disk).
Counts (`ready`, `ready_bytes`) cover ready entries only, as RabbitMQ's
`messages_ready`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

from storage.message import Message


READY, OUT, PAGED = 0, 1, 2


class QueueEntry:
    """One message's place in one queue (a message routed to three queues has
    three entries sharing one `Message`)."""

    __slots__ = ("seq", "message", "redelivered", "store", "expiry", "deliveries", "state")

    def __init__(self, seq: int, message: Message, expiry: int = 0) -> None:
        self.seq = seq
        self.message = message
        self.redelivered = False
        # Where the message is on disk, for backing queues that write it
        # (None: only in RAM).
        self.store = None
        # When it expires, in ms since the epoch (0: never).
        self.expiry = expiry
        # How many times it was given back after a delivery (x-delivery-count).
        self.deliveries = 0
        self.state = READY

    def __lt__(self, other: "QueueEntry") -> bool:
        return self.seq < other.seq


class BackingQueue(Protocol):
    ready: int
    ready_bytes: int
    # Set by the queue: called when messages read back from disk are ready
    # (`fetch` returns None meanwhile although `ready` is positive).
    on_available: Callable[[], None] | None
    # Set by the queue: called with the entries read back from disk (their
    # expiry comes from the index), before `on_available`.
    on_loaded: Callable[[list[QueueEntry]], None] | None

    def persists(self, message: Message) -> bool: ...

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None,
                expiry: int = 0) -> QueueEntry: ...

    def publish_delivered(self, message: Message, on_durable: Callable[[], None] | None = None) -> QueueEntry:
        """`publish` and `fetch` of that message in one step, for one that
        goes to a consumer at once while nothing is ready (so it overtakes
        nothing): the entry comes back taken, never having been ready
        (RabbitMQ's publish_delivered)."""

    def fetch(self) -> QueueEntry | None: ...

    def ack(self, entries: Iterable[QueueEntry]) -> None: ...

    def requeue(self, entries: Iterable[QueueEntry]) -> None: ...

    def remove(self, entries: Iterable[QueueEntry]) -> list[QueueEntry]: ...

    # Expiry of messages paged out to disk (storage.variable_queue): when the
    # next may expire (0: none), the first seq on disk when one may have
    # expired by `now` (else -1), and the scan that takes them out.
    delta_expiry: int

    def disk_due(self, now: int) -> int: ...

    def expire_delta(self, now: int, done: Callable[[list[QueueEntry]], None]) -> None: ...

    def purge(self) -> int: ...

    def state_counts(self) -> dict[str, int]: ...

    def peek(self, count: int, done: Callable[[list[QueueEntry] | Exception], None]) -> None:
        """The first `count` ready entries in delivery order, without taking
        them: `done(list)` (on the loop; entries read back from disk are
        copies, the others the queue's own, to be treated as read-only), or
        `done(exception)` when a read failed."""

    def delete(self) -> None: ...
