"""Rates and their history, from the counters in `vhosts.stats` and the
lengths of queues, sampled on a timer.

One task per broker (not per message) takes a sample of every object that
reports rates every `interval` seconds (RabbitMQ's
collect_statistics_interval, 5 s): each queue, vhost, connection, channel
and exchange, and the node. A channel or an exchange that has counted
nothing yet is not sampled (it has no history: its values were 0), so the
many that never see a message cost nothing. A sample goes into the
object's `history.Track`; the current rate is the change between the last
two samples divided by the time between them ("basic" rates mode), and a
request with a range reads the samples (`Reading`). Tracks are keyed by the identity of the live object
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
# RabbitMQ shows a channel's counters in two groups: the publishing side's once
# it published, the consuming side's once it consumed or got.
CHANNEL_PUBLISHING = ("confirm", "drop_unroutable", "publish", "return_unroutable")
CHANNEL_CONSUMING = ("ack", "deliver", "deliver_get", "deliver_no_ack", "get", "get_empty", "get_no_ack",
                     "redeliver")
CHANNEL_STATS = CHANNEL_PUBLISHING + CHANNEL_CONSUMING
EXCHANGE_STATS = ("publish_in", "publish_out")
LENGTHS = ("messages_ready", "messages_unacknowledged")
DATA = ("recv_oct", "send_oct")
NODE_FIGURES = ("mem_used", "fd_used", "sockets_used", "disk_free")

QUEUE_FIELDS = LENGTHS + QUEUE_STATS
VHOST_FIELDS = LENGTHS + VHOST_STATS
NODE_FIELDS = NODE_FIGURES + CHURN_FIELDS

_queue_stats = attrgetter(*QUEUE_STATS)
_channel_stats = attrgetter(*CHANNEL_STATS)
_exchange_stats = attrgetter(*EXCHANGE_STATS)
_data = attrgetter(*DATA)
_churn = attrgetter(*CHURN_FIELDS)


class RateSampler:
    def __init__(self, broker, connections: set, interval: float) -> None:
        self.broker = broker
        self.connections = connections
        self.interval = interval
        # The node's figures now ({name: int} for NODE_FIGURES), set by the node.
        self.figures = lambda: dict.fromkeys(NODE_FIGURES, 0)
        # (queue, entry) of deliveries held besides the connections' (for other shards' clients), set by the node.
        self.held = lambda: ()
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
            for channel in list(connection.channels.values()):  # kept under its MessageStats
                values = _channel_stats(channel.stats)
                if any(values):
                    yield channel.stats, CHANNEL_STATS, BASIC, values
        for queue, _entry in self.held():
            unacked[queue] += 1
        for vhost in self.broker.vhosts.values():
            ready = held = 0
            for queue in vhost.queues.values():
                # another shard's queue: its lengths are its owner's (counted there), its counters here
                count, waiting = (0, 0) if getattr(queue, "remote", False) else (queue.message_count, unacked[queue])
                ready += count
                held += waiting
                yield queue, QUEUE_FIELDS, BASIC, (count, waiting, *_queue_stats(queue.stats))
            totals = vhost.stats.totals()
            yield vhost, VHOST_FIELDS, GLOBAL, (ready, held, *(totals[k] for k in VHOST_STATS))
            # an exchange's history is kept under its ExchangeStats (the default exchange has no object)
            for stats in (vhost.default_exchange_stats, *(x.stats for x in vhost.exchanges.values())):
                if stats.publish_in:  # else nothing was published to it, nor routed from it
                    yield stats, EXCHANGE_STATS, BASIC, _exchange_stats(stats)
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

    def __init__(self, sampler: RateSampler, query: dict, now_ms: int | None = None) -> None:
        self.sampler = sampler
        self.ranges = ranges(query)
        self.now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self._times: dict[str, list[int]] = {}

    def asked(self) -> dict:
        """What another shard needs to read its own samples as this request
        does (`answering`): the ranges asked for, and this reading's time,
        so that both read the same sample times and their samples add up
        (two clocks a moment apart can straddle a step of the range)."""
        query = {}
        for prefix, wanted in self.ranges.items():
            query[prefix + "_age"], query[prefix + "_incr"] = wanted.age, wanted.incr
        return {"query": query, "now_ms": self.now_ms}

    @classmethod
    def answering(cls, sampler: RateSampler, asked: dict) -> "Reading":
        """The reading of another shard's request (its `asked`)."""
        return cls(sampler, asked["query"], asked["now_ms"])

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
