"""How a scenario is measured on one broker, and the loop that runs every scenario on every broker.

A `Scenario` is a name, the `Metric`s it reports and a measuring function
``run(settings, target, name) -> measurements`` (a dict keyed by `Metric.key`, plus ``"rss"``:
the broker's peak RSS in bytes during the run). The measuring functions here:

- `timed(args)`: one amqpbench run of --duration seconds after --warmup (S1-S5, S8, scale);
- `backlog`: S6, fill then drain of --backlog persistent messages (`harness.fill_drain`);
- `idle_connections`: S7, amqpbench holding N idle connections; memory per connection;
- `empty_queues`: declare N queues with pika; memory per queue;
- `route_cost_rows`: routing cost per publish in-process (hutch's `VirtualHost.route`, timeit).

`run_all` interleaves: for each repeat, for each scenario, every broker in turn, so drifts in the
machine's load hit all brokers alike. Every run of a scenario on hutch or garagemq gets a fresh
broker (new process, empty data directory); RabbitMQ is the running node, shared and never
restarted. A broker measures only the scenarios its `measures(name)` accepts (garagemq: S1, S2,
S4, S5; see GARAGEMQ_SCENARIOS).

Broker CPU per message ("cpu_us") is the broker process's user + system time over the measured
window (/proc/PID/stat, all its threads; RabbitMQ's beam.smp, garagemq's one process), sampled
by amqpbench, divided by the messages consumed in it: unlike msg/s, load from other work on the
machine hardly moves it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import timeit
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

from harness import (MB, ROOT, RssSampler, amqpbench, children, files_left, fill_drain, fresh_garagemq, fresh_hutch,
                     log, profiled,
                     rabbitmq_memory, rabbitmq_pid, rabbitmq_sockets_left, rss_bytes,
                     runqueue_wait_s, tree_cpu_seconds)
from results_table import Metric, Row

# Connections left free on a broker with a low socket limit (the shared RabbitMQ takes 832):
# other sessions' tests use it while the benchmark runs.
SPARE_SOCKETS = 100


@dataclass
class Settings:
    generator: str  # the amqpbench binary
    duration: float = 20
    warmup: float = 5
    repeat: int = 1
    backlog: int = 1_000_000  # S6 messages
    idle_connections: int = 1000  # S7
    hold: float = 5  # seconds the idle connections are held before RSS is read
    empty_queues: int = 10_000
    profile: str | None = None  # py-spy output directory (hutch runs only)


@dataclass(frozen=True)
class Target:
    """A broker being measured: its name, uri and pid while `running()`; `shared` when it outlives
    the run (RabbitMQ), so what a run leaves behind must be deleted."""
    name: str
    uri: str
    pid: int
    is_hutch: bool
    shared: bool = False


class HutchBroker:
    name = "hutch"

    def __init__(self, extra: list[str]) -> None:
        self.extra = extra

    def measures(self, scenario: str) -> bool:
        return True

    @contextmanager
    def running(self) -> Iterator[Target]:
        with fresh_hutch(self.extra) as h:
            yield Target(self.name, h.uri, h.pid, True)


class RabbitMQBroker:
    name = "RabbitMQ"

    def __init__(self, url: str) -> None:
        self.url = url

    def measures(self, scenario: str) -> bool:
        return True

    @contextmanager
    def running(self) -> Iterator[Target]:
        yield Target(self.name, self.url, rabbitmq_pid(self.url), False, shared=True)


# S3 is not among them: garagemq (Debian's 0.x) never confirms a persistent message published to a
# durable queue (amqpbench: the first window of 100 sent, none confirmed, the run stalls); its
# confirms of transient messages do arrive. S6 needs the same confirms; S7 and S8 the issue
# does not ask of it.
GARAGEMQ_SCENARIOS = ("S1", "S2", "S4", "S5")


class GaragemqBroker:
    name = "garagemq"

    def __init__(self, binary: str = "garagemq", scenarios: tuple[str, ...] = GARAGEMQ_SCENARIOS) -> None:
        self.binary, self.scenarios = binary, scenarios

    def measures(self, scenario: str) -> bool:
        return scenario in self.scenarios

    @contextmanager
    def running(self) -> Iterator[Target]:
        with fresh_garagemq(self.binary) as g:
            yield Target(self.name, g.uri, g.pid, False)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    metrics: tuple[Metric, ...]
    run: Callable[[Settings, Target, str], dict]


# --- measuring functions --------------------------------------------------------------------

def _profiling(settings: Settings, target: Target, name: str):
    if not (settings.profile and target.is_hutch):
        return nullcontext()
    return profiled(target.pid, settings.profile, name, delay=settings.warmup + 1,
                    duration=int(max(1, min(10, settings.duration - 2))))


def timed(args: str) -> Callable[[Settings, Target, str], dict]:
    """amqpbench with `args` (``{name}`` is replaced by the run's queue/exchange name) for
    --duration s after --warmup s: consumed msg/s, latency p50/p99, broker CPU per message, and
    the seconds the broker's threads waited for a CPU during the whole run (load from elsewhere)."""
    def run(settings: Settings, target: Target, name: str) -> dict:
        argv = ["--time", "%g" % settings.duration, "--warmup", "%g" % settings.warmup, "--queue", name,
                "--label", name, *args.format(name=name).split()]
        waited = runqueue_wait_s(target.pid)
        window = _TreeWindow(target.pid, settings.duration) if children(target.pid) else None
        with RssSampler(target.pid) as rss, _profiling(settings, target, name):
            out = amqpbench(settings.generator, target.uri, argv, target.pid,
                            timeout=settings.duration + settings.warmup + 900,
                            when=window and ("[warm-up done", window.start))
        waited = runqueue_wait_s(target.pid) - waited if waited is not None else None
        if "cleanup_error" in out and target.shared:
            _delete_leftovers(target.uri, name)
        latency, consumed, cpu = out["latency_ms"], out["consume_rate"], out["broker_cpu_pct"]
        if window is not None:  # amqpbench samples one pid: the supervisor of a hutch of several shards
            cpu = window.cpu_pct()
        measured = bool(latency["samples"])
        return {"consumed": consumed, "p50": latency["p50"] if measured else None,
                "p99": latency["p99"] if measured else None,
                "cpu_us": cpu_us(cpu, consumed),
                "runqueue_wait_s": waited, "rss": rss.peak, "amqpbench": out}
    return run


def _delete_leftovers(uri: str, name: str) -> None:
    """The exchange and queue `name`, when amqpbench could not delete them (RabbitMQ takes minutes
    to delete an exchange with 100,000 bindings; amqpbench's request times out before). Each on
    its own channel: one of them may be gone already (a 404 closes the channel)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        for delete in (lambda ch: ch.queue_delete(name), lambda ch: ch.exchange_delete(name)):
            try:
                delete(conn.channel())
            except pika.exceptions.ChannelClosedByBroker as exc:
                log("deleting the leftover %s: %s" % (name, exc))
    finally:
        conn.close()
    log("deleted the leftovers of %s" % name)


def backlog(settings: Settings, target: Target, name: str) -> dict:
    res = fill_drain(settings.generator, target.uri, lambda: target.pid, name, settings.backlog,
                     "%s-%s" % (target.name, name), settings.profile if target.is_hutch else None)
    peak = max(res["fill_rss_peak"], res["drain_rss_peak"])
    return {"fill": res["fill_rate"], "drain": res["drain_rate"], "rss_mib": peak / MB, "rss": peak,
            "fill_cpu_us": cpu_us(res["fill_broker_cpu"], res["fill_rate"]),
            "drain_cpu_us": cpu_us(res["drain_broker_cpu"], res["drain_rate"]), "fill_drain": res}


class _TreeWindow:
    """The CPU of a process and its children (hutch's shards) over amqpbench's measured window:
    sampled when amqpbench says the warm-up is done and `duration` s later (amqpbench's own
    sample reads one /proc/PID/stat)."""

    def __init__(self, pid: int, duration: float) -> None:
        self.pid, self.duration = pid, duration
        self.samples: list[tuple[float, float]] = []
        self._timer: threading.Timer | None = None

    def _sample(self) -> None:
        cpu = tree_cpu_seconds(self.pid)
        if cpu is not None:
            self.samples.append((time.monotonic(), cpu))

    def start(self) -> None:
        self._sample()
        self._timer = threading.Timer(self.duration, self._sample)
        self._timer.start()

    def cpu_pct(self) -> float | None:
        if self._timer is not None:
            self._timer.join()
        if len(self.samples) != 2:
            return None
        (t0, c0), (t1, c1) = self.samples
        return 100.0 * (c1 - c0) / (t1 - t0)


def cpu_us(broker_cpu_pct: float | None, rate: float | None) -> float | None:
    """Broker CPU microseconds per message: amqpbench's broker CPU (% of one core over the
    measured window, -1 when it could not read it) over the messages per second in it."""
    if broker_cpu_pct is None or broker_cpu_pct < 0 or not rate:
        return None
    return broker_cpu_pct * 1e4 / rate


def _fit_sockets(target: Target, wanted: int) -> tuple[int, str]:
    """How many more connections `target` can take while leaving SPARE_SOCKETS to other users,
    and a note when that is fewer than `wanted`."""
    room = [files_left(target.pid)]
    if not target.is_hutch:
        room.append(rabbitmq_sockets_left())
    known = [r for r in room if r is not None]
    if not known or min(known) - SPARE_SOCKETS >= wanted:
        return wanted, ""
    n = max(0, min(known) - SPARE_SOCKETS)
    return n, "%s: %d idle connections instead of %d (the broker's socket limit, %d left spare)" % (
        target.name, n, wanted, SPARE_SOCKETS)


class _MemoryDelta:
    """RabbitMQ's own account of what something costs: the `rabbitmq_memory(prefix)` categories
    before and while it exists (its RSS moves by more than that with the shared node's other work
    and garbage collection). Nothing for hutch, whose fresh process's RSS is steady."""

    def __init__(self, target: Target, prefix: str) -> None:
        self.target, self.prefix = target, prefix
        self.before = None if target.is_hutch else rabbitmq_memory(prefix)
        self.during = None

    def sample(self) -> None:
        if not self.target.is_hutch:
            self.during = rabbitmq_memory(self.prefix)

    def per(self, count: int) -> float | None:
        if self.before is None or self.during is None or not count:
            return None
        return (self.during - self.before) / count


def idle_connections(settings: Settings, target: Target, name: str) -> dict:
    """amqpbench opens the connections (1 channel each) and holds them --hold s: the broker's RSS
    delta per connection (read by amqpbench at the end of the hold), and for RabbitMQ its
    connection_* memory per connection, read once they are all open."""
    n, note = _fit_sockets(target, settings.idle_connections)
    if note:
        log(note)
    node = _MemoryDelta(target, "connection_")
    out = amqpbench(settings.generator, target.uri, ["--idle-connections", str(n), "--idle-threads", "4",
                                                     "--time", "%g" % settings.hold, "--label", name], target.pid,
                    timeout=settings.hold + 600, when=("opened ", node.sample))
    opened = out["opened"]
    return {"per_connection_kib": out["broker_rss_kb_delta"] / opened if opened else None,
            "node_kib": node.per(opened), "opened": opened, "rss": out["broker_rss_kb_after_open"] * 1024,
            "note": note, "amqpbench": out}


def empty_queues(settings: Settings, target: Target, name: str) -> dict:
    """Declares --empty-queues non-durable queues on one channel: the broker's RSS delta per queue,
    and for RabbitMQ its queue_procs memory per queue."""
    import pika

    n = settings.empty_queues
    conn = pika.BlockingConnection(pika.URLParameters(target.uri))
    try:
        channel = conn.channel()
        node = _MemoryDelta(target, "queue_procs")
        before = rss_bytes(target.pid)
        for i in range(n):
            channel.queue_declare("%s-%d" % (name, i))
        after = rss_bytes(target.pid)
        node.sample()
        for i in range(n):
            channel.queue_delete("%s-%d" % (name, i))
    finally:
        conn.close()
    return {"per_queue_kib": (after - before) / 1024 / n, "node_kib": node.per(n), "rss": after}


def route_cost_us(bindings: int, routing_key: str) -> float:
    """Microseconds per `VirtualHost.route` through a topic exchange holding `bindings` of
    amqpbench's --topic-bindings patterns (a.<i>.* for even i, #.<i> for odd i), best of 7."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from vhosts.vhost import VirtualHost

    vhost = VirtualHost("bench")
    vhost.declare_exchange("t", "topic")
    vhost.declare_queue("q", None)
    for i in range(bindings):
        vhost.bind_queue("q", "t", ("a.%d.*" if i % 2 == 0 else "#.%d") % i, None, None)
    keys = [routing_key]
    if [q.name for q in vhost.route("t", keys, None)] != ["q"]:
        raise RuntimeError("%s does not route to exactly one queue" % routing_key)
    timer = timeit.Timer(lambda: vhost.route("t", keys, None))
    calls, _ = timer.autorange()
    return min(timer.repeat(7, calls)) / calls * 1e6


def route_cost_rows(binding_counts: tuple[int, ...], routing_key: str) -> list[Row]:
    metric = Metric("route_us", "route() in-process, µs per publish (hutch)")
    return [Row("topic, {:,} bindings".format(n), metric, [route_cost_us(n, routing_key)], [])
            for n in binding_counts]


# --- running --------------------------------------------------------------------------------

def run_one(settings: Settings, scenario: Scenario, broker) -> dict | None:
    """One run of `scenario` on `broker`; None (logged) when it failed."""
    name = "bench-%s-%d" % ("-".join(re.findall(r"[a-z0-9]+", scenario.name.lower())), os.getpid())
    try:
        with broker.running() as target:
            measured = scenario.run(settings, target, name)
    except (RuntimeError, OSError, subprocess.SubprocessError, KeyError) as exc:
        log("%s on %s failed: %s" % (scenario.name, broker.name, exc))
        return None
    log("%s on %s: %s" % (scenario.name, broker.name, ", ".join(
        "%s %s" % (m.label, _short(measured.get(m.key))) for m in scenario.metrics)))
    return measured


def _short(value) -> str:
    return "-" if value is None else "%.4g" % value


def run_all(settings: Settings, scenarios: list[Scenario], brokers: list) -> dict[str, dict[str, list]]:
    """{scenario: {broker: [measurements or None, one per repeat]}}, interleaved (module doc)."""
    results = {s.name: {b.name: [] for b in brokers} for s in scenarios}
    for repeat in range(settings.repeat):
        for scenario in scenarios:
            for broker in brokers:
                if not broker.measures(scenario.name):
                    continue
                log("repeat %d/%d: %s on %s" % (repeat + 1, settings.repeat, scenario.name, broker.name))
                results[scenario.name][broker.name].append(run_one(settings, scenario, broker))
    return results


def rows(scenarios: list[Scenario], results: dict[str, dict[str, list]]) -> list[Row]:
    def values(runs: list, key: str) -> list:
        return [run.get(key) if run else None for run in runs]

    out = []
    for s in scenarios:
        runs = results[s.name]
        hutch, rabbitmq, garagemq = (runs.get(b.name, []) for b in (HutchBroker, RabbitMQBroker, GaragemqBroker))
        for m in s.metrics:
            out.append(Row(s.name, m, values(hutch, m.key), values(rabbitmq, m.key),
                           values(hutch, "rss"), values(rabbitmq, "rss"),
                           values(garagemq, m.key), values(garagemq, "rss")))
    return out


def notes(results: dict[str, dict[str, list]]) -> list[str]:
    """The distinct notes the runs left (e.g. fewer idle connections than asked)."""
    seen = []
    for per_broker in results.values():
        for runs in per_broker.values():
            for run in runs:
                if run and run.get("note") and run["note"] not in seen:
                    seen.append(run["note"])
    return seen
