"""When the messages of one queue expire: one heap, one timer.

Theory of operation:
- Every ready message with an expiry (per-queue TTL, per-message
  expiration, the smaller of the two) is pushed on `_heap` as (expiry, seq,
  entry). One timer per queue is armed for the earliest expiry; when it
  fires, `due(now)` pops every item whose time has come and the queue takes
  those entries out wherever they are (storage's `remove`), so counts are
  truthful and the order of the others is untouched.
- Items are never removed from the middle of the heap: an entry delivered
  meanwhile (state OUT) or paged to disk (PAGED) is skipped when its item
  comes up. A requeued entry is pushed again (a duplicate item is harmless:
  `remove` only takes READY entries). To bound what stale items cost, the
  heap is rebuilt from its READY items whenever it has doubled since the
  last rebuild (amortised O(1) per push).
- The timer is re-armed only when the earliest expiry changes to an earlier
  time, or after it fired; pushing a later expiry costs O(log n) and no
  timer.
- Messages paged out to disk are not in the heap: `elsewhere()` gives the
  earliest expiry among them (the backing queue's `delta_expiry`), and the
  same timer covers it.
"""
from __future__ import annotations

import heapq
from typing import Callable

from storage.backing_queue import READY, QueueEntry
from vhosts.clock import Clock, TimerHandle

REBUILD_FLOOR = 1024


class MessageExpiry:
    __slots__ = ("_heap", "_clock", "_on_due", "_elsewhere", "_timer", "_timer_at", "_rebuild_at")

    def __init__(self, clock: Clock, on_due: Callable[[], None], elsewhere: Callable[[], int]) -> None:
        self._heap: list[tuple[int, int, QueueEntry]] = []
        self._clock = clock
        self._on_due = on_due
        self._elsewhere = elsewhere
        self._timer: TimerHandle | None = None
        self._timer_at = 0
        self._rebuild_at = REBUILD_FLOOR

    def __len__(self) -> int:
        return len(self._heap)

    def track(self, entry: QueueEntry) -> None:
        """Watch a ready entry whose `expiry` is set."""
        heap = self._heap
        heapq.heappush(heap, (entry.expiry, entry.seq, entry))
        if len(heap) > self._rebuild_at:
            self._rebuild()
        if self._timer is None or entry.expiry < self._timer_at:
            self.arm()

    def next_expiry(self) -> int:
        """The earliest expiry of a READY entry (0: none)."""
        heap = self._heap
        while heap and heap[0][2].state != READY:
            heapq.heappop(heap)
        return heap[0][0] if heap else 0

    def due(self, now: int) -> list[QueueEntry]:
        """Pop the READY entries expired at `now`, earliest first."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.state == READY:
                out.append(entry)
        return out

    def arm(self) -> None:
        """Set the timer for the earliest expiry (or none)."""
        at = self.next_expiry()
        other = self._elsewhere()
        if other and (not at or other < at):
            at = other
        if self._timer is not None:
            if at and at == self._timer_at:
                return
            self._timer.cancel()
            self._timer = None
        if at:
            self._timer_at = at
            self._timer = self._clock.call_later(at - self._clock.now(), self._fire)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap = []
        self._rebuild_at = REBUILD_FLOOR

    def _fire(self) -> None:
        self._timer = None
        self._on_due()

    def _rebuild(self) -> None:
        heap = [item for item in self._heap if item[2].state == READY]
        heapq.heapify(heap)
        self._heap = heap
        self._rebuild_at = max(REBUILD_FLOOR, 2 * len(heap))
