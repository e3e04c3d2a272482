#!/usr/bin/env python3
"""Throughput against cores, cores simulated with CPU quotas (issue 29, "Measured, as the hardware grows").

    python bench/scale.py --generator /tmp/amqpbench/amqpbench --shards 1,2,4 --json-out scale.json --svg docs/scaling/throughput.svg
    python bench/scale.py --shards 1 --duration 3 --warmup 1 --no-rabbitmq            # quick: does it work
    python bench/scale.py --hop --hop-shards 2 --hop-runs 8                            # CPU of a publish across shards
    python bench/scale.py --cluster 1,3 --quota 0.25 --repeat 3                         # a cluster's nodes (issue 32)
    python bench/scale.py --render scale.json --svg docs/scaling/throughput.svg         # chart from a saved run

A machine with N cores is simulated with CPU quotas (cgroups, bench/cpu_quota.py; root):
- hutch `--shards N`: every shard process in its own cgroup with --quota Q of a core (default
  0.25). The supervisor shares the first shard's group, so hutch never gets more than N x Q. The
  shards are the supervisor's children (/proc/PID/task/PID/children), re-read before every run
  (a crashed shard is restarted: its successor is put back in a group of its own). --shards 1 is
  today's single process. A hutch without the --shards option runs N = 1 only (and says so).
- RabbitMQ: a node of its own started by this script (the installed 3.10, free ports, its own
  RABBITMQ_MNESIA_BASE, NODENAME, config and HOME in a temporary directory; not the shared node
  on 5672), in one cgroup with N x Q, with N schedulers (`+S N:N` in
  RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS); otherwise RabbitMQ's defaults (which include `+sbwt none`:
  no scheduler busy-waiting to burn the quota).
- The quotas hold from the start of each amqpbench run to the end of its measured window; they
  are lifted for the broker's start, amqpbench's clean-up (deleting 16 queues' backlog at a
  quarter of a core takes a minute) and the stop. The load generator, amqpbench, runs outside
  any quota.

Workloads (the issue's), each 16 queues, 16 producers, 16 consumers (amqpbench --queues 16:
producer j publishes to queue j mod 16, consumer i reads queue i mod 16):
- autoack: 16 B, consumers with autoack;
- confirms: 1 KiB persistent into durable queues, publisher confirms (window 100 per producer),
  manual acks (prefetch 100, multi-ack every 10), S3's shape.

Each run: a fresh hutch per workload (empty data directory), one RabbitMQ node per shard count
and repeat; amqpbench for --warmup + --duration s; consumed msg/s (amqpbench's measured window)
and the broker's CPU over the window (user + system time of every process of the broker, from
/proc/PID/stat, sampled by this script from 0.5 s into amqpbench's window to 0.5 s before its
end), as cores and as CPU µs per message, the share of the quota's periods in which the broker
was throttled (cpu.stat: its quota ran out), and each process's share (are the shards evenly
loaded?). The table shows medians of --repeat runs, N shards / 1 shard, hutch / RabbitMQ and the
issue's targets.

--hop: the broker CPU of a publish into a queue on another shard against a local one. hutch with
--hop-shards N; each of --hop-runs runs declares a queue on a new connection and publishes 16 B
into it from one producer on another new connection: where each lands is the broker's choice. No
consumer (its connection would be a third placement): the queue grows for the run's --warmup +
--duration s and is deleted after it (--hop-queue grow, the default). --hop-queue
reject-publish / drop-head caps it at 1000 messages instead, but neither measures a hop: with
reject-publish the shard where the publish arrives refuses it itself once the queue is full
(every run is local), and dropping the head costs hutch some 30 µs per message today, ten times
a publish. A run is local when one shard did at least LOCAL_SHARE of the shards' CPU, else a hop;
the figure is broker CPU µs per publish, median per kind, and cross / local (target <= 1.6).
Messages are counted where they arrive (the queue's depth at both ends of the window); in a hop
run the shard holding the producer's connection may read faster than the owner stores, so its
CPU is divided by what it read and the others' by what was stored. With N = 1 every run is local.

--cluster 1,3: throughput against nodes instead (bench/scale_cluster.py: K-node clusters on a real
etcd, each node under --quota cores, the confirms workload's 16 queues and 32 clients spread over
the nodes), K nodes / 1 node against the issue's target (>= 2.5 at 3 nodes).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cpu_quota import CgroupError, CpuQuota, QuotaSet, remove_stale  # noqa: E402
from growth import W, figure, panel  # noqa: E402
from harness import (AMQPBENCH_SRC, ROOT, amqpbench, build_amqpbench, children, cpu_seconds, fresh_hutch, free_port,  # noqa: E402
                     listening_pid, log, machine, revision, tcp_socket_inodes, wait_serving)
from results_table import median  # noqa: E402

SPREAD = "--queues 16 --producers 16 --consumers 16"


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    args: str


WORKLOADS = (
    Workload("autoack", "16 B, autoack", "--size 16 --autoack"),
    Workload("confirms", "1 KiB persistent, confirms",
             "--size 1024 --persistent --confirm 100 --prefetch 100 --multi-ack-every 10"),
)
# The targets: N shards / 1 shard, hutch / RabbitMQ at every equal quota, a hop's CPU.
SPEEDUP_TARGET = {2: 1.7, 4: 3.0}
RABBITMQ_TARGET = 2.0
HOP_TARGET = 1.6
LOCAL_SHARE = 0.9  # one shard did this much of the shards' CPU: the publish did not hop
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


# --- processes ------------------------------------------------------------------------------

def connection_holder(port: int, pids: list[int]) -> int | None:
    """Which of `pids` holds the established TCP connections to `port` now (the one client
    connection of a hop run: its shard), or None when none or several do."""
    inodes = tcp_socket_inodes(port, "01")
    holders = set()
    for pid in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in inodes:
                    holders.add(pid)
                    break
            except OSError:
                pass
    return holders.pop() if len(holders) == 1 else None


def hutch_has_shards() -> bool:
    """Whether this checkout's hutch-server takes --shards."""
    out = subprocess.run([sys.executable, "-m", "cli.server", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    return "--shards" in out.stdout


@dataclass
class Running:
    """A broker and its cgroups: where it listens, the pid amqpbench samples, every process it
    runs now (`processes`, re-read at each call), its shard processes, the cgroups with the cores
    each gets under quota, and (hutch) the shard placement to redo before a run."""
    broker: str
    uri: str
    pid: int
    processes: Callable[[], list[int]]
    shards: Callable[[], list[int]]
    quotas: list[tuple[CpuQuota, float]]
    place: Callable[[], None] = lambda: None

    def limit(self, on: bool) -> None:
        for group, cores in self.quotas:
            group.set(cores if on else None)


def place_shards(supervisor: int, groups: list[CpuQuota]) -> None:
    """One shard per group: a shard is born in the supervisor's group (the first); every shard
    there but one moves to a group that holds no shard (at start, or after a restart)."""
    shards = children(supervisor)
    if len(groups) < 2:
        return
    members = {g.name: set(g.pids()) for g in groups}
    free = [g for g in groups[1:] if not members[g.name] & set(shards)]
    crowded = [pid for pid in shards if pid in members[groups[0].name]][1:]
    for pid, group in zip(crowded, free):
        group.add(pid)


def _kill_left(quotas: QuotaSet) -> None:
    """SIGKILL what the broker left in its groups after its stop (processes this script started)."""
    for group in quotas.groups:
        for pid in group.pids():
            try:
                with open("/proc/%d/comm" % pid) as f:
                    if f.read().strip() == "epmd":
                        continue  # Erlang's port mapper, shared by every node: left running
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@contextmanager
def hutch_running(extra: list[str], shards: int, cores: float, sharding: bool) -> Iterator[Running]:
    with QuotaSet() as quotas:
        first = quotas.new("hutch-1")
        try:
            flags = list(extra) + (["--shards", str(shards)] if sharding else [])
            with fresh_hutch(flags, preexec=first.enter) as h:
                groups = [first] + [quotas.new("hutch-%d" % (i + 1)) for i in range(1, shards)]
                deadline = time.monotonic() + 60
                while shards > 1 and len(children(h.pid)) < shards:
                    if time.monotonic() > deadline:
                        raise RuntimeError("hutch --shards %d: %d shard processes after 60 s"
                                           % (shards, len(children(h.pid))))
                    time.sleep(0.1)
                place_shards(h.pid, groups)
                if shards > 1:
                    serving_on_every_shard(h.uri, shards)
                yield Running("hutch", h.uri, h.pid, lambda: [h.pid] + children(h.pid),
                              lambda: children(h.pid) if shards > 1 else [h.pid], [(g, cores) for g in groups],
                              lambda: place_shards(h.pid, groups))
        finally:
            _kill_left(quotas)


def serving_on_every_shard(uri: str, shards: int, timeout: float = 60) -> None:
    """Until every shard serves (a shard that is still starting gets neither connections nor
    queues): connections until each shard's index was seen in their `shard` server property."""
    import pika

    seen: set = set()
    deadline = time.monotonic() + timeout
    while len(seen) < shards:
        if time.monotonic() > deadline:
            raise RuntimeError("hutch --shards %d: only shards %s serve after %d s" % (shards, sorted(seen), timeout))
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        seen.add(connection._impl.server_properties.get("shard"))
        connection.close()


RABBITMQ_CONF = """listeners.tcp.default = 127.0.0.1:{port}
log.file.level = warning
"""


def rabbitmq_node_env(base: str, name: str, port: int, schedulers: int, home: str | None = None) -> dict:
    """The environment of a RabbitMQ node of its own (module doc) with its files under `base`:
    its listener on `port`, no plugins, `schedulers` schedulers; HOME (where the Erlang cookie
    is) `home`, by default `base`."""
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, "rabbitmq.conf"), "w") as f:
        f.write(RABBITMQ_CONF.format(port=port))
    with open(os.path.join(base, "enabled_plugins"), "w") as f:
        f.write("[].\n")
    open(os.path.join(base, "rabbitmq-env.conf"), "w").close()  # not /etc/rabbitmq's
    return dict(os.environ, HOME=home or base,  # the node's .erlang.cookie goes there, not to root's home
                RABBITMQ_NODENAME="%s@%s" % (name, socket.gethostname().split(".")[0]),
                RABBITMQ_NODE_PORT=str(port), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_DIST_PORT=str(free_port()),
                RABBITMQ_MNESIA_BASE=os.path.join(base, "mnesia"), RABBITMQ_LOG_BASE=os.path.join(base, "log"),
                RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(base, "enabled_plugins"),
                RABBITMQ_CONFIG_FILE=os.path.join(base, "rabbitmq"),
                RABBITMQ_ADVANCED_CONFIG_FILE=os.path.join(base, "advanced.config"),
                RABBITMQ_CONF_ENV_FILE=os.path.join(base, "rabbitmq-env.conf"),
                RABBITMQ_PID_FILE=os.path.join(base, "pid"),
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S %d:%d" % (schedulers, schedulers))


@contextmanager
def rabbitmq_node(env: dict, group: CpuQuota, port: int) -> Iterator[int]:
    """A RabbitMQ node started with `env` inside `group`; its beam's pid once it serves on `port`."""
    base = os.path.dirname(env["RABBITMQ_CONFIG_FILE"])
    with open(os.path.join(base, "server.out"), "ab") as out:
        proc = subprocess.Popen([RABBITMQ_SERVER], env=env, cwd=base, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=group.enter)
    try:
        wait_serving(port, proc, 300)
        pid = listening_pid(port)
        if pid is None:
            raise RuntimeError("no process listens on RabbitMQ's port %d" % port)
        yield pid
    finally:
        proc.terminate()  # the script's trap stops the node (SIGTERM to beam.smp)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            log("RabbitMQ did not stop within 120 s: killed")


@contextmanager
def rabbitmq_running(schedulers: int, cores: float) -> Iterator[Running]:
    """A RabbitMQ node of its own (module doc) in one cgroup of `cores`, `schedulers` schedulers."""
    if not os.access(RABBITMQ_SERVER, os.X_OK):
        raise RuntimeError("%s not found (apt-get install -y rabbitmq-server)" % RABBITMQ_SERVER)
    base = tempfile.mkdtemp(prefix="rabbitmq-scale-")
    port = free_port()
    env = rabbitmq_node_env(base, "hutch-scale-%d-%d" % (os.getpid(), schedulers), port, schedulers)
    try:
        with QuotaSet() as quotas:
            group = quotas.new("rabbitmq")
            try:
                with rabbitmq_node(env, group, port) as pid:
                    log("RabbitMQ node %s (%s) on port %d, pid %d" % (
                        env["RABBITMQ_NODENAME"], env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"], port, pid))
                    yield Running("RabbitMQ", "amqp://guest:guest@127.0.0.1:%d/%%2f" % port, pid, group.pids,
                                  lambda: [pid], [(group, cores)])
            finally:
                _kill_left(quotas)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- measuring ------------------------------------------------------------------------------

class CpuWindow:
    """The broker's CPU over amqpbench's measured window: `begin()` (called when amqpbench says
    its warm-up is over) starts a thread that samples the CPU seconds of the broker's processes
    0.5 s later and again 0.5 s before the window's end, and the share of the quota's periods in
    which its cgroups were throttled (their quota ran out); it lifts the quotas
    (`running.limit(False)`) 0.2 s after the window's end, or when the run ends first. `probe`,
    when given, is read at both samples too: `probe_rate` is its change per second (timed by its
    answers, which a busy broker may give late)."""

    def __init__(self, running: Running, duration: float, probe: Callable[[], float] | None = None) -> None:
        self.running, self.duration, self.probe = running, duration, probe
        self.probe_rate: float | None = None
        self.groups = [g for g, _cores in running.quotas]
        self.per_process: dict[int, float] | None = None
        self.throttled: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> tuple[float, dict[int, float], tuple[int, int]]:
        now = time.monotonic()
        cpu = {p: c for p in self.running.processes() if (c := cpu_seconds(p)) is not None}
        throttled = [g.throttled() for g in self.groups]
        return now, cpu, (sum(t[0] for t in throttled), sum(t[1] for t in throttled))

    def _run(self) -> None:
        try:
            if self._stop.wait(0.5):
                return
            t0, before, throttled0 = self._sample()
            probed0 = (self.probe(), time.monotonic()) if self.probe else None
            if self._stop.wait(self.duration - 1.0 - (time.monotonic() - t0)):
                return
            probed1 = (self.probe(), time.monotonic()) if self.probe else None
            t1, after, throttled1 = self._sample()
            if probed0 and probed1:
                self.probe_rate = (probed1[0] - probed0[0]) / (probed1[1] - probed0[1])
            self.per_process = {p: (after[p] - before[p]) / (t1 - t0) for p in after if p in before}
            periods = throttled1[0] - throttled0[0]
            self.throttled = (throttled1[1] - throttled0[1]) / periods if periods else None
            self._stop.wait(0.7)
        finally:
            self.running.limit(False)

    def begin(self) -> None:
        self._thread.start()

    @property
    def cores(self) -> float | None:
        return sum(self.per_process.values()) if self.per_process is not None else None

    def __enter__(self) -> "CpuWindow":
        return self

    def __exit__(self, *exc) -> None:
        if self._thread.ident is not None:  # begun
            self._stop.set()
            self._thread.join()
        else:
            self.running.limit(False)


def measure(settings: argparse.Namespace, running: Running, args: list[str],
            probe: Callable[[], float] | None = None) -> tuple[dict, CpuWindow]:
    """One amqpbench run of --warmup + --duration s with `args`; its results and the broker's CPU
    (and `probe`'s rate) over the measured window."""
    running.place()
    running.limit(True)
    window = CpuWindow(running, settings.duration, probe)
    with window:
        out = amqpbench(settings.generator, running.uri,
                        ["--time", "%g" % settings.duration, "--warmup", "%g" % settings.warmup, *args],
                        running.pid, timeout=settings.duration + settings.warmup + 600,
                        when=("[warm-up done", window.begin))
    return out, window


def workload_run(settings: argparse.Namespace, running: Running, workload: Workload, shards: int) -> dict:
    name = "scale-%s-%d-%d" % (workload.key, shards, os.getpid())
    out, window = measure(settings, running, ["--queue", name, "--label", name, *SPREAD.split(),
                                              *workload.args.split()])
    rate, cores = out["consume_rate"], window.cores
    shard_pids = running.shards()
    return {"consumed": rate, "published": out.get("publish_rate"), "confirmed": out.get("confirm_rate"),
            "broker_cores": cores, "cpu_us": cores * 1e6 / rate if cores is not None and rate else None,
            "per_process_cores": {str(p): c for p, c in (window.per_process or {}).items()},
            "shard_pids": shard_pids, "throttled": window.throttled,
            "amqpbench": out}


def hop_runs(settings: argparse.Namespace, sharding: bool) -> dict:
    """--hop (module doc): local and cross-shard publishes' broker CPU, classified run by run."""
    import pika

    runs = []
    shards = settings.hop_shards if sharding else 1
    # Moves off: a publisher bound for another shard's queue would move there and hop no more.
    flags = list(settings.hutch_arg) + (["--shard-moves", "false"] if sharding else [])
    with hutch_running(flags, shards, settings.quota, sharding) as running:
        port = urllib.parse.urlparse(running.uri).port
        for i in range(settings.hop_runs):
            name = "scale-hop-%d-%d" % (os.getpid(), i)
            declaring = pika.BlockingConnection(pika.URLParameters(running.uri))
            capped = {} if settings.hop_queue == "grow" else {"x-max-length": 1000, "x-overflow": settings.hop_queue}
            declaring.channel().queue_declare(name, arguments=capped)
            declaring.close()

            senders = []

            def depth() -> int:
                """The queue's message count, as the broker answers a passive declare; first, the
                shard holding the producer's connection (the only one open at that moment)."""
                senders.append(connection_holder(port, running.shards()))
                conn = pika.BlockingConnection(pika.URLParameters(running.uri))
                try:
                    return conn.channel().queue_declare(name, passive=True).method.message_count
                finally:
                    conn.close()

            grows = settings.hop_queue == "grow"
            try:
                out, window = measure(settings, running, ["--queue", name, "--predeclared", "--producers", "1",
                                                          "--consumers", "0", "--size", "16"], depth if grows else None)
            finally:
                deleting = pika.BlockingConnection(pika.URLParameters(running.uri))
                deleting.channel().queue_delete(name)
                deleting.close()
            # A growing queue's depth counts what reached the queue, wherever it lives (a publish
            # accepted but still on its way to another shard is not there yet); a capped one's
            # cannot, so amqpbench's send rate it is.
            rate, sent, per = (window.probe_rate if grows else out["publish_rate"]), out["publish_rate"], \
                window.per_process or {}
            shard_cores = [per.get(p, 0.0) for p in running.shards()]
            share = max(shard_cores) / sum(shard_cores) if sum(shard_cores) else None
            kind = ("unmeasured" if window.per_process is None or not rate or share is None else
                    "local" if shards == 1 or share >= LOCAL_SHARE else "cross")
            sender = senders[0] if senders and len(set(senders)) == 1 else None
            if kind == "cross" and sender is not None:
                # The shard that took the connection may accept publishes faster than the queue's
                # owner takes them (they wait between the two): its CPU per message it read, plus
                # the others' per message that reached the queue.
                cpu = per.get(sender, 0.0) * 1e6 / sent + (window.cores - per.get(sender, 0.0)) * 1e6 / rate
            elif kind == "cross":
                kind, cpu = "unmeasured", None  # whose connection it was is not known
            else:
                cpu = window.cores * 1e6 / rate if window.cores is not None and rate else None
            log("hop run %d: %s (busiest shard %s of the shards' CPU), %.0f publishes/s into the queue (%.0f sent), "
                "%s µs each" % (i + 1, kind, "-" if share is None else "%.0f %%" % (100 * share), rate or 0,
                                sent or 0, "-" if cpu is None else "%.2f" % cpu))
            runs.append({"kind": kind, "busiest_share": share, "enqueued": rate, "sent": sent, "cpu_us": cpu,
                         "shard_cores": shard_cores, "sender": sender, "shard_pids": running.shards(),
                         "amqpbench": out})
    local = median([r["cpu_us"] for r in runs if r["kind"] == "local"])
    cross = median([r["cpu_us"] for r in runs if r["kind"] == "cross"])
    return {"shards": shards, "runs": runs, "local_cpu_us": local, "cross_cpu_us": cross,
            "cross_over_local": cross / local if local and cross else None}


# --- results --------------------------------------------------------------------------------

def _fmt(v: float | None, digits: str = "%.0f") -> str:
    if v is None:
        return "-"
    return "{:,}".format(round(v)) if digits == "%.0f" else digits % v


def summary(results: dict) -> list[dict]:
    """A row per workload and shard count: medians, N / 1 for both brokers, hutch / RabbitMQ."""
    rows = []
    for w in WORKLOADS:
        if w.key not in results["runs"]:
            continue
        per_broker = results["runs"][w.key]
        base = {}
        for n in results["shards"]:
            row = {"workload": w.key, "title": w.title, "shards": n, "quota": n * results["quota"]}
            for broker in ("hutch", "RabbitMQ"):
                runs = [r for r in per_broker.get(broker, {}).get(str(n), []) if r]
                rate, cpu = median([r.get("consumed") for r in runs]), median([r.get("cpu_us") for r in runs])
                if n == results["shards"][0] and n == 1:
                    base[broker] = rate
                row[broker] = rate
                row[broker + "_cpu_us"] = cpu
                row[broker + "_speedup"] = rate / base[broker] if rate and base.get(broker) else None
            row["ratio"] = row["hutch"] / row["RabbitMQ"] if row["hutch"] and row["RabbitMQ"] else None
            rows.append(row)
    return rows


def _verdict(value: float | None, target: float | None) -> str:
    if value is None or target is None:
        return ""
    return " (>= %g: %s)" % (target, "met" if value >= target else "missed")


def table(results: dict) -> str:
    lines = [] if not results["runs"] else [
        "| workload | N | quota, cores | hutch msg/s | hutch CPU µs/msg | hutch N / 1 | RabbitMQ msg/s "
        "| RabbitMQ CPU µs/msg | RabbitMQ N / 1 | hutch / RabbitMQ |", "|" + "---|" * 10]
    for r in summary(results):
        lines.append("| %s | %d | %g | %s | %s | %s%s | %s | %s | %s | %s%s |" % (
            r["title"], r["shards"], r["quota"], _fmt(r["hutch"]), _fmt(r["hutch_cpu_us"], "%.2f"),
            _fmt(r["hutch_speedup"], "%.2f"), _verdict(r["hutch_speedup"], SPEEDUP_TARGET.get(r["shards"])),
            _fmt(r["RabbitMQ"]), _fmt(r["RabbitMQ_cpu_us"], "%.2f"), _fmt(r["RabbitMQ_speedup"], "%.2f"),
            _fmt(r["ratio"], "%.2f"), _verdict(r["ratio"], RABBITMQ_TARGET)))
    cluster = results.get("cluster")
    if cluster:
        from scale_cluster import CLUSTER_TARGET

        rates = {k: median([r.get("consumed") for r in runs if r]) for k, runs in cluster["runs"].items()}
        cpu = {k: median([r.get("cpu_us") for r in runs if r]) for k, runs in cluster["runs"].items()}
        theirs = {k: median([r.get("consumed") for r in runs if r]) for k, runs in cluster.get("rabbitmq", {}).items()}
        base, their_base = rates.get("1"), theirs.get("1")
        for k in cluster["nodes"]:
            rate, their = rates.get(str(k)), theirs.get(str(k))
            speedup = rate / base if rate and base else None
            lines.append("cluster of %d node(s), %g core each, confirms: %s msg/s, %s broker CPU µs/msg, "
                         "K / 1 node %s%s; RabbitMQ (quorum queues) %s msg/s, K / 1 node %s; hutch / RabbitMQ %s" % (
                             k, cluster["quota"], _fmt(rate), _fmt(cpu.get(str(k)), "%.2f"), _fmt(speedup, "%.2f"),
                             _verdict(speedup, CLUSTER_TARGET.get(k)), _fmt(their),
                             _fmt(their / their_base if their and their_base else None, "%.2f"),
                             _fmt(rate / their if rate and their else None, "%.2f")))
            kills = [r["failover"] for r in cluster["runs"][str(k)] if r and "failover" in r]
            if kills:
                served = [f.get("served_after_s") for f in kills]
                worst = None if None in served else max(served)
                left = median([f.get("left", {}).get("consumed") for f in kills])
                lines.append("  its leader SIGKILLed (%d run(s)): every queue served again after %s s (worst; "
                             "<= %g: %s); the %d left: %s msg/s" % (
                                 len(kills), " / ".join(_fmt(t, "%.2f") for t in served), kills[0]["target_s"],
                                 "met" if worst is not None and worst <= kills[0]["target_s"] else "missed",
                                 k - 1, _fmt(left)))
    hop = results.get("hop")
    if hop:
        kinds = [r["kind"] for r in hop["runs"]]
        ratio = hop["cross_over_local"]
        verdict = "" if ratio is None else " (<= %g: %s)" % (HOP_TARGET, "met" if ratio <= HOP_TARGET else "missed")
        lines.append("hop (%d shards, %d runs: %d local, %d cross, %d unmeasured): broker CPU µs per publish "
                     "local %s, cross %s, cross / local %s%s" % (
                         hop["shards"], len(kinds), kinds.count("local"), kinds.count("cross"),
                         kinds.count("unmeasured"), _fmt(hop["local_cpu_us"], "%.2f"),
                         _fmt(hop["cross_cpu_us"], "%.2f"), _fmt(ratio, "%.2f"), verdict))
    return "\n".join(lines)


def render(results: dict, path: str) -> str:
    """Throughput against shards, a panel per workload, hutch and RabbitMQ (growth.py's charts)."""
    body = []
    for i, w in enumerate(WORKLOADS):
        per_broker = results["runs"].get(w.key, {})
        series = {b: [(int(n), rate) for n in results["shards"]
                      if (rate := median([r.get("consumed") for r in per_broker.get(b, {}).get(str(n), []) if r]))]
                  for b in ("hutch", "RabbitMQ")}
        body += panel(series, "N: shards, schedulers; quota N x %g core" % results["quota"],
                      "msg/s, %s" % w.title, i * W)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(figure(body, len(WORKLOADS)))
    return path


def render_cluster(results: dict, path: str) -> str:
    """--cluster: msg/s and broker CPU µs per message against nodes, hutch and RabbitMQ."""
    cluster = results["cluster"]
    panels = []
    for i, (field, title) in enumerate((("consumed", "msg/s, 1 KiB persistent, confirms"),
                                        ("cpu_us", "broker CPU µs per message"))):
        series = {broker: [(k, value) for k in cluster["nodes"] if (value := median(
            [r.get(field) for r in cluster.get(key, {}).get(str(k), []) if r and r.get(field)]))]
                  for broker, key in (("hutch", "runs"), ("RabbitMQ", "rabbitmq"))}
        panels += panel(series, "nodes; %g core per node, %d shard(s) per hutch node" % (
            cluster["quota"], cluster.get("shards", 1)), title, i * W)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(figure(panels, 2))
    return path


# --- main -----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", metavar="PATH", help="amqpbench binary (default: build it from %s)" % AMQPBENCH_SRC)
    p.add_argument("--shards", default="1,2,4", help="shard counts (and RabbitMQ's schedulers), default 1,2,4")
    p.add_argument("--quota", type=float, default=0.25, help="cores per shard (default 0.25)")
    p.add_argument("--workloads", default=",".join(w.key for w in WORKLOADS))
    p.add_argument("--duration", type=float, default=20, help="measured seconds of a run (default 20)")
    p.add_argument("--warmup", type=float, default=5, help="seconds before the measured window (default 5)")
    p.add_argument("--repeat", type=int, default=1, help="runs per point; the table shows the median")
    p.add_argument("--no-rabbitmq", action="store_true", help="measure hutch only")
    p.add_argument("--hutch-arg", action="append", default=[], help="extra hutch flag (repeatable)")
    p.add_argument("--hop", action="store_true", help="measure the CPU of a cross-shard publish instead")
    p.add_argument("--hop-shards", type=int, default=2)
    p.add_argument("--hop-runs", type=int, default=8)
    p.add_argument("--hop-queue", default="grow", choices=("grow", "reject-publish", "drop-head"),
                   help="the hop runs' queue: grows through the run (default), or capped at 1000 messages")
    p.add_argument("--cluster", metavar="NODES", help="measure clusters of these node counts instead, e.g. 1,3")
    p.add_argument("--cluster-shards", type=int, default=1, metavar="S",
                   help="with --cluster: shards per node, each shard's leader where its group prefers (default 1)")
    p.add_argument("--cluster-locator", choices=("balanced", "client-local"), default="balanced",
                   help="with --cluster: where hutch places each node's queues (default balanced, hutch's default; "
                        "client-local: on a shard the declaring node leads, as RabbitMQ's quorum queues here)")
    p.add_argument("--json-out", metavar="FILE", help="write every run's figures as JSON (after every run)")
    p.add_argument("--svg", metavar="FILE", help="draw throughput against shards (or nodes, with --cluster) into FILE")
    p.add_argument("--render", metavar="JSON", help="only draw --svg from a saved --json-out")
    args = p.parse_args(argv)
    try:
        args.shards = sorted({int(n) for n in args.shards.split(",") if n.strip()})
    except ValueError:
        p.error("--shards takes comma-separated counts, e.g. 1,2,4")
    if not args.shards or min(args.shards) < 1 or args.quota <= 0:
        p.error("--shards counts and --quota must be positive")
    unknown = set(args.workloads.split(",")) - {w.key for w in WORKLOADS}
    if unknown:
        p.error("unknown workload(s) %s; known: %s" % (", ".join(sorted(unknown)), ", ".join(w.key for w in WORKLOADS)))
    if args.cluster is not None:
        try:
            args.cluster = sorted({int(n) for n in args.cluster.split(",") if n.strip()})
        except ValueError:
            p.error("--cluster takes comma-separated node counts, e.g. 1,3")
        if not args.cluster or min(args.cluster) < 1:
            p.error("--cluster node counts must be positive")
    if args.duration < 2 or args.warmup <= 0:
        p.error("--duration must be at least 2 s (the CPU window leaves 0.5 s at each end) and --warmup more "
                "than 0 (the window starts when amqpbench says its warm-up is over)")
    return args


def _save(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=str)


def run(args: argparse.Namespace) -> dict:
    sharding = hutch_has_shards()
    results = {"command": " ".join(["python"] + sys.argv), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": machine(), "revision": revision(), "quota": args.quota, "shards": args.shards,
               "hutch_shards_option": sharding, "rabbitmq_erl_args": "+S N:N", "runs": {}, "notes": []}
    if not sharding and max(args.shards) > 1:
        note = "this hutch has no --shards option: hutch runs at N = 1 only, RabbitMQ at every N"
        log(note)
        results["notes"].append(note)
    if args.hop:
        results["hop"] = hop_runs(args, sharding)
        _save(results, args.json_out)
        return results
    if args.cluster:
        results["cluster"] = cluster_runs(args, results)
        return results
    wanted = [w for w in WORKLOADS if w.key in args.workloads.split(",")]
    for w in wanted:
        results["runs"][w.key] = {"hutch": {str(n): [] for n in args.shards}, "RabbitMQ": {str(n): [] for n in args.shards}}
    for repeat in range(args.repeat):
        for n in args.shards:
            if sharding or n == 1:
                for w in wanted:
                    log("repeat %d/%d: %s on hutch, %d shard(s) at %g core each" % (repeat + 1, args.repeat, w.key, n,
                                                                                    args.quota))
                    try:
                        with hutch_running(args.hutch_arg, n, args.quota, sharding) as running:
                            point = workload_run(args, running, w, n)
                    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                        log("failed: %s" % exc)
                        point = {"error": str(exc)[-1000:]}
                    _log_point(w, "hutch", n, point)
                    results["runs"][w.key]["hutch"][str(n)].append(point)
                    _save(results, args.json_out)
            if args.no_rabbitmq:
                continue
            log("repeat %d/%d: RabbitMQ, %d scheduler(s), quota %g" % (repeat + 1, args.repeat, n, n * args.quota))
            try:
                with rabbitmq_running(n, n * args.quota) as running:
                    for w in wanted:
                        try:
                            point = workload_run(args, running, w, n)
                        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                            log("failed: %s" % exc)
                            point = {"error": str(exc)[-1000:]}
                        _log_point(w, "RabbitMQ", n, point)
                        results["runs"][w.key]["RabbitMQ"][str(n)].append(point)
                        _save(results, args.json_out)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log("RabbitMQ with %d schedulers failed: %s" % (n, exc))
                results["notes"].append("RabbitMQ with %d schedulers: %s" % (n, str(exc)[-300:]))
    return results


def cluster_runs(args: argparse.Namespace, results: dict) -> dict:
    """--cluster (bench/scale_cluster.py): the confirms workload on clusters of each node count."""
    from scale_cluster import (cluster_run, cluster_running, declare_client_local, declare_quorum, failover_run,
                               rabbitmq_cluster_running)

    workload = next(w for w in WORKLOADS if w.key == "confirms")
    cluster = results["cluster"] = {"nodes": args.cluster, "quota": args.quota, "shards": args.cluster_shards,
                                    "locator": args.cluster_locator,
                                    "runs": {str(k): [] for k in args.cluster},
                                    "rabbitmq": {str(k): [] for k in args.cluster}}
    for repeat in range(args.repeat):
        for k in args.cluster:
            log("repeat %d/%d: a cluster of %d node(s) at %g core each" % (repeat + 1, args.repeat, k, args.quota))
            try:
                with cluster_running(args.hutch_arg, k, args.quota, args.cluster_shards) as (running, members, etcd):
                    local = args.cluster_locator == "client-local"
                    point = cluster_run(args, running, members, workload, declare=declare_client_local if local else None)
                    _log_point(workload, "a %d-node cluster" % k, k, point)
                    if k > 1 and "error" not in point:
                        point["failover"] = failover_run(args, running, members, etcd, workload)
                        _log_point(workload, "the %d node(s) left" % (k - 1), k - 1, point["failover"].get("left", {}))
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log("failed: %s" % exc)
                point = {"error": str(exc)[-1000:]}
            cluster["runs"][str(k)].append(point)
            _save(results, args.json_out)
            if args.no_rabbitmq:
                continue
            log("repeat %d/%d: a RabbitMQ cluster of %d node(s) at %g core each, quorum queues" % (
                repeat + 1, args.repeat, k, args.quota))
            try:
                with rabbitmq_cluster_running(k, args.quota) as (running, members):
                    point = cluster_run(args, running, members, workload, declare=declare_quorum)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log("failed: %s" % exc)
                point = {"error": str(exc)[-1000:]}
            _log_point(workload, "a %d-node RabbitMQ cluster" % k, k, point)
            cluster["rabbitmq"][str(k)].append(point)
            _save(results, args.json_out)
    return cluster


def _log_point(w: Workload, broker: str, n: int, point: dict) -> None:
    if point.get("consumed") is not None:
        log("%s on %s, N = %d: %.0f msg/s, broker %.2f cores, %s µs/msg, throttled in %s %% of the periods" % (
            w.key, broker, n, point["consumed"], point["broker_cores"] or 0, _fmt(point["cpu_us"], "%.2f"),
            _fmt(None if point["throttled"] is None else 100 * point["throttled"])))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            saved = json.load(f)
        draw = render_cluster if "cluster" in saved else render
        print(draw(saved, args.svg or "throughput.svg"))
        return 0
    # SIGTERM as Ctrl-C: the finally blocks stop the brokers and remove the cgroups.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for name in remove_stale():
            log("removed the cgroup %s left by an earlier run" % name)
        with QuotaSet() as probe:
            probe.new("probe").set(args.quota)
    except CgroupError as exc:
        sys.exit("scale.py needs cgroups it can write (root): %s" % exc)
    args.generator = args.generator or build_amqpbench(AMQPBENCH_SRC)
    results = run(args)
    _save(results, args.json_out)
    print("%s; %s; hutch %s; quota %g core per %s; %s; %d run(s) per figure, median shown\n" % (
        results["started"], results["machine"], results["revision"], args.quota,
        "node" if args.cluster else "shard", "hutch only" if args.no_rabbitmq
        else "RabbitMQ +S 1:1 per node" if args.cluster else "RabbitMQ " + results["rabbitmq_erl_args"], args.repeat))
    print("`%s`\n" % results["command"])
    print(table(results))
    for note in results["notes"]:
        print("\n- " + note)
    if args.svg and not args.hop:
        log("chart written to %s" % (render_cluster if args.cluster else render)(results, args.svg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
