"""The backing queue of a priority queue (`x-max-priority`): one backing queue
per priority level, as RabbitMQ's rabbit_priority_queue composes them.

Theory of operation:
- A message of priority p (its `priority` property; absent = 0) lives in
  level min(p, top), `levels[i]` holding priority i; each level is a complete
  backing queue (its own seqs, index directory, paging and recovery), so
  everything a level guarantees (durability, FIFO order, requeue to the
  original place) holds per priority.
- `fetch` serves the highest non-empty level. While that level reads its
  head back from disk it returns None, even if a lower level has messages in
  RAM: order by priority is never given up; the level's `on_available`
  resumes consumers.
- An entry knows its level from its message's priority, so `ack` and
  `requeue` send each entry back to the level that issued it.
- Invariant: `ready` and `ready_bytes` are the sums over the levels (kept
  incrementally; recounted when a level reports read-back messages, since a
  level may drop a message whose body was lost while reading it, and after
  expiry takes messages out).
- Expiry: each level tracks the expiries of its own paged-out messages.
  `disk_due` answers with the lowest first-seq-on-disk of the levels where a
  message may have expired: seqs of different levels are not comparable, so
  the queue may hold back an expired message in RAM of another level until
  the scan is over (it then expires, late by at most one scan), never the
  other way round.
"""
from __future__ import annotations

from typing import Callable, Iterable

from storage.backing_queue import BackingQueue, QueueEntry
from storage.message import Message, priority


def level_name(queue: str, level: int) -> str:
    """The storage name of one level of a priority queue (its index directory)."""
    return "%s\x00priority-%d" % (queue, level)


class PriorityQueue:
    __slots__ = ("levels", "_descending", "_top", "ready", "ready_bytes", "on_available", "on_loaded")

    def __init__(self, levels: list[BackingQueue]) -> None:
        self.levels = levels
        self._top = len(levels) - 1
        self._descending = levels[::-1]
        self.on_available: Callable[[], None] | None = None
        self.on_loaded: Callable[[list[QueueEntry]], None] | None = None
        for level in levels:
            level.on_available = self._available
            level.on_loaded = self._loaded
        self._recount()

    def _recount(self) -> None:
        self.ready = sum(level.ready for level in self.levels)
        self.ready_bytes = sum(level.ready_bytes for level in self.levels)

    def _available(self) -> None:
        self._recount()
        if self.on_available is not None:
            self.on_available()

    def _loaded(self, entries: list[QueueEntry]) -> None:
        if self.on_loaded is not None:
            self.on_loaded(entries)

    def _level(self, message: Message) -> BackingQueue:
        return self.levels[min(priority(message.header), self._top)]

    def _by_level(self, entries: Iterable[QueueEntry]) -> dict:
        grouped: dict = {}
        for entry in entries:
            grouped.setdefault(self._level(entry.message), []).append(entry)
        return grouped

    # -- BackingQueue ------------------------------------------------------------

    def persists(self, message: Message) -> bool:
        return self.levels[0].persists(message)

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None,
                expiry: int = 0) -> QueueEntry:
        entry = self._level(message).publish(message, on_durable, expiry)
        self.ready += 1
        self.ready_bytes += len(message.body)
        return entry

    def publish_delivered(self, message: Message, on_durable: Callable[[], None] | None = None) -> QueueEntry:
        return self._level(message).publish_delivered(message, on_durable)

    def fetch(self) -> QueueEntry | None:
        for level in self._descending:
            if level.ready:
                entry = level.fetch()
                if entry is not None:
                    self.ready -= 1
                    self.ready_bytes -= len(entry.message.body)
                return entry
        return None

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        for level, batch in self._by_level(entries).items():
            level.ack(batch)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for level, batch in self._by_level(entries).items():
            level.requeue(batch)
            self.ready += len(batch)
            self.ready_bytes += sum(len(entry.message.body) for entry in batch)

    def remove(self, entries: Iterable[QueueEntry]) -> list[QueueEntry]:
        removed = []
        for level, batch in self._by_level(entries).items():
            removed += level.remove(batch)
        self._recount()
        return removed

    @property
    def delta_expiry(self) -> int:
        return min((at for at in (level.delta_expiry for level in self.levels) if at), default=0)

    def disk_due(self, now: int) -> int:
        return min((seq for seq in (level.disk_due(now) for level in self.levels) if seq >= 0), default=-1)

    def expire_delta(self, now: int, done: Callable[[list[QueueEntry]], None]) -> None:
        def expired(entries: list[QueueEntry]) -> None:
            self._recount()
            done(entries)

        for level in self.levels:
            at = level.delta_expiry
            if at and at <= now:
                level.expire_delta(now, expired)
        self._recount()  # a scan takes its messages out of the ready counts at once

    def purge(self) -> int:
        count = sum(level.purge() for level in self.levels)
        self._recount()
        return count

    def delete(self) -> None:
        for level in self.levels:
            level.delete()
        self._recount()

    def peek(self, count: int, done) -> None:
        """Level by level from the top, each level's entries in its order."""
        found: list[QueueEntry] = []
        pending = [level for level in self._descending if level.ready]

        def step(result) -> None:
            if isinstance(result, Exception):
                done(result)
                return
            found.extend(result)
            if pending and len(found) < count:
                pending.pop(0).peek(count - len(found), step)
            else:
                done(found)

        step([])

    def state_counts(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for level in self.levels:
            for state, count in level.state_counts().items():
                totals[state] = totals.get(state, 0) + count
        return totals
