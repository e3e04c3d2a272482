"""Slowing down password guessing (beyond RabbitMQ, which refuses at once).

A refused login is answered only after a delay: `base` seconds for the first
consecutive failure of one username from one peer address, doubling with each
further failure, capped at `cap`. A successful login of that pair forgets its
failures. The connection waits on a timer (the event loop never blocks) and
reads nothing meanwhile. The table is bounded: past `MAX_ENTRIES` pairs the
oldest are forgotten, so a flood of distinct names cannot grow memory.
"""
from __future__ import annotations

MAX_ENTRIES = 10000


class LoginThrottle:
    __slots__ = ("base", "cap", "_failures")

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[tuple[str, str], int] = {}

    def failed(self, host: str, username: str) -> float:
        """Record a refused login; the seconds to wait before refusing it."""
        key = (host, username)
        count = self._failures.pop(key, 0) + 1
        self._failures[key] = count  # re-inserted: the dict's order is recency
        if len(self._failures) > MAX_ENTRIES:
            del self._failures[next(iter(self._failures))]
        return min(self.base * (1 << min(count - 1, 30)), self.cap)

    def succeeded(self, host: str, username: str) -> None:
        self._failures.pop((host, username), None)
