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

`links_past_the_lease` (tests/test_cluster_shards.py, issue 39) is the
etcd-minority cut seen by a consumer on another node: past its lease's
deadline, the cut-off leader of shard 0 hands its queue's messages to no
consumer elsewhere, though its links to the other nodes still work.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import netns
from cluster_kit import Load, shard_key, until
from partition_kit import AMQP_PORT, PASSWORD, REPLICATION_PORT, USER, EtcdMember, HutchNode, management_get

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

    def get(self, key: str, members: list[EtcdMember] | None = None) -> str | None:
        """etcd's value of `key` (a linearizable read by the first member that answers, of `members`
        if given), None if none does."""
        def read():
            body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
            for member in members or self.members:
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

    def etcd_leader(self) -> EtcdMember | None:
        """The member that leads etcd's own (raft) cluster, as the members say; None if none does."""
        def ask():
            ids, said = {}, set()
            for member in self.members:
                request = urllib.request.Request(member.url + "/v3/maintenance/status", b"{}")
                try:
                    with urllib.request.urlopen(request, timeout=1) as reply:
                        status = json.load(reply)
                    ids[str(status["header"]["member_id"])] = member
                    said.add(str(status["leader"]))
                except (OSError, KeyError, ValueError):
                    continue
            return ids.get(said.pop()) if len(said) == 1 else None
        return netns.run_in(self.client.namespace, ask)

    def api(self, node: HutchNode, path: str):
        """GET `path` of `node`'s management API (from the client namespace): the JSON, None on an error."""
        return netns.run_in(self.client.namespace, lambda: management_get(node, path))

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


# -- a shard leader past its lease, seen by a consumer on another node (issue 39) -------------------

# The struck leader's lease deadline is at most LEASE_TTL - margin (amqp_server/cluster/lease.py)
# after the last refresh etcd answered, sent before the cut: a message it gets this long after the
# cut (LEASE_TTL + PAST_LEASE_SLACK) came past its deadline, however loaded the machine (a message
# reaches it after the time stamped in it, never before).
PAST_LEASE_SLACK = 1.0
PAST_LEASE_RATE = 200  # messages a second into the struck leader's queue


def links_past_the_lease(tmp: Path, log=print) -> dict:
    """The etcd-minority cut of shard 0's leader (with an etcd member that does not lead etcd, so
    that no refresh sent after the cut can be answered) while a publisher in the client namespace
    sends into a queue of shard 0 through that node, each body "number time.time()", and a
    consumer reaches the queue through another node (its deliveries come over the links). It
    consumes once: all it gets until the broker cancels it (to its node's shard, shard 0's leader
    changed) came from the struck leader. The report's "late" counts those published past the
    struck leader's deadline (`PAST_LEASE_SLACK`): before issue 39's fix, its links served on for
    about three lease TTLs past the deadline, while shard 0 was led elsewhere."""
    import threading

    report: dict = {"problems": []}
    threads: list = []
    with spread_cluster(tmp) as cluster:
        by_name = {node.name: node for node in cluster.nodes}
        leaders = cluster.leaders()
        victim = by_name[leaders[0]]
        elsewhere = next(by_name[name] for name in leaders[1:] if name != victim.name)
        elsewhere_leads = leaders.index(elsewhere.name)
        queue = _queue_led_by(cluster, victim, 0)
        published: list[float] = []
        delivered: list[float] = []  # the publish times of what the consumer got
        ended: dict = {}
        stop = threading.Event()

        def publish() -> None:
            try:
                connection = _served_by_leader(victim, 0, heartbeat=60)  # held output must not end it
                channel = connection.channel()
                number = 0
                while not stop.is_set():
                    number += 1
                    stamp = time.time()
                    channel.basic_publish("", queue, b"%d %.6f" % (number, stamp))
                    published.append(stamp)
                    time.sleep(1 / PAST_LEASE_RATE)
                connection.close()
            except Exception as exc:  # noqa: BLE001 - said in the report
                ended.setdefault("publisher", (time.time(), repr(exc)))

        def consume() -> None:
            try:
                connection = _served_by_leader(elsewhere, elsewhere_leads)
                channel = connection.channel()
                channel.basic_qos(prefetch_count=100)

                def on_message(ch, method, _properties, body) -> None:
                    delivered.append(float(body.split()[1]))
                    ch.basic_ack(method.delivery_tag)

                channel.basic_consume(queue, on_message)
                while not stop.is_set() and channel.consumer_tags:
                    connection.process_data_events(time_limit=0.05)
                ended.setdefault("consumer", (time.time(), "stopped" if channel.consumer_tags else "cancelled"))
                connection.close()
            except Exception as exc:  # noqa: BLE001 - said in the report
                ended.setdefault("consumer", (time.time(), repr(exc)))

        threads += [netns.Thread(cluster.client.namespace, publish, "publisher"),
                    netns.Thread(cluster.client.namespace, consume, "consumer")]
        for thread in threads:
            thread.start()
        try:
            until(lambda: len(delivered) >= 100 or ended, 60,
                  "%s's deliveries from %s's queue" % (elsewhere.name, victim.name))
            # not etcd's own leader on the minority side: cut from its majority, it may answer keep-alives
            # until it steps down (an election timeout), so refreshes sent after the cut would count
            etcd_leader = cluster.etcd_leader()
            minority = next(m for m in reversed(cluster.members) if m is not etcd_leader)
            majority = [m for m in cluster.members if m is not minority]
            log("cutting %s and %s from %s (etcd leader %s); consumer on %s" % (
                victim.name, minority.host.name, ", ".join(m.host.name for m in majority),
                etcd_leader.host.name if etcd_leader else None, elsewhere.name))
            cluster.net.cut([victim.name, minority.host.name], [m.host.name for m in majority])
            cut = time.time()  # every rule in: no refresh sent later reaches etcd's majority
            until(lambda: cluster.get(shard_key(0, "leader"), majority) not in (None, victim.name), 30,
                  "shard 0 led elsewhere")
            elected = time.time()
            until(lambda: "consumer" in ended, 30, "the consumer on %s to end" % elsewhere.name)
        except BaseException:
            for node in cluster.nodes:
                log("===== %s\n%s" % (node.name, node.log[-20000:]))
            raise
        finally:
            stop.set()
            for thread in threads:
                thread.join(2)
        consumer_end, how = ended["consumer"]
        threshold = cut + LEASE_TTL + PAST_LEASE_SLACK
        late = sorted(stamp for stamp in delivered if stamp > threshold)
        report.update({
            "victim": victim.name, "consumer_on": elsewhere.name, "queue": queue,
            "etcd_minority": minority.host.name,
            "new_leader": cluster.get(shard_key(0, "leader"), majority), "elected_after_s": round(elected - cut, 2),
            "consumer_ended_after_s": round(consumer_end - cut, 2), "consumer_ended": how,
            "delivered": len(delivered), "delivered_before_cut": sum(1 for stamp in delivered if stamp <= cut),
            "last_delivered_published_after_s": round(max(delivered) - cut, 2) if delivered else None,
            "published_past_threshold": sum(1 for stamp in published if threshold < stamp < consumer_end),
            "late": len(late),
            "publisher_ended": ended["publisher"][1] if "publisher" in ended else None,
            "publisher_ended_after_s": round(ended["publisher"][0] - cut, 2) if "publisher" in ended else None})
        if late:
            report["problems"].append(
                "the consumer on %s got %d messages published into %s's queue %.2f to %.2f s after the cut, "
                "past its lease (%d s) and %.1f s more" % (elsewhere.name, len(late), victim.name, late[0] - cut,
                                                           late[-1] - cut, LEASE_TTL, PAST_LEASE_SLACK))
        if how != "cancelled":
            report["problems"].append("the consumer on %s ended by %s, not by a cancel" % (elsewhere.name, how))
        if not report["delivered_before_cut"]:
            report["problems"].append("nothing reached the consumer on %s before the cut" % elsewhere.name)
        if not report["published_past_threshold"]:
            report["problems"].append("nothing was published into %s past its deadline while the consumer "
                                      "consumed: nothing shown" % victim.name)
        report["logs"] = {node.name: node.log for node in cluster.nodes}
    for thread in threads:
        thread.join(10)
    return report


def _queue_led_by(cluster: Spread, node: HutchNode, shard: int) -> str:
    """A new quorum queue on `shard`, declared client-local through `node`, which leads it (each
    connection lands on any of the node's shard processes: a follower sends it to the shard the
    node leads once it has seen which)."""
    import pika

    attempts = iter(range(1000))

    def declare() -> str | None:
        name = "past-lease-%d" % next(attempts)

        def declared() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(node.url))
            try:
                connection.channel().queue_declare(name, durable=True, arguments={
                    **ARGUMENTS, "x-queue-leader-locator": "client-local"})
            finally:
                connection.close()

        netns.run_in(cluster.client.namespace, declared)
        row = cluster.api(node, "/api/queues/%2F/" + name) or {}
        return name if row.get("shard") == shard else None

    return until(declare, 30, "a queue of shard %d declared through %s" % (shard, node.name))


def _served_by_leader(node: HutchNode, shard: int, heartbeat: int | None = None):
    """A pika connection to `node` served by its leader of `shard` itself, not forwarded to it by
    one of the node's followers (the kernel hands a connection to any of the node's shard
    processes): a follower ends the connections it forwards when its own group changes leader
    (amqp_server/cluster/proxy.py), which the cut makes happen. The leader's process is the one
    listening on its group's replication port; the process holding the connection's socket on
    the node tells."""
    import pika

    leader = _pids(node, "-tlnp", "sport", "=", ":%d" % (REPLICATION_PORT + shard))
    for _ in range(40):
        params = pika.URLParameters(node.url)
        if heartbeat is not None:
            params.heartbeat = heartbeat
        connection = pika.BlockingConnection(params)
        port = connection._impl._transport._sock.getsockname()[1]
        holder = _pids(node, "-tnp", "state", "established", "sport", "=", ":%d" % AMQP_PORT, "dport", "=",
                       ":%d" % port)
        if holder and holder <= leader:
            return connection
        connection.close()
    raise AssertionError("no connection to %s served by its leader of shard %d (pids %s)" % (node.name, shard, leader))


def _pids(node: HutchNode, *ss: str) -> set[int]:
    """The processes holding the sockets `ss` lists in `node`'s namespace."""
    listed = subprocess.run(node.host.command(["ss", "-H", *ss]), capture_output=True, text=True, timeout=10).stdout
    return {int(pid) for pid in re.findall(r"pid=(\d+)", listed)}
