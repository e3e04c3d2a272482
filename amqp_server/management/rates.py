"""Message rates from the counters in `vhosts.stats`, sampled on a timer.

One task per broker (not per message) takes a snapshot of every counter set
every `interval` seconds; a rate is the change between the last two
snapshots divided by the time between them, which is what RabbitMQ's
"basic" rates mode shows. Snapshots are keyed by the identity of the live
counter object and rebuilt each round, so deleted queues drop out and a
recreated queue starts from zero.
"""
from __future__ import annotations

import asyncio
import time

from vhosts.stats import FIELDS

SAMPLED = FIELDS + ("deliver_get",)


class RateSampler:
    def __init__(self, broker, connections: set, interval: float) -> None:
        self.broker = broker
        self.connections = connections
        self.interval = interval
        # id(counter object) -> (object, time, totals)
        self._last: dict[int, tuple] = {}
        self._rates: dict[int, dict[str, float]] = {}
        self._task: asyncio.Task | None = None

    def _subjects(self):
        """Everything that keeps counters: (object, totals) now."""
        yield self.broker.churn, self.broker.churn.totals()
        for vhost in self.broker.vhosts.values():
            yield vhost.stats, vhost.stats.totals()
            yield vhost, {"messages_ready": sum(q.message_count for q in vhost.queues.values())}
            for queue in vhost.queues.values():
                yield queue.stats, queue.stats.totals()
                yield queue, {"messages_ready": queue.message_count}
        for connection in list(self.connections):
            yield connection, {"recv_oct": connection.recv_oct, "send_oct": connection.send_oct}

    def sample(self) -> None:
        now = time.monotonic()
        last, rates = {}, {}
        for subject, totals in self._subjects():
            key = id(subject)
            previous = self._last.get(key)
            if previous is not None and previous[0] is subject and now > previous[1]:
                elapsed = now - previous[1]
                rates[key] = {name: (value - previous[2].get(name, 0)) / elapsed for name, value in totals.items()}
            last[key] = (subject, now, totals)
        self._last, self._rates = last, rates

    def rate(self, subject, name: str) -> float:
        found = self._rates.get(id(subject))
        if found is None or self._last.get(id(subject), (None,))[0] is not subject:
            return 0.0
        return round(found.get(name, 0.0), 1)

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

