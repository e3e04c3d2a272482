"""A backing queue that keeps every message in RAM (transient queues).

Theory: entries are published with increasing `seq`, and `fetch` always takes
the lowest ready seq, so every fetched entry has a lower seq than every entry
still in `_tail`. Requeued entries therefore go in a small heap that is always
served before `_tail`, which restores their original order in O(log n) without
touching the tail.

`remove` (an expired message anywhere in the queue) marks the entry OUT and
fixes the counts at once, and leaves it where it is: `fetch` skips OUT
entries. `_removed` counts those left behind; once they are more than half of
what is held, the containers are rebuilt without them (amortised O(1)).
"""
from __future__ import annotations

import heapq
from collections import deque
from itertools import islice
from typing import Iterable

from storage.backing_queue import OUT, READY, QueueEntry
from storage.message import Message

COMPACT_ABOVE = 1024  # removed entries tolerated before a rebuild is considered


class MemoryQueue:
    __slots__ = ("_tail", "_requeued", "_next_seq", "_removed", "ready", "ready_bytes", "on_available",
                 "on_loaded")

    def __init__(self) -> None:
        self._tail: deque[QueueEntry] = deque()
        self._requeued: list[QueueEntry] = []
        self._next_seq = 0
        self._removed = 0
        self.ready = 0
        self.ready_bytes = 0
        # Never called: every message is always in RAM.
        self.on_available = None
        self.on_loaded = None

    def persists(self, message: Message) -> bool:
        """Nothing here outlives the process, so no confirm waits on it."""
        return False

    def publish(self, message: Message, on_durable=None, expiry: int = 0) -> QueueEntry:
        entry = QueueEntry(self._next_seq, message, expiry)
        self._next_seq += 1
        self._tail.append(entry)
        self.ready += 1
        self.ready_bytes += len(message.body)
        return entry

    def publish_delivered(self, message: Message, on_durable=None) -> QueueEntry:
        entry = QueueEntry(self._next_seq, message)
        self._next_seq += 1
        entry.state = OUT
        return entry

    def fetch(self) -> QueueEntry | None:
        while True:
            if self._requeued:
                entry = heapq.heappop(self._requeued)
            elif self._tail:
                entry = self._tail.popleft()
            else:
                return None
            if entry.state == READY:
                break
            self._removed -= 1
        entry.state = OUT
        self.ready -= 1
        self.ready_bytes -= len(entry.message.body)
        return entry

    def remove(self, entries: Iterable[QueueEntry]) -> list[QueueEntry]:
        """Take ready entries out of the ready set; returns those that were ready."""
        removed = []
        for entry in entries:
            if entry.state != READY:
                continue
            entry.state = OUT
            self.ready -= 1
            self.ready_bytes -= len(entry.message.body)
            self._removed += 1
            removed.append(entry)
        if self._removed > COMPACT_ABOVE and self._removed * 2 > len(self._tail) + len(self._requeued):
            self._tail = deque(e for e in self._tail if e.state == READY)
            self._requeued = [e for e in self._requeued if e.state == READY]
            heapq.heapify(self._requeued)
            self._removed = 0
        return removed

    # Nothing is ever paged out, so no expiry waits on disk.
    delta_expiry = 0

    def expire_delta(self, now: int, done) -> None:
        """Never called: `delta_expiry` is always 0."""

    def disk_due(self, now: int) -> int:
        return -1

    def state_counts(self) -> dict[str, int]:
        """Every ready message is alpha: in RAM only."""
        return {"alpha": self.ready, "gamma": 0, "delta": 0}

    def peek(self, count: int, done) -> None:
        found = heapq.nsmallest(count, self._requeued)
        found.extend(islice(self._tail, count - len(found)))
        done(found)

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        """Nothing to release: the entry was dropped from the ready set on fetch."""

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for entry in entries:
            entry.redelivered = True
            entry.state = READY
            heapq.heappush(self._requeued, entry)
            self.ready += 1
            self.ready_bytes += len(entry.message.body)

    def purge(self) -> int:
        count = self.ready
        for entry in self._tail:
            entry.state = OUT
        for entry in self._requeued:
            entry.state = OUT
        self._tail.clear()
        self._requeued.clear()
        self._removed = 0
        self.ready = 0
        self.ready_bytes = 0
        return count

    def delete(self) -> None:
        self.purge()
