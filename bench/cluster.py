#!/usr/bin/env python3
"""The cluster's costs and failover (docs/cluster.md), on loopback with a real etcd.

    python bench/cluster.py failover --kills 50      # SIGKILL the leader 50 times under confirmed load
    python bench/cluster.py s3 --duration 20         # S3 on one node vs on a 3-node cluster (amqpbench)
    python bench/cluster.py join --gib 2             # an empty follower joins a leader holding 2 GiB

failover: three nodes (tests/cluster_kit.py) under the tests' confirmed persistent publisher and
consumer (clients on every node, reconnecting to the next when their connection ends). Each round
kills the leader with SIGKILL, measures the failover time (the kill to the first publish the
new leader confirms), restarts the killed node and waits until all three are in sync again. At the
end every confirmed message must have been consumed; prints the failover time p50/p99, duplicate
deliveries, and the peak RSS of each node (the leader and the followers). The failover time ends
at the first confirm on a publisher connection opened after the kill: it includes the client's
reconnection (it retries every 0.1 s, to the next node).

s3: the performance issue's S3 (persistent 1 KiB, confirms window 100, prefetch 100, multi-ack
every 10) from amqpbench against one plain node, then against the leader of a 3-node cluster.
Reports consumed msg/s and the CPU time per message of the leader and of each follower (from
/proc/PID/stat: comparable on a loaded machine, unlike wall-clock rates).

join: one node leads alone and is given GIB GiB of persistent 1 MiB messages (confirmed); then an
empty node joins. Reports the leader's RSS before the join and its peak during it (sampled every
50 ms), the time until the follower is in sync, and the bytes it received. The bound the
replication keeps towards a follower (docs/cluster.md, "Bounded memory") is what the peak minus
the baseline shows.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

from cluster_kit import (EtcdProcess, Load, free_ports, in_sync, leader_of, make_nodes, port_open,  # noqa: E402
                         started, until)
from harness import AMQPBENCH_SRC, amqpbench, build_amqpbench, cpu_seconds, rss_bytes  # noqa: E402


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class PeakRss(threading.Thread):
    """The highest RSS seen per node name, sampled every 0.2 s (pids change across restarts)."""

    def __init__(self, nodes) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.peak: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            for node in self.nodes:
                if node.running():
                    rss = rss_bytes(node.process.pid) or 0
                    self.peak[node.name] = max(self.peak.get(node.name, 0), rss)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def failover(args) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="hutch-cluster-bench-"))
    etcd = EtcdProcess(tmp).start()
    nodes = make_nodes(tmp, etcd.url, 3)
    sampler = PeakRss(nodes)
    times: list[float] = []
    try:
        with started(etcd, nodes):
            sampler.start()
            load = Load([n.url for n in nodes]).start()
            stamps = load.confirm_times
            load.progress(500, 60, "confirms before the first kill")
            for round_number in range(1, args.kills + 1):
                leader = leader_of(etcd, nodes)
                before = len(stamps)
                killed_at = time.monotonic()
                leader.kill()
                # the first confirm on a connection opened after the kill (a confirm the old leader
                # sent just before dying may still be read after it)
                first = until(lambda: next((t for t, opened in stamps[before:] if opened > killed_at), None), 60,
                              "a confirm from the new leader")
                times.append(first - killed_at)
                leader.start()
                until(lambda: len(in_sync(etcd)) == 3, 120, "the killed node to be in sync again")
                load.progress(args.between, 60, "confirms between kills")
                log("kill %d: failover %.2f s" % (round_number, times[-1]))
            lost, duplicates = load.finish(120)
            sampler.stopping.set()
            result = {"kills": args.kills, "confirmed": len(set(load.confirmed)), "lost": len(lost),
                      "duplicates": duplicates, "failover_p50_s": round(statistics.median(times), 3),
                      "failover_p99_s": round(percentile(times, 0.99), 3), "failover_max_s": round(max(times), 3),
                      "peak_rss_mib": {name: round(value / 2**20, 1) for name, value in sorted(sampler.peak.items())}}
            print(json.dumps(result, indent=1))
            return 0 if not lost else 1
    finally:
        sampler.stopping.set()


S3 = "--size 1024 --prefetch 100 --multi-ack-every 10 --persistent --confirm 100"


def _run_s3(binary: str, url: str, leader_pid: int, pids: dict[str, int], args, name: str) -> dict:
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    out = amqpbench(binary, url, ["--time", str(args.duration), "--warmup", "2", "--queue", name, "--label", name,
                                  *S3.split()], leader_pid, timeout=args.duration + 600)
    used = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
    consumed = out["consume_rate"]
    count = max(out.get("consumed", 0) or consumed * args.duration, 1)
    return {"consumed_per_s": round(consumed), "cpu_us_per_message": {n: round(c * 1e6 / count, 1)
                                                                       for n, c in used.items()},
            "rss_mib": {n: round((rss_bytes(p) or 0) / 2**20, 1) for n, p in pids.items()}}


def s3(args) -> int:
    binary = args.amqpbench or build_amqpbench(AMQPBENCH_SRC)
    tmp = Path(tempfile.mkdtemp(prefix="hutch-cluster-s3-"))
    results = {}
    # one plain node, no cluster settings at all
    import subprocess

    port, http, prometheus = free_ports(3)
    single = subprocess.Popen([sys.executable, "-m", "cli.server", "--bind", "127.0.0.1", "--port", str(port),
                               "--management-port", str(http), "--prometheus-port", str(prometheus),
                               "--mqtt-enabled", "false", "--stream-enabled", "false", "--data-dir", str(tmp / "single")], cwd=ROOT,
                              stderr=subprocess.DEVNULL)
    try:
        until(lambda: os.path.exists(tmp / "single") and port_open(port), 30, "the single node")
        results["1 node"] = _run_s3(binary, "amqp://guest:guest@127.0.0.1:%d/%%2F" % port, single.pid,
                                    {"single": single.pid}, args, "s3-single")
    finally:
        single.terminate()
        single.wait(30)
    etcd = EtcdProcess(tmp).start()
    nodes = make_nodes(tmp, etcd.url, 3)
    with started(etcd, nodes):
        leader = leader_of(etcd, nodes)
        pids = {("leader " if n is leader else "follower ") + n.name: n.process.pid for n in nodes}
        results["3 nodes"] = _run_s3(binary, leader.url + "%2F", leader.process.pid, pids, args, "s3-cluster")
    print(json.dumps(results, indent=1))
    return 0


def join(args) -> int:
    import pika

    tmp = Path(tempfile.mkdtemp(prefix="hutch-cluster-join-"))
    etcd = EtcdProcess(tmp).start()
    leader, follower = make_nodes(tmp, etcd.url, 2)
    try:
        leader.start()
        until(leader.leads, 60, "the leader")
        body = os.urandom(1 << 20)
        started_at = time.monotonic()
        with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
            channel = connection.channel()
            channel.queue_declare("join-bench", durable=True)
            channel.confirm_delivery()
            for _ in range(args.gib * 1024):
                channel.basic_publish("", "join-bench", body, pika.BasicProperties(delivery_mode=2))
        log("published %d GiB in %.0f s" % (args.gib, time.monotonic() - started_at))
        baseline = rss_bytes(leader.process.pid)
        peak = baseline
        follower.start()
        started_at = time.monotonic()

        def joined() -> bool:
            nonlocal peak
            peak = max(peak, rss_bytes(leader.process.pid) or 0)
            return len(in_sync(etcd)) == 2

        until(joined, 3600, "the follower to join")
        took = time.monotonic() - started_at
        copied = sum(f.stat().st_size for f in Path(follower.data_dir).rglob("*") if f.is_file())
        result = {"gib": args.gib, "leader_rss_before_mib": baseline >> 20, "leader_rss_peak_mib": peak >> 20,
                  "growth_mib": (peak - baseline) >> 20, "join_seconds": round(took, 1),
                  "follower_bytes": copied}
        print(json.dumps(result, indent=1))
        return 0
    finally:
        follower.stop()
        leader.stop()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    kills = sub.add_parser("failover", help="SIGKILL the leader repeatedly under confirmed load")
    kills.add_argument("--kills", type=int, default=50)
    kills.add_argument("--between", type=int, default=300, help="confirms between two kills")
    bench = sub.add_parser("s3", help="S3 on one node and on a 3-node cluster")
    bench.add_argument("--duration", type=int, default=20)
    bench.add_argument("--amqpbench", default=None, help="a built amqpbench binary")
    joining = sub.add_parser("join", help="an empty follower joins a leader holding GIB GiB")
    joining.add_argument("--gib", type=int, default=2)
    args = parser.parse_args(argv)
    return {"failover": failover, "s3": s3, "join": join}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
