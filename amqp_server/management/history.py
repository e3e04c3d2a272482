"""A bounded history of sampled values, and the `*_details` objects RabbitMQ
3.10 answers from it when a request asks for a range (`lengths_age` and
`lengths_incr`, `msg_rates_*`, `data_rates_*`, `node_stats_*`).

Theory of operation:
- A `Track` holds the history of one object (a queue, a vhost, a
  connection, the node): a fixed tuple of integer fields sampled together
  at each tick of the sampler (`rates.RateSampler`).
- Retention is RabbitMQ's default `sample_retention_policies`: queues and
  connections keep "basic" (5 s samples for 605 s, 60 s samples for an
  hour), vhosts and the node "global" (also 10 min samples for 8 h 10 min
  and 30 min samples for a day). Each policy is a list of `Tier`s.
- A tier records a *change point*, (time, values), only when the values
  differ from its last one: a new point when a new bucket of its
  resolution has begun, else the bucket's point takes the new values and
  time. The value at any time is the last point at or before it. So an
  idle object costs one point per tier, whatever the retention, and a busy
  one at most age / resolution + 1 points per tier. Points live in
  `array('q')`s (8 bytes per value, no Python object per sample).
- Invariant: a tier keeps every point younger than its age plus the newest
  point older than that, so the value at any time the tier covers is
  known; before an object's first point its values are 0 (it did not
  exist: nothing was queued or counted).
- A `Range` is one prefix's (age, incr) in seconds, checked as RabbitMQ
  checks it (positive, at most 500 increments: else 400 "Invalid range
  parameters"). Its sample times are RabbitMQ's: the current time rounded
  up to a multiple of incr, then back by incr down to age before it,
  newest first.
"""
from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass

from amqp_server.management.errors import bad_request

# RabbitMQ's default sample_retention_policies: (age, resolution) in seconds.
BASIC = ((605, 5), (3600, 60))
GLOBAL = ((605, 5), (3660, 60), (29400, 600), (86400, 1800))
MAX_INCREMENTS = 500  # rabbit_mgmt_util: a range of more samples is refused
PREFIXES = ("lengths", "msg_rates", "data_rates", "node_stats")


@dataclass(frozen=True)
class Range:
    age: int  # seconds
    incr: int  # seconds

    def times(self, now_ms: int) -> list[int]:
        """The sample times (ms), newest first."""
        step = self.incr * 1000
        last = -(-now_ms // step) * step
        return [last - k * step for k in range(self.age // self.incr + 1)]


def ranges(query: dict) -> dict[str, Range]:
    """The ranges a request's query asks for, by prefix. A prefix needs both
    its `_age` and `_incr` as integers (otherwise RabbitMQ ignores it)."""
    found = {}
    for prefix in PREFIXES:
        age, incr = query.get(prefix + "_age"), query.get(prefix + "_incr")
        try:
            age_s, incr_s = int(age), int(incr)
        except (TypeError, ValueError):
            continue
        if age_s <= 0 or incr_s <= 0 or age_s // incr_s > MAX_INCREMENTS:
            raise bad_request("Invalid range parameters: age %s, incr %s" % (age, incr))
        found[prefix] = Range(age_s, incr_s)
    return found


class Tier:
    """The change points of one track at one resolution."""

    __slots__ = ("times", "values", "last")

    def __init__(self) -> None:
        self.times = array("q")
        self.values = array("q")
        self.last: tuple | None = None  # the values of the newest point

    def record(self, now_ms: int, values: tuple, width: int, age_ms: int, step_ms: int) -> None:
        times = self.times
        if times and values == self.last:
            return  # no change
        self.last = values
        if times and now_ms // step_ms == times[-1] // step_ms:
            times[-1] = now_ms  # this bucket's point: the latest values in it
            self.values[len(self.values) - width:] = array("q", values)
            return
        times.append(now_ms)
        self.values.extend(values)
        if len(times) > 2 and times[1] <= now_ms - age_ms:
            cut = bisect.bisect_right(times, now_ms - age_ms) - 1  # keep the newest point older than age
            del times[:cut]
            del self.values[:cut * width]

    def at(self, time_ms: int) -> int:
        """Index of the point in force at `time_ms`, -1 before the first."""
        return bisect.bisect_right(self.times, time_ms) - 1


class Track:
    """The history of one object's fields (`fields`: their names, shared by
    every track of a kind)."""

    __slots__ = ("fields", "policy", "tiers", "current", "previous", "elapsed")

    def __init__(self, fields: tuple[str, ...], policy) -> None:
        self.fields = fields
        self.policy = policy
        self.tiers = tuple(Tier() for _ in policy)
        self.current: tuple | None = None
        self.previous: tuple | None = None
        self.elapsed = 0.0  # seconds between the last two samples

    def record(self, now_ms: int, values: tuple, elapsed: float) -> None:
        self.previous, self.current, self.elapsed = self.current, values, elapsed
        width = len(self.fields)
        for tier, (age, resolution) in zip(self.tiers, self.policy):
            tier.record(now_ms, values, width, age * 1000, resolution * 1000)

    def rate(self, names: tuple[str, ...]) -> float:
        """The change per second between the last two samples."""
        if self.previous is None or self.elapsed <= 0:
            return 0.0
        change = sum(self.current[self.fields.index(n)] - self.previous[self.fields.index(n)] for n in names)
        return change / self.elapsed

    def samples(self, names: tuple[str, ...], wanted: Range, times: list[int]) -> list[int]:
        """The sum of the `names` fields at each of `times`."""
        index = 0
        for index, (age, _resolution) in enumerate(self.policy):
            if age >= wanted.age:
                break
        tier, width = self.tiers[index], len(self.fields)
        columns = [self.fields.index(n) for n in names]
        out = []
        for time_ms in times:
            point = tier.at(time_ms)
            out.append(0 if point < 0 else sum(tier.values[point * width + c] for c in columns))
        return out


def details(rate: float, wanted: Range | None, samples: list[int] | None, times: list[int] | None) -> dict:
    """RabbitMQ's `X_details`: the current rate alone, or with a range its
    samples (newest first), their mean and the average rate over them; the
    rate is then the change over the last increment."""
    if wanted is None:
        return {"rate": round(rate, 1)}
    out = {"samples": [{"sample": s, "timestamp": t} for s, t in zip(samples, times)]}
    if len(samples) < 2:
        out["rate"] = 0.0
        return out
    out["rate"] = (samples[0] - samples[1]) / wanted.incr
    out["avg"] = sum(samples) / len(samples)
    out["avg_rate"] = (samples[0] - samples[-1]) / ((len(samples) - 1) * wanted.incr)
    return out
