"""Rates and their history, from the counters in `vhosts.stats` and the
lengths of queues, sampled on a timer.

One task per broker (not per message) takes a sample of every object that
reports rates every `interval` seconds (RabbitMQ's
collect_statistics_interval, 5 s): each queue, vhost and connection, and
the node. A sample goes into the object's `history.Track`; the current
rate is the change between the last two samples divided by the time
between them ("basic" rates mode), and a request with a range reads the
samples (`Reading`). Tracks are keyed by the identity of the live object
and rebuilt each round, so deleted objects drop out and a recreated queue
starts from zero.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from operator import attrgetter

from vhosts.stats import CHURN_FIELDS

from amqp_server.management.history import BASIC, GLOBAL, Track, details, ranges

QUEUE_STATS = ("ack", "deliver", "deliver_get", "deliver_no_ack", "get", "get_empty", "get_no_ack", "publish",
               "redeliver")
VHOST_STATS = QUEUE_STATS + ("confirm", "drop_unroutable", "return_unroutable")
LENGTHS = ("messages_ready", "messages_unacknowledged")
DATA = ("recv_oct", "send_oct")
NODE_FIGURES = ("mem_used", "fd_used", "sockets_used", "disk_free")

QUEUE_FIELDS = LENGTHS + QUEUE_STATS
VHOST_FIELDS = LENGTHS + VHOST_STATS
NODE_FIELDS = NODE_FIGURES + CHURN_FIELDS

_queue_stats = attrgetter(*QUEUE_STATS)
_vhost_stats = attrgetter(*VHOST_STATS)
_data = attrgetter(*DATA)
_churn = attrgetter(*CHURN_FIELDS)


class RateSampler:
    def __init__(self, broker, connections: set, interval: float) -> None:
        self.broker = broker
        self.connections = connections
        self.interval = interval
        # The node's figures now ({name: int} for NODE_FIGURES), set by the node.
        self.figures = lambda: dict.fromkeys(NODE_FIGURES, 0)
        # id(object) -> (object, Track): the object is kept to tell a new one at a reused id
        self._tracks: dict[int, tuple] = {}
        self._at: float | None = None  # time.monotonic() of the last sample
        self._task: asyncio.Task | None = None

    def _samples(self):
        """(object, fields, retention, values) of everything that reports rates, now."""
        unacked: Counter = Counter()
        for connection in list(self.connections):
            for queue, _entry in connection.unacked_deliveries():
                unacked[queue] += 1
            yield connection, DATA, BASIC, _data(connection)
        for vhost in self.broker.vhosts.values():
            ready = held = 0
            for queue in vhost.queues.values():
                count, waiting = queue.message_count, unacked[queue]
                ready += count
                held += waiting
                yield queue, QUEUE_FIELDS, BASIC, (count, waiting, *_queue_stats(queue.stats))
            yield vhost, VHOST_FIELDS, GLOBAL, (ready, held, *_vhost_stats(vhost.stats))
        figures = self.figures()
        yield self.broker, NODE_FIELDS, GLOBAL, (*(figures[n] for n in NODE_FIGURES), *_churn(self.broker.churn))

    def sample(self) -> None:
        now = time.monotonic()
        now_ms = int(time.time() * 1000)
        elapsed = now - self._at if self._at is not None else 0.0
        old, tracks = self._tracks, {}
        for subject, fields, retention, values in self._samples():
            key = id(subject)
            found = old.get(key)
            track = found[1] if found is not None and found[0] is subject else Track(fields, retention)
            track.record(now_ms, values, elapsed)
            tracks[key] = (subject, track)
        self._tracks, self._at = tracks, now

    def track(self, subject) -> Track | None:
        found = self._tracks.get(id(subject))
        return found[1] if found is not None and found[0] is subject else None

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


class Reading:
    """The sampler as one request reads it: `details` gives the current rate
    alone, or with the samples of the range the query asks for (an invalid
    range is a 400 here, before anything is shaped)."""

    def __init__(self, sampler: RateSampler, query: dict) -> None:
        self.sampler = sampler
        self.ranges = ranges(query)
        self.now_ms = int(time.time() * 1000)
        self._times: dict[str, list[int]] = {}

    def details(self, subjects, names: tuple[str, ...], prefix: str) -> dict:
        """`X_details` of the sum of fields `names` over `subjects` (objects
        sampled above); `prefix` names the range that applies."""
        tracks = [t for t in map(self.sampler.track, subjects) if t is not None]
        wanted = self.ranges.get(prefix)
        if wanted is None:
            return details(sum(t.rate(names) for t in tracks), None, None, None)
        times = self._times.get(prefix)
        if times is None:
            times = self._times[prefix] = wanted.times(self.now_ms)
        samples = [0] * len(times)
        for track in tracks:
            samples = [a + b for a, b in zip(samples, track.samples(names, wanted, times))]
        return details(0.0, wanted, samples, times)

    def with_rates(self, subjects, totals: dict, keys, prefix: str) -> dict:
        """{key: total, key_details: ...} for each key."""
        out = {}
        for key in keys:
            out[key] = totals[key]
            out[key + "_details"] = self.details(subjects, (key,), prefix)
        return out
