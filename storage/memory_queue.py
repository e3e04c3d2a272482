"""A backing queue that keeps every message in RAM (transient queues).

Theory: entries are published with increasing `seq`, and `fetch` always takes
the lowest ready seq, so every fetched entry has a lower seq than every entry
still in `_tail`. Requeued entries therefore go in a small heap that is always
served before `_tail`, which restores their original order in O(log n) without
touching the tail.
"""
from __future__ import annotations

import heapq
from collections import deque
from itertools import islice
from typing import Iterable

from storage.backing_queue import QueueEntry
from storage.message import Message


class MemoryQueue:
    __slots__ = ("_tail", "_requeued", "_next_seq", "ready", "ready_bytes", "on_available")

    def __init__(self) -> None:
        self._tail: deque[QueueEntry] = deque()
        self._requeued: list[QueueEntry] = []
        self._next_seq = 0
        self.ready = 0
        self.ready_bytes = 0
        # Never called: every message is always in RAM.
        self.on_available = None

    def persists(self, message: Message) -> bool:
        """Nothing here outlives the process, so no confirm waits on it."""
        return False

    def publish(self, message: Message, on_durable=None) -> QueueEntry:
        entry = QueueEntry(self._next_seq, message)
        self._next_seq += 1
        self._tail.append(entry)
        self.ready += 1
        self.ready_bytes += len(message.body)
        return entry

    def fetch(self) -> QueueEntry | None:
        if self._requeued:
            entry = heapq.heappop(self._requeued)
        elif self._tail:
            entry = self._tail.popleft()
        else:
            return None
        self.ready -= 1
        self.ready_bytes -= len(entry.message.body)
        return entry

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
            heapq.heappush(self._requeued, entry)
            self.ready += 1
            self.ready_bytes += len(entry.message.body)

    def purge(self) -> int:
        count = self.ready
        self._tail.clear()
        self._requeued.clear()
        self.ready = 0
        self.ready_bytes = 0
        return count

    def delete(self) -> None:
        self.purge()
