"""Partitions of a cluster whose shard leaders are spread (docs/scaling.md,
"Shards in a cluster"): three etcd members, three hutch nodes of three
shards each (n1, n2, n3 lead shards 0, 1, 2) and the clients, each in a
network namespace of its own (tests/netns.py), under confirmed persistent
publishing and consuming on a queue of every shard through every node.

Faults, each on the node leading the named shard, healed before the next:
- "isolated" (shard 1's leader): cut from everything; shard 1 moves to
  another node, the other shards stay where they are, and every queue
  confirms again before the cut heals;
- "cut-from-nodes" (shard 2's leader): cut from the other hutch nodes only,
  not from etcd or the clients: it keeps its lease and shard 2, and goes on
  confirming with its followers dropped from the in-sync set;
- "etcd-minority" (shard 0's leader): it and the etcd member e1 cut from the
  etcd majority (e2, e3): its leases end, shard 0 moves, and every queue
  confirms again before the cut heals.
After each: every group in sync again and the load going on everywhere. At
the end: no confirmed message lost on any queue.

tests/test_cluster_shards.py runs "isolated" (the short version);
bench/partitions_spread.py runs them all.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import urllib.request
from pathlib import Path

import netns
from cluster_kit import Load, shard_key, until
from partition_kit import PASSWORD, USER, EtcdMember, HutchNode

SHARDS = 3
FAULTS = ("isolated", "cut-from-nodes", "etcd-minority")
ARGUMENTS = {"x-queue-type": "quorum"}
LEASE_TTL = 2
# A link (or a replication stream) that brings nothing for this long is taken for lost: shorter
# than the namespaces' TCP timeout (tcp_retries2 5, about 13 s), so the heartbeats find a cut first.
REPLICATION_TIMEOUT = 4
# The shard whose leader each fault strikes (they lead one each: n1 0, n2 1, n3 2).
STRUCK = {"isolated": 1, "cut-from-nodes": 2, "etcd-minority": 0}


def missing() -> str | None:
    """Why the harness cannot run here, or None."""
    tools = netns.missing_tools()
    if tools or os.geteuid() != 0:
        return "network namespaces need root and %s" % (", ".join(tools) or "nothing else")
    return None


@contextlib.contextmanager
def spread_cluster(tmp: Path):
    """A started Spread, closed on leaving (also after a failed start)."""
    cluster = Spread(tmp)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


class Spread:
    """The namespaces, etcd members and nodes of one run."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.net: netns.Network | None = None
        self.members: list[EtcdMember] = []
        self.nodes: list[HutchNode] = []

    def start(self) -> None:
        self.net = net = netns.Network()
        etcd_hosts = [net.add("e%d" % number, 20 + number) for number in (1, 2, 3)]
        hosts = [net.add("n%d" % number, 10 + number) for number in (1, 2, 3)]
        self.client = net.add("client", 100)
        peers = ",".join("%s=http://%s:2380" % (h.name, h.address) for h in etcd_hosts)
        self.members = [EtcdMember(host, peers, self.tmp / host.name) for host in etcd_hosts]
        for member in self.members:
            member.start()
        urls = ",".join(member.url for member in self.members)
        self.nodes = [HutchNode(host, self.tmp / host.name, urls, LEASE_TTL, extra=(
            "--shards", str(SHARDS), "--cluster-replication-timeout", str(REPLICATION_TIMEOUT))) for host in hosts]
        for node in self.nodes:
            node.start()
        until(self.all_in_sync, 90, "every shard's group in sync")

    def close(self) -> None:
        for node in self.nodes:
            node.stop()
        for member in self.members:
            member.stop()
        if self.net is not None:
            self.net.close()

    def get(self, key: str) -> str | None:
        """etcd's value of `key` (a linearizable read by the first member that answers), None if none does."""
        def read():
            body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
            for member in self.members:
                request = urllib.request.Request(member.url + "/v3/kv/range", body)
                try:
                    with urllib.request.urlopen(request, timeout=1) as reply:
                        kvs = json.load(reply).get("kvs")
                except OSError:
                    continue
                return base64.b64decode(kvs[0]["value"]).decode() if kvs else None
            return None
        try:
            return netns.run_in(self.client.namespace, read)
        except OSError:
            return None

    def leaders(self) -> list[str | None]:
        return [self.get(shard_key(shard, "leader")) for shard in range(SHARDS)]

    def in_sync(self, shard: int) -> set[str]:
        return set(json.loads(self.get(shard_key(shard, "in_sync")) or "[]"))

    def all_in_sync(self) -> bool:
        return all(self.in_sync(shard) == {"n1", "n2", "n3"} for shard in range(SHARDS))

    def urls(self) -> list[str]:
        return ["amqp://%s:%s@%s:5672/" % (USER, PASSWORD, node.host.address) for node in self.nodes]


def run(tmp: Path, faults=FAULTS, log=print) -> dict:
    """Every fault in turn under load; the report, its "problems" empty when nothing was wrong."""
    report: dict = {"faults": [], "problems": []}
    with spread_cluster(tmp) as cluster:
        if sorted(cluster.leaders()) != ["n1", "n2", "n3"]:
            report["problems"].append("the leaders did not spread: %s" % cluster.leaders())
        urls = cluster.urls()
        loads = [Load(urls[n:] + urls[:n], "spread-%d" % n, ARGUMENTS, cluster.client.namespace).start()
                 for n in range(SHARDS)]
        try:
            for load in loads:
                load.progress(100, 60, "confirms on %s" % load.queue)
            for kind in faults:
                report["faults"].append(_fault(cluster, loads, kind, log))
        except BaseException:
            for node in cluster.nodes:  # what each node said, for the failure's report
                log("===== %s\n%s" % (node.name, node.log[-20000:]))
            raise
        finally:
            for load in loads:
                lost, duplicates = load.finish(120)
                report.setdefault("queues", []).append({"queue": load.queue, "confirmed": len(set(load.confirmed)),
                                                        "lost": len(lost), "duplicates": duplicates})
                if lost:
                    report["problems"].append("%s: %d confirmed messages lost" % (load.queue, len(lost)))
        report["logs"] = {node.name: node.log for node in cluster.nodes}
    return report


def _fault(cluster: Spread, loads: list[Load], kind: str, log) -> dict:
    net, before = cluster.net, cluster.leaders()
    shard = STRUCK[kind]
    victim = before[shard]
    others = [n.name for n in cluster.nodes if n.name != victim]
    confirmed = [len(load.confirmed) for load in loads]
    begun = time.monotonic()
    fault = {"kind": kind, "victim": victim, "shard": shard, "leaders_before": before}
    log("%s: %s (leading shard %d)" % (kind, victim, shard))
    if kind == "isolated":
        net.isolate(victim)
        until(lambda: cluster.leaders()[shard] not in (None, victim), 30, "shard %d led elsewhere" % shard)
        _going_on(loads, kind)
    elif kind == "cut-from-nodes":
        net.cut([victim], others)
        # its leases hold (etcd is reachable): it keeps shard 2, and drops the followers it cannot hear
        until(lambda: cluster.in_sync(shard) == {victim}, 30, "shard %d's leader alone in sync" % shard)
        time.sleep(2)
    elif kind == "etcd-minority":
        net.cut([victim, "e1"], ["e2", "e3"])
        until(lambda: cluster.leaders()[shard] not in (None, victim), 30, "shard %d led elsewhere" % shard)
        _going_on(loads, kind)
    fault["moved"] = [k for k, name in enumerate(cluster.leaders()) if name != before[k]]
    fault["during"] = [len(load.confirmed) - n for load, n in zip(loads, confirmed)]
    net.heal()
    fault["healed_after_s"] = round(time.monotonic() - begun, 2)
    until(cluster.all_in_sync, 120, "every group in sync after healing %s" % kind)
    fault["in_sync_after_s"] = round(time.monotonic() - begun, 2)
    for load in loads:
        load.progress(50, 90, "confirms on %s after %s" % (load.queue, kind))
    log("%s: shards moved %s, confirms during %s, in sync again %.1f s after the cut" % (
        kind, fault["moved"], fault["during"], fault["in_sync_after_s"]))
    return fault


def _going_on(loads: list[Load], kind: str) -> None:
    """Every queue confirms again while the fault holds: its load's clients reach it through the
    nodes left (each reconnects to the next node when its own was cut off)."""
    for load in loads:
        load.progress(20, 60, "confirms on %s while %s" % (load.queue, kind))
