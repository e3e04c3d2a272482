"""bench/scale.py --cluster: throughput against nodes (issue 32, "How it is shown").

A cluster of K hutch nodes (tests/cluster_kit.py: a real etcd on loopback, n1 seeded so it founds
the cluster and leads first, every node in sync before a run), each node's processes in one
cgroup with --quota cores, etcd and the load generator outside any quota. The workload is the
issue's: persistent 1 KiB messages with confirms and manual acks (scale.py's "confirms"), 16
queues, 16 producers and 16 consumers in all, spread over the nodes: node i gets its share of
them (6, 5, 5 on three nodes) on queues of its own, driven by an amqpbench of its own connected
to it, so every node takes clients. The figure is the sum of the amqpbench processes' consumed
msg/s over the same measured window, and the CPU of every node's processes over it.

What a node does with a client is the cluster's business: today a follower forwards the whole
connection to the leader (docs/cluster.md, "Forwarding"), so every queue lives on the one leader
and K nodes do one node's work; issue 32 spreads shard leaders over the nodes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cpu_quota import QuotaSet
from harness import ROOT, amqpbench, children, log
from scale import CpuWindow, Running

sys.path.insert(0, os.path.join(ROOT, "tests"))

from cluster_kit import EtcdProcess, leader_of, make_nodes, seed, started  # noqa: E402

URI = "amqp://guest:guest@127.0.0.1:%d/%%2f"  # amqpbench's form of the default vhost
SPREAD_TOTAL = 16  # queues, producers and consumers in all
CLUSTER_TARGET = {3: 2.5}  # K nodes / 1 node, the issue's


def shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as it goes, the larger shares first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@contextmanager
def cluster_running(extra: list[str], nodes: int, cores: float) -> Iterator[tuple[Running, list]]:
    """(a scale.Running for the whole cluster, its nodes): `nodes` nodes in sync, a leader serving."""
    tmp = Path(tempfile.mkdtemp(prefix="hutch-scale-cluster-"))
    try:
        with QuotaSet() as quotas:
            groups = [quotas.new("node-%d" % (i + 1)) for i in range(nodes)]
            etcd = EtcdProcess(tmp)
            members = make_nodes(tmp, etcd.url, nodes, *extra)
            seed(members[0])
            etcd.start()
            with started(etcd, members):

                def processes() -> list[int]:
                    return [pid for node in members if node.running()
                            for pid in [node.process.pid] + children(node.process.pid)]

                def place() -> None:
                    """Each node's processes in its group (a node re-executes itself in place on a fence)."""
                    for node, group in zip(members, groups):
                        if node.running():
                            for pid in [node.process.pid] + children(node.process.pid):
                                group.add(pid)

                place()
                leader = leader_of(etcd, members)
                log("cluster of %d: %s leads; nodes %s" % (nodes, leader.name if leader else "none",
                                                           ", ".join("%s pid %d" % (n.name, n.process.pid)
                                                                     for n in members)))
                running = Running("hutch cluster", URI % (leader or members[0]).port,
                                       (leader or members[0]).process.pid, processes,
                                       lambda: [n.process.pid for n in members], [(g, cores) for g in groups], place)
                yield running, members
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cluster_run(settings: argparse.Namespace, running: Running, members: list, workload) -> dict:
    """One run: an amqpbench per node at once, each with its share of the queues and clients."""
    running.place()
    running.limit(True)
    window = CpuWindow(running, settings.duration)
    node_of = {pid: i for i, node in enumerate(members) for pid in [node.process.pid] + children(node.process.pid)}
    parts = shares(SPREAD_TOTAL, len(members))
    outs: list[dict | None] = [None] * len(members)
    errors: list[str] = []
    begun = threading.Lock()

    def begin() -> None:
        if begun.acquire(blocking=False):  # the first amqpbench past its warm-up starts the window
            window.begin()

    def drive(i: int) -> None:
        name = "scale-cluster-%d-%s-%d" % (len(members), members[i].name, os.getpid())
        try:
            outs[i] = amqpbench(settings.generator, URI % members[i].port,
                                ["--time", "%g" % settings.duration, "--warmup", "%g" % settings.warmup,
                                 "--queue", name, "--label", name, "--queues", str(parts[i]),
                                 "--producers", str(parts[i]), "--consumers", str(parts[i]),
                                 *workload.args.split()],
                                None, timeout=settings.duration + settings.warmup + 600,
                                when=("[warm-up done", begin))
        except Exception as exc:  # reported with the run
            errors.append("%s: %s" % (members[i].name, str(exc)[-500:]))

    with window:
        threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(members))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        return {"error": "; ".join(errors)}
    rate = sum(o["consume_rate"] for o in outs)
    cores = window.cores
    per = window.per_process or {}
    return {"consumed": rate, "per_node_consumed": [o["consume_rate"] for o in outs],
            "published": sum(o.get("publish_rate") or 0 for o in outs),
            "broker_cores": cores, "cpu_us": cores * 1e6 / rate if cores is not None and rate else None,
            "per_node_cores": [sum(c for p, c in per.items() if node_of.get(p) == i) for i in range(len(members))],
            "throttled": window.throttled, "amqpbench": outs}
