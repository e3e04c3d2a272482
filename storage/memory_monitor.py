"""The memory budget for message bodies held in RAM by durable queues.

RabbitMQ pages queue contents to disk from `paging_ratio` of the memory high
watermark on; so does hutch: queues report the bytes of bodies they hold in
RAM (`charge`), and when the total passes the budget the queues holding the
most are asked to page out (`page_out(goal)` moves bodies to disk, the delta
state) until the total is back under PAGE_TO of the budget.
"""
from __future__ import annotations

import os

PAGE_TO = 0.8  # page down to this fraction of the budget, so paging is not per message


def total_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_bytes(watermark: float, absolute: int | None, paging_ratio: float, shares: int = 1) -> int:
    """RabbitMQ's rule: the watermark is a fraction of RAM unless an absolute
    size is given; paging starts at paging_ratio of it. `shares`: the node's
    processes that split it (its shards, docs/scaling.md), each getting an
    equal part, so the node as a whole pages where one process would."""
    limit = absolute if absolute is not None else int(watermark * total_memory())
    return int(limit * paging_ratio) // shares


class MemoryMonitor:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.queues: set = set()
        self.paging_runs = 0

    @property
    def over_budget(self) -> bool:
        return self.used > self.budget

    def register(self, queue) -> None:
        self.queues.add(queue)

    def unregister(self, queue) -> None:
        self.queues.discard(queue)

    def charge(self, size: int) -> None:
        self.used += size
        if size > 0 and self.used > self.budget:
            self.page()

    def page(self) -> None:
        self.paging_runs += 1
        goal = self.used - int(self.budget * PAGE_TO)
        for queue in sorted(self.queues, key=lambda q: q.ram_bytes, reverse=True):
            if goal <= 0:
                break
            freed = queue.page_out(goal)
            self.used -= freed
            goal -= freed
