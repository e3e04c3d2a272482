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
Counts (`ready`, `ready_bytes`) cover ready entries only, as RabbitMQ's
`messages_ready`.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

from storage.message import Message


class QueueEntry:
    """One message's place in one queue (a message routed to three queues has
    three entries sharing one `Message`)."""

    __slots__ = ("seq", "message", "redelivered", "store")

    def __init__(self, seq: int, message: Message) -> None:
        self.seq = seq
        self.message = message
        self.redelivered = False
        # Where the message is on disk, for backing queues that write it
        # (None: only in RAM).
        self.store = None

    def __lt__(self, other: "QueueEntry") -> bool:
        return self.seq < other.seq


class BackingQueue(Protocol):
    ready: int
    ready_bytes: int
    # Set by the queue: called when messages read back from disk are ready
    # (`fetch` returns None meanwhile although `ready` is positive).
    on_available: Callable[[], None] | None

    def persists(self, message: Message) -> bool: ...

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> QueueEntry: ...

    def fetch(self) -> QueueEntry | None: ...

    def ack(self, entries: Iterable[QueueEntry]) -> None: ...

    def requeue(self, entries: Iterable[QueueEntry]) -> None: ...

    def purge(self) -> int: ...

    def state_counts(self) -> dict[str, int]: ...

    def peek(self, count: int, done: Callable[[list[QueueEntry] | Exception], None]) -> None:
        """The first `count` ready entries in delivery order, without taking
        them: `done(list)` (on the loop; entries read back from disk are
        copies, the others the queue's own, to be treated as read-only), or
        `done(exception)` when a read failed."""

    def delete(self) -> None: ...
