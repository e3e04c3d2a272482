"""bench/scale.py --cluster: throughput against nodes (issue 32, "How it is shown").

A cluster of K hutch nodes (tests/cluster_kit.py: a real etcd on loopback, n1 seeded so it founds
the cluster and leads first, every node in sync before a run), each node's processes in one
cgroup with --quota cores, etcd and the load generator outside any quota. The workload is the
issue's: persistent 1 KiB messages with confirms and manual acks (scale.py's "confirms"), 16
queues, 16 producers and 16 consumers in all, spread over the nodes: node i gets its share of
them (6, 5, 5 on three nodes) on queues of its own, driven by an amqpbench of its own connected
to it, so every node takes clients. The figure is the sum of the amqpbench processes' consumed
msg/s over the same measured window, and the CPU of every node's processes over it.

On a cluster of more than one node each run goes on with the issue's kill: SIGKILL the leader (every
node and etcd stay as they were otherwise), then the time until each of 16 durable queues, given a
confirmed message before the kill, is served again through a node left (a passive declare shows
its message, and a get returns it), probed in turn every 0.1 s, against the lease plus 2 s; then
the workload again on the nodes left, spread over them.

RabbitMQ runs beside it (rabbitmq_cluster_running): as many RabbitMQ 3.10 nodes of their own,
each in a cgroup of --quota with one scheduler, joined into a cluster, the same workload on quorum
queues declared through the node whose amqpbench uses them (3.10 leads a quorum queue where it is
declared by default). It is not killed: the kill is hutch's failover bound.

What a node does with a client is the cluster's business: today a follower forwards the whole
connection to the leader (docs/cluster.md, "Forwarding"), so every queue lives on the one leader
and K nodes do one node's work; issue 32 spreads shard leaders over the nodes.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from cpu_quota import QuotaSet
from harness import ROOT, amqpbench, children, free_port, log
from scale import CpuWindow, Running

sys.path.insert(0, os.path.join(ROOT, "tests"))

from cluster_kit import (EtcdProcess, free_port_run, groups_in_sync, leader_of, make_nodes, seed,  # noqa: E402
                         shard_leaders, started, until)

URI = "amqp://guest:guest@127.0.0.1:%d/%%2f"  # amqpbench's form of the default vhost
LEASE_TTL = 2.0  # seconds: tests/cluster_kit.py's nodes
SERVED_TARGET = LEASE_TTL + 2.0  # the issue's: every queue served again within the lease plus 2 s
SPREAD_TOTAL = 16  # queues, producers and consumers in all
CLUSTER_TARGET = {3: 2.5}  # K nodes / 1 node, the issue's


def shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as it goes, the larger shares first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@contextmanager
def cluster_running(extra: list[str], nodes: int, cores: float,
                    shards: int = 1) -> Iterator[tuple[Running, list, EtcdProcess]]:
    """(a scale.Running for the whole cluster, its nodes, etcd): `nodes` nodes in sync, a leader
    serving. `shards` > 1: each node runs that many shards, each shard's group led where it
    prefers (the nodes start empty, so each group is founded by its node: docs/scaling.md)."""
    tmp = Path(tempfile.mkdtemp(prefix="hutch-scale-cluster-"))
    try:
        with QuotaSet() as quotas:
            groups = [quotas.new("node-%d" % (i + 1)) for i in range(nodes)]
            etcd = EtcdProcess(tmp)
            members = make_nodes(tmp, etcd.url, nodes, *extra, *(["--shards", str(shards)] if shards > 1 else []))
            if shards > 1:
                for node in members:
                    node.ports["replication"] = free_port_run(shards)
            else:
                seed(members[0])
            etcd.start()
            with started(etcd, members):
                if shards > 1:
                    until(lambda: groups_in_sync(etcd, [n.name for n in members], shards), 120,
                          "every shard's group in sync")
                    log("shard leaders: %s" % ", ".join(shard_leaders(etcd, shards)))

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
                first = leader or members[0]
                running = Running("hutch cluster", URI % first.port, first.process.pid, processes,
                                  lambda: [n.process.pid for n in members], [(g, cores) for g in groups], place)
                yield running, members, etcd
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cluster_run(settings: argparse.Namespace, running: Running, members: list, workload, label: str = "",
                declare=None) -> dict:
    """One run: an amqpbench per running node at once, each with its share of the queues and
    clients; `declare(node, queue names)`, when given, declares them first (amqpbench then does not)."""
    alive = [i for i, node in enumerate(members) if node.running()]
    groups = [running.quotas[i][0] for i in alive]
    members = [members[i] for i in alive]
    parts = shares(SPREAD_TOTAL, len(members))
    names = ["scale-cluster%s-%d-%s-%d" % (label, len(members), node.name, os.getpid()) for node in members]
    if declare is not None:
        for node, name, count in zip(members, names, parts):
            declare(node, ["%s-%d" % (name, j + 1) for j in range(count)])
    running.place()
    running.limit(True)
    window = CpuWindow(running, settings.duration)
    node_of = {pid: i for i, group in enumerate(groups) for pid in group.pids()}
    outs: list[dict | None] = [None] * len(members)
    errors: list[str] = []
    begun = threading.Lock()

    def begin() -> None:
        if begun.acquire(blocking=False):  # the first amqpbench past its warm-up starts the window
            window.begin()

    def drive(i: int) -> None:
        name = names[i]
        try:
            outs[i] = amqpbench(settings.generator, URI % members[i].port,
                                ["--time", "%g" % settings.duration, "--warmup", "%g" % settings.warmup,
                                 "--queue", name, "--label", name, "--queues", str(parts[i]),
                                 "--producers", str(parts[i]), "--consumers", str(parts[i]),
                                 *workload.args.split(), *(["--predeclared"] if declare else [])],
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


def failover_run(settings: argparse.Namespace, running: Running, members: list, etcd: EtcdProcess,
                 workload) -> dict:
    """The issue's kill (module doc): how long until every queue is served again, and the
    throughput of the nodes left."""
    import pika

    leader = leader_of(etcd, members)
    if leader is None:
        return {"error": "no leader to kill"}
    names = ["scale-failover-%d-%d" % (os.getpid(), i) for i in range(SPREAD_TOTAL)]
    with pika.BlockingConnection(pika.URLParameters(URI % leader.port)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for name in names:
            channel.queue_declare(name, durable=True)
            channel.basic_publish("", name, b"kept", pika.BasicProperties(delivery_mode=2))
    left = [node for node in members if node is not leader]
    killed_at = time.monotonic()
    leader.crash()
    waiting, turn = list(names), 0
    while waiting and time.monotonic() - killed_at < 60:
        node = left[turn % len(left)]
        turn += 1
        try:
            with pika.BlockingConnection(pika.URLParameters(URI % node.port + "?socket_timeout=1&"
                                                            "blocked_connection_timeout=1")) as connection:
                channel = connection.channel()
                while waiting:
                    if channel.queue_declare(waiting[0], passive=True).method.message_count != 1:
                        break
                    method, _props, body = channel.basic_get(waiting[0], auto_ack=False)
                    if method is None or body != b"kept":
                        break
                    channel.basic_nack(method.delivery_tag, requeue=True)
                    waiting.pop(0)
        except pika.exceptions.AMQPError:
            pass  # not served yet there: a follower forwarding to no leader, a node promoting
        if waiting:
            time.sleep(0.1)
    served = time.monotonic() - killed_at if not waiting else None
    log("leader %s SIGKILLed: %s" % (leader.name, "every queue served again after %.2f s" % served if served
                                     else "%d queue(s) not served after 60 s" % len(waiting)))
    point = {"killed": leader.name, "served_after_s": served, "target_s": SERVED_TARGET,
             "not_served": len(waiting)}
    if served is not None:
        # Measured once the nodes left are a cluster again: all in sync with the new leader.
        try:
            until(lambda: groups_in_sync(etcd, [node.name for node in left], settings.cluster_shards), 60,
                  "the nodes left in sync")
        except AssertionError as exc:
            point["left"] = {"error": str(exc)}
            return point
        point["left"] = cluster_run(settings, running, members, workload, "-left", declare=declare_client_local
                                    if getattr(settings, "cluster_locator", "balanced") == "client-local" else None)
    return point


# --- RabbitMQ: a cluster of its own, quorum queues ---------------------------------------------

class RabbitNode:
    """A node of rabbitmq_cluster_running, as cluster_run sees a member."""

    def __init__(self, name: str, port: int, pid: int) -> None:
        self.name, self.port, self.pid = name, port, pid

    def running(self) -> bool:
        return os.path.exists("/proc/%d" % self.pid)


def declare_quorum(node: RabbitNode, names: list[str]) -> None:
    """Quorum queues declared through `node`: their leaders are there (RabbitMQ 3.10's
    queue-leader-locator is client-local by default)."""
    import pika

    with pika.BlockingConnection(pika.URLParameters(URI % node.port)) as connection:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})


def declare_client_local(node, names: list[str]) -> None:
    """hutch's queues declared through `node` with the client-local leader locator: each on a
    shard that node leads (docs/scaling.md), as RabbitMQ's quorum queues above are led where
    declared. Classic, as amqpbench declares them itself (so x-queue-master-locator)."""
    import pika

    with pika.BlockingConnection(pika.URLParameters(URI % node.port)) as connection:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True, arguments={"x-queue-master-locator": "client-local"})


@contextmanager
def rabbitmq_cluster_running(nodes: int, cores: float) -> Iterator[tuple[Running, list[RabbitNode]]]:
    """RabbitMQ 3.10 nodes of their own (scale.rabbitmq_node_env: free ports, their own files),
    each in a cgroup of `cores` with one scheduler, joined into one cluster (rabbitmqctl
    join_cluster) sharing one Erlang cookie."""
    from scale import RABBITMQ_SERVER, _kill_left, rabbitmq_node, rabbitmq_node_env

    if not os.access(RABBITMQ_SERVER, os.X_OK):
        raise RuntimeError("%s not found (apt-get install -y rabbitmq-server)" % RABBITMQ_SERVER)
    base = tempfile.mkdtemp(prefix="rabbitmq-scale-cluster-")
    cookie = os.path.join(base, ".erlang.cookie")
    with open(cookie, "w") as f:
        f.write(secrets.token_hex(16))
    os.chmod(cookie, 0o400)
    ctl = os.path.join(os.path.dirname(RABBITMQ_SERVER), "rabbitmqctl")
    try:
        with QuotaSet() as quotas, ExitStack() as stack:
            groups = [quotas.new("rabbit-%d" % (i + 1)) for i in range(nodes)]
            try:
                members, envs = [], []
                for i, group in enumerate(groups):
                    port = free_port()
                    env = rabbitmq_node_env(os.path.join(base, "r%d" % (i + 1)),
                                            "hutch-scale-%d-r%d" % (os.getpid(), i + 1), port, 1, home=base)
                    pid = stack.enter_context(rabbitmq_node(env, group, port))
                    members.append(RabbitNode(env["RABBITMQ_NODENAME"], port, pid))
                    envs.append(env)
                for node, env in zip(members[1:], envs[1:]):
                    for command in (["stop_app"], ["join_cluster", members[0].name], ["start_app"]):
                        subprocess.run([ctl, "-n", node.name, *command], env=env, check=True,
                                       capture_output=True, timeout=120)
                log("RabbitMQ cluster of %d: %s" % (nodes, ", ".join("%s pid %d" % (n.name, n.pid) for n in members)))
                yield Running("RabbitMQ cluster", URI % members[0].port, members[0].pid,
                              lambda: [pid for g in groups for pid in g.pids()], lambda: [n.pid for n in members],
                              [(g, cores) for g in groups]), members
            finally:
                stack.close()
                _kill_left(quotas)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError("rabbitmqctl %s: %s" % (" ".join(exc.cmd[1:]), (exc.stderr or b"").decode()[-500:]))
    finally:
        shutil.rmtree(base, ignore_errors=True)
