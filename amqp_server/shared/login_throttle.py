"""Slowing down password guessing (beyond RabbitMQ, which refuses at once).

A refused login is answered only after a delay: `base` seconds for the first
consecutive failure of one username from one peer address, doubling with each
further failure, capped at `cap`. A successful login of that pair forgets its
failures. The connection waits on a timer (the event loop never blocks) and
reads nothing meanwhile. The table is bounded: past `MAX_ENTRIES` pairs the
oldest are forgotten, so a flood of distinct names cannot grow memory.
On a node of several shards every shard keeps the node's whole table: a
shard tells the others (`told(failed, host, username)`) of its refused
logins, and of an accepted one that had failures, and counts theirs
(`count_failure`, `forget`; amqp_server.shards.tallies).
"""
from __future__ import annotations

MAX_ENTRIES = 10000


class LoginThrottle:
    __slots__ = ("base", "cap", "_failures", "told")

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[tuple[str, str], int] = {}
        self.told = None  # told(failed, host, username): the node's other shards learn it

    def failed(self, host: str, username: str) -> float:
        """Record a refused login; the seconds to wait before refusing it."""
        count = self.count_failure(host, username)
        if self.told is not None:
            self.told(True, host, username)
        return min(self.base * (1 << min(count - 1, 30)), self.cap)

    def count_failure(self, host: str, username: str) -> int:
        """Count a refused login; how many in a row."""
        key = (host, username)
        count = self._failures.pop(key, 0) + 1
        self._failures[key] = count  # re-inserted: the dict's order is recency
        if len(self._failures) > MAX_ENTRIES:
            del self._failures[next(iter(self._failures))]
        return count

    def succeeded(self, host: str, username: str) -> None:
        if self.forget(host, username) and self.told is not None:
            self.told(False, host, username)

    def forget(self, host: str, username: str) -> bool:
        """Forget a pair's failures; whether it had any."""
        return self._failures.pop((host, username), None) is not None
