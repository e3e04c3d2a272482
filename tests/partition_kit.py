"""The partition harness: three hutch nodes and three etcd members, each in
its own network namespace (tests/netns.py), a client namespace for the
workload, the faults, and one run's report (checked by
tests/partition_history.py). Used by tests/test_cluster_partitions.py
(a short run) and bench/partitions.py (the long runs); docs/cluster.md
reports the results.

The hosts: n1..n3 (hutch, 10.231.0.11-13), e1..e3 (etcd, .21-.23) and
`client` (.100), where the harness's own threads run: the publisher, the
consumer, the etcd and management pollers. Each hutch node runs in its own
UTS namespace named after it, so a client sees which node serves its
connection in Connection.Start's cluster_name (hutch@n2), also through a
follower, which forwards the leader's bytes.

Each node's data directory is on a tmpfs of its own (DISK_MIB), so that a
disk can be filled (the `disk-full` fault) without touching the machine's.
"""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import netns
from helpers import wait_for
from partition_history import History, check
from server_process import ServerProcess, spawn

AMQP_PORT, HTTP_PORT, REPLICATION_PORT = 5672, 15672, 5679
USER = PASSWORD = "harness"  # guest may only connect over loopback
SECRET = "the-partition-harness-cluster-secret"  # cluster.secret of every node
QUEUE = "partition-load"
PROBE_QUEUE = "partition-probe"
PROBE = 10**9  # the probe publisher's numbers start above it
BALLAST_QUEUE = "partition-ballast"
DISK_MIB = 256
# pika logs every failed connection attempt as an error: the faults make many, on purpose
logging.getLogger("pika").setLevel(logging.CRITICAL)
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
FAULTS = ("leader-isolated", "leader-cut-from-followers", "follower-cut-long", "etcd-split", "clock-skew",
          "sigstop", "disk-full", "snapshot-kill")


def requirements_missing(faults=FAULTS) -> str | None:
    """Why the harness cannot run here, or None."""
    missing = netns.missing_tools()
    if "clock-skew" in faults and not os.path.exists(LIBFAKETIME):
        missing.append("libfaketime (Debian: faketime)")
    if missing:
        return "missing " + ", ".join(missing) + " (Debian: iproute2, nftables, util-linux, etcd-server, faketime)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def until(predicate, timeout: float, what: str, interval: float = 0.1):
    """helpers.wait_for, raising TimeoutError: a run goes on after a fault
    the cluster did not recover from, and the checker judges what happened."""
    return wait_for(predicate, timeout, interval, what, raising=TimeoutError)


# -- the processes -------------------------------------------------------------


@dataclass
class EtcdMember:
    host: netns.Host
    peers: str  # --initial-cluster
    data_dir: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return "http://%s:2379" % self.host.address

    def start(self) -> None:
        peer = "http://%s:2380" % self.host.address
        self.log = open(str(self.data_dir) + ".log", "a")
        self.process = subprocess.Popen(self.host.command(
            ["etcd", "--name", self.host.name, "--data-dir", str(self.data_dir),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.peers, "--initial-cluster-state", "new",
             "--initial-cluster-token", "hutch-partitions"]),
            stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@dataclass
class HutchNode(ServerProcess):
    host: netns.Host
    disk: Path  # a tmpfs mount point; the data directory is inside
    etcd_urls: str
    lease_ttl: int
    faketime: Path | None = None  # libfaketime's timestamp file, when the run skews clocks
    extra: tuple = ()  # more hutch-server arguments (tests/test_cluster_shards.py: --shards)
    process: subprocess.Popen | None = None
    log_lines: list = field(default_factory=list)

    stop_grace = 15.0

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def data_dir(self) -> Path:
        return self.disk / "data"

    @property
    def port(self) -> int:
        return AMQP_PORT

    @property
    def url(self) -> str:
        return "amqp://%s:%s@%s:%d/" % (USER, PASSWORD, self.host.address, AMQP_PORT)

    def start(self) -> "HutchNode":
        self.log_lines.append("---- start\n")
        address = self.host.address
        env = {"HUTCH_CLUSTER_SECRET": SECRET}
        if self.faketime is not None:
            # The wall clock follows the file (re-read every second); the monotonic clock, which the
            # lease's deadline is measured on, is left alone (see the clock-skew fault).
            env |= {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(self.faketime),
                   "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"}
        self.process = spawn(
            ["--bind", address, "--port", str(AMQP_PORT), "--management-bind", address,
             "--management-port", str(HTTP_PORT), "--prometheus-enabled", "false", "--mqtt-enabled", "false",
             "--data-dir", str(self.data_dir), "--default-user", USER, "--default-pass", PASSWORD,
             "--cluster-etcd", self.etcd_urls, "--cluster-node-name", self.name,
             "--cluster-replication-port", str(REPLICATION_PORT), "--cluster-advertise", address,
             "--cluster-lease-ttl", str(self.lease_ttl), *self.extra],
            self.log_lines, env=env, wrap=self.host.command([], hostname=self.name))
        return self


def _mount_tmpfs(path: Path, tag: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % DISK_MIB, tag, str(path)], check=True)


def _unmount_abandoned() -> None:
    """tmpfs mounts of harness runs whose process is gone."""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            source, target = line.split()[:2]
            if source.startswith(netns.PREFIX) and source[len(netns.PREFIX):].split("-")[0].isdigit():
                if not os.path.exists("/proc/" + source[len(netns.PREFIX):].split("-")[0]):
                    subprocess.run(["umount", "-l", target], capture_output=True)


# -- the cluster ---------------------------------------------------------------


class Cluster:
    """The namespaces, etcd members and hutch nodes of one run. A context
    manager: everything is stopped, unmounted and deleted on leaving, also
    after a failure."""

    def __init__(self, lease_ttl: int = 2, skew_clocks: bool = False, keep: Path | None = None) -> None:
        self.lease_ttl = lease_ttl
        self.skew_clocks = skew_clocks
        self.keep = keep  # copy the logs there at the end
        self.tmp = Path(tempfile.mkdtemp(prefix="hutch-partitions-"))
        self.net: netns.Network | None = None
        self.etcd: list[EtcdMember] = []
        self.nodes: list[HutchNode] = []
        self.mounts: list[Path] = []
        self.history = History()
        self.ballast = 0  # ballast messages confirmed (the snapshot-kill fault)
        self._polling = False
        self._answered: EtcdMember | None = None

    def __enter__(self) -> "Cluster":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        _unmount_abandoned()
        self.net = netns.Network()
        net = self.net
        for number in (1, 2, 3):
            net.add("e%d" % number, 20 + number)
            net.add("n%d" % number, 10 + number)
        self.client = net.add("client", 100)
        peers = ",".join("%s=http://%s:2380" % (h.name, h.address) for h in net.hosts.values() if h.name[0] == "e")
        for name in ("e1", "e2", "e3"):
            self.etcd.append(EtcdMember(net.hosts[name], peers, self.tmp / name))
        for member in self.etcd:
            member.start()
        urls = ",".join(member.url for member in self.etcd)
        for name in ("n1", "n2", "n3"):
            disk = self.tmp / (name + "-disk")
            _mount_tmpfs(disk, "%s-%s" % (net.tag, name))
            self.mounts.append(disk)
            faketime = None
            if self.skew_clocks:
                faketime = self.tmp / (name + ".faketime")
                faketime.write_text("+0\n")
            self.nodes.append(HutchNode(net.hosts[name], disk, urls, self.lease_ttl, faketime))
        until(lambda: self.etcd_get("health-check") is not False, 60, "etcd to answer")
        for node in self.nodes:
            node.start()
        self._polling = True
        netns.Thread(self.client.namespace, self._poll_terms, name="terms").start()
        self.wait_in_sync(90)

    def close(self) -> None:
        self._polling = False
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        for member in self.etcd:
            with contextlib.suppress(Exception):
                member.stop()
        if self.keep is not None:
            self.keep.mkdir(parents=True, exist_ok=True)
            for node in self.nodes:
                (self.keep / (node.name + ".log")).write_text(node.log)
            for member in self.etcd:
                with contextlib.suppress(OSError):
                    shutil.copy(str(member.data_dir) + ".log", self.keep / (member.host.name + ".log"))
        if self.net is not None:
            self.net.close()
        for mount in self.mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- looking at it (from the client namespace) ---------------------------------

    def inside(self, call, timeout: float = 30.0):
        return netns.run_in(self.client.namespace, call, timeout)

    def _etcd_range(self, key: str):
        """The key's (value, create revision) from the first etcd member that answers a
        linearizable read (a member cut from the majority does not); None when
        the key is absent; False when no member answers."""
        body = json.dumps({"key": base64.b64encode(("hutch/" + key).encode()).decode()}).encode()
        for member in sorted(self.etcd, key=lambda m: m is not self._answered):  # the last to answer first
            request = urllib.request.Request(member.url + "/v3/kv/range", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=1) as reply:
                    answer = json.load(reply)
            except (OSError, ValueError):
                continue
            self._answered = member
            if "kvs" not in answer:
                return None
            kv = answer["kvs"][0]
            return base64.b64decode(kv.get("value", "")).decode(), int(kv.get("create_revision", 0))
        return False

    def etcd_get(self, key: str):
        got = self.inside(lambda: self._etcd_range(key))
        return got if got in (None, False) else got[0]

    def _poll_terms(self) -> None:
        while self._polling:
            started = time.monotonic()
            got = self._etcd_range("leader")
            if got is not False:
                leader, term = got if got else (None, None)
                self.history.term_seen(leader, term, started)
            time.sleep(0.05)

    def leader(self) -> HutchNode | None:
        term = self.history.terms[-1] if self.history.terms else None
        return next((n for n in self.nodes if term is not None and n.name == term.leader), None)

    def followers(self) -> list[HutchNode]:
        leader = self.leader()
        return [n for n in self.nodes if n is not leader]

    def cluster_status(self, node: HutchNode) -> dict | None:
        return self.inside(lambda: management_get(node, "/api/hutch/cluster"))

    def all_in_sync(self) -> bool:
        """etcd's in-sync set names all three, and the leader lists each
        follower as in sync."""
        names = self.etcd_get("in_sync")
        leader = self.leader()
        if not names or len(json.loads(names)) != 3 or leader is None:
            return False
        status = self.cluster_status(leader)
        return bool(status) and status.get("leader") == leader.name and all(
            n["state"] in ("in sync", "leading") for n in status["nodes"])

    def wait_in_sync(self, timeout: float) -> float:
        start = time.monotonic()
        until(self.all_in_sync, timeout, "all three nodes in sync", interval=0.25)
        return time.monotonic() - start

    def node_urls(self) -> list[str]:
        return [node.url for node in self.nodes]


# -- the workload ------------------------------------------------------------------


def _serving_node(connection) -> str | None:
    name = (connection._impl.server_properties or {}).get("cluster_name", "")
    name = name.decode() if isinstance(name, bytes) else name
    return name.split("@", 1)[1] if "@" in name else None


class Workload:
    """Two confirmed persistent publishers (one message in flight each;
    numbers never reused), and a consumer with manual acks, each in a thread
    inside the client namespace, each reconnecting to the next node when its
    connection ends. Every operation goes into the history.

    One publisher's queue (QUEUE) is consumed as it goes: a message acked
    before its confirm was due is confirmed by the ack (docs/storage.md), so
    those confirms do not wait for the followers. The other's (PROBE_QUEUE,
    numbers from PROBE) is consumed only at the end (`drain`): each of its
    confirms waits for the in-sync followers, and its gaps are what the
    faults' failover times measure."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.history = cluster.history
        self.urls = cluster.node_urls()
        self.publishing = True
        self.consuming = True
        namespace = cluster.client.namespace
        self.publishers = [netns.Thread(namespace, lambda: self._publish(QUEUE, 0), name="publisher"),
                           netns.Thread(namespace, lambda: self._publish(PROBE_QUEUE, PROBE), name="prober")]
        self.consumers = [netns.Thread(namespace, lambda: self._consume(QUEUE), name="consumer")]

    def start(self) -> "Workload":
        for thread in self.publishers + self.consumers:
            thread.start()
        return self

    def _connect(self, turn: int, queue: str):
        import pika

        dialed = self.cluster.nodes[turn % len(self.urls)].name
        params = pika.URLParameters(self.urls[turn % len(self.urls)])
        params.socket_timeout = 3
        params.blocked_connection_timeout = 10
        params.heartbeat = 2
        params.connection_attempts = 1
        params.stack_timeout = 4  # a follower that cannot reach the leader never answers: try the next node
        connection = pika.BlockingConnection(params)
        conn = self.history.connection(_serving_node(connection), dialed)
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        return connection, channel, conn

    def _publish(self, queue: str, number: int) -> None:
        import pika

        turn = number % 3
        properties = pika.BasicProperties(delivery_mode=2)
        while self.publishing:
            conn, pending = None, None
            try:
                connection, channel, conn = self._connect(turn, queue)
                channel.confirm_delivery()
                while self.publishing:
                    number += 1
                    pending = number
                    self.history.record("send", conn=conn, number=number)
                    try:
                        channel.basic_publish("", queue, b"%d" % number, properties)
                    except pika.exceptions.NackError:
                        self.history.record("nack", conn=conn, number=number)
                    else:
                        self.history.record("confirm", conn=conn, number=number)
                    pending = None
                connection.close()
            except Exception:  # noqa: BLE001 - the connection ended: the pending publish is in doubt; next node
                if pending is not None:
                    self.history.record("unknown", conn=conn or 0, number=pending)
                turn += 1
                time.sleep(0.1)

    def _consume(self, queue: str) -> None:
        turn = 0
        while self.consuming:
            try:
                connection, channel, conn = self._connect(turn, queue)
                channel.basic_qos(prefetch_count=100)

                def on_message(ch, method, _properties, body, conn=conn):
                    number = int(body)
                    self.history.record("deliver", conn=conn, number=number, redelivered=method.redelivered)
                    ch.basic_ack(method.delivery_tag)
                    self.history.record("ack", conn=conn, number=number)

                channel.basic_consume(queue, on_message)
                while self.consuming:
                    connection.process_data_events(time_limit=0.2)
                    channel.basic_qos(prefetch_count=100)  # a round trip: the acks sent so far are handled
                    self.history.record("settle", conn=conn)
                connection.close()
            except Exception:  # noqa: BLE001 - reconnect to the next node
                turn += 1
                time.sleep(0.1)

    def probe_confirms(self) -> int:
        return sum(1 for op in self.history.ops if op.kind == "confirm" and op.number > PROBE)

    def progress(self, more: int, timeout: float, what: str) -> None:
        """Until `more` further probe messages (waiting for the followers) are confirmed."""
        target = self.probe_confirms() + more
        until(lambda: self.probe_confirms() >= target, timeout, what)

    def stop_publishing(self) -> None:
        self.publishing = False
        for thread in self.publishers:
            thread.join(30)

    def drain(self, timeout: float) -> None:
        """Consume the probe queue too, until every confirmed message has
        been delivered (or `timeout`)."""
        probe = netns.Thread(self.cluster.client.namespace, lambda: self._consume(PROBE_QUEUE), name="drain")
        probe.start()
        self.consumers.append(probe)
        confirmed = self.history.confirmed()
        with contextlib.suppress(TimeoutError):
            until(lambda: confirmed <= self.history.delivered(), timeout, "every confirmed message consumed")
        self.consuming = False
        for thread in self.consumers:
            thread.join(30)


# -- the faults ----------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    started: float = 0.0
    healed: float = 0.0
    leader_before: str | None = None
    leader_after: str | None = None
    elected_after: float | None = None  # seconds from the fault to a new term in etcd
    outage: float | None = None  # seconds from the fault to the first confirm of a publish sent after it
    longest_gap: float | None = None  # the longest time without a confirm, from the fault to the end of the resync
    in_sync_after: float | None = None  # seconds from healing until all three are in sync; None: never
    confirmed_during: bool = False  # a publish sent after the fault began was confirmed before it healed
    took_over: list = field(default_factory=list)  # the other nodes elected from the fault to the resync
    note: str = ""

    def summary(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()
                if k not in ("started", "healed")}


def inject(cluster: Cluster, workload: Workload, kind: str, resync_timeout: float = 60.0,
           cut_until_alone: bool = False) -> Fault:
    """One fault: wait until all three nodes are in sync and confirms flow,
    inflict it, hold it, heal it; measure the failover and the resync.
    `cut_until_alone`: hold leader-cut-from-followers only until the leader
    confirms without its followers (and 20 probe confirms more), at most
    the 20 s it is held otherwise (the short run of the tests)."""
    until(cluster.all_in_sync, 90, "all three nodes in sync before %s" % kind, interval=0.25)
    workload.progress(20, 60, "confirms before %s" % kind)
    fault = Fault(kind)
    leader = cluster.leader()
    fault.leader_before = leader.name
    followers = [n for n in cluster.nodes if n is not leader]
    net, ttl = cluster.net, cluster.lease_ttl
    past_lease = 2 * ttl + 2  # seconds: the lease has run out and another node leads
    terms_before = len(cluster.history.terms)
    fault.started = time.monotonic()  # again once the fault is complete (nft rules go in one host at a time)

    def begun() -> None:
        fault.started = time.monotonic()
        for host in _cut_from_client(net):
            cluster.history.record("cut", node=host)
    if kind == "leader-isolated":
        net.isolate(leader.name)
        begun()
        time.sleep(past_lease)
    elif kind == "leader-cut-from-followers":
        net.cut([leader.name], [f.name for f in followers])
        begun()
        if cut_until_alone:
            # what 20 s are for: the leader dropped its followers (max_lag_seconds) and confirms alone
            held_until = fault.started + 20
            with contextlib.suppress(TimeoutError):
                until(lambda: any(op.number > PROBE for op in workload.history.confirms_since(fault.started)),
                      20, "the cut leader to confirm alone")
                workload.progress(20, max(0.0, held_until - time.monotonic()), "the cut leader's confirms")
        else:
            time.sleep(20)  # past max_lag_seconds (5 s) for each follower: the leader goes on alone
    elif kind == "follower-cut-long":
        net.isolate(followers[0].name)
        begun()
        time.sleep(20)  # TCP gives up after ~13 s (tcp_retries2 5, tests/netns.py)
        fault.note = "cut " + followers[0].name
    elif kind == "etcd-split":
        # etcd splits 1 | 2; the leader reaches only the minority member, the followers only the majority
        net.cut(["e1"], ["e2", "e3"])
        net.cut([leader.name], ["e2", "e3"])
        net.cut([f.name for f in followers], ["e1"])
        begun()
        time.sleep(past_lease)
    elif kind == "clock-skew":
        # the leader's wall clock steps back an hour while it is cut from etcd: its lease's deadline is
        # measured on the monotonic clock, so it must still stop in time
        leader.faketime.write_text("-3600\n")
        net.cut([leader.name], ["e1", "e2", "e3"])
        begun()
        time.sleep(past_lease)
    elif kind == "sigstop":
        leader.signal(signal.SIGSTOP)
        time.sleep(past_lease)
        leader.signal(signal.SIGCONT)
    elif kind == "disk-full":
        target = followers[0]
        fault.note = "filled %s's disk" % target.name
        _fill(target.disk / "filler")
        begun()
        time.sleep(8)
    elif kind == "snapshot-kill":
        fault.note = _snapshot_kill(cluster, leader, followers[0], begun)
    else:
        raise ValueError("no such fault: %s" % kind)
    fault.healed = time.monotonic()
    cut = _cut_from_client(net)
    net.heal()
    for host in cut:
        cluster.history.record("mend", node=host)
    for node in cluster.nodes:  # as systemd's Restart=on-failure would
        if not node.running():
            fault.note += "; %s exited (status %s): restarted" % (node.name, node.process.returncode)
            node.start()
    if kind == "clock-skew":
        leader.faketime.write_text("+0\n")
    if kind == "disk-full":
        (followers[0].disk / "filler").unlink()
    with contextlib.suppress(TimeoutError):
        fault.in_sync_after = cluster.wait_in_sync(resync_timeout)
    new_terms = [t for t in cluster.history.terms[terms_before:] if t.leader is not None]
    if new_terms:
        fault.elected_after = new_terms[0].seen - fault.started
    fault.took_over = sorted({t.leader for t in new_terms} - {fault.leader_before})
    after = cluster.leader()
    fault.leader_after = after.name if after else None
    with contextlib.suppress(TimeoutError):
        workload.progress(20, 60, "confirms after %s" % kind)
    firsts = [op for op in workload.history.confirms_since(fault.started) if op.number > PROBE]
    if firsts:
        fault.outage = firsts[0].t - fault.started
        fault.confirmed_during = firsts[0].t < fault.healed
    fault.longest_gap = workload.history.longest_gap(fault.started, time.monotonic(), above=PROBE)
    return fault


def _cut_from_client(net) -> list[str]:
    """The hosts the harness's client namespace cannot reach now."""
    return [name for name in net.hosts if net.hosts[name].address in net.blocked["client"]]


def _fill(path: Path) -> None:
    """Write zeros to `path` until its file system is full."""
    chunk = bytes(1 << 20)
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(chunk)
                filler.flush()
        except OSError:
            pass


def _snapshot_kill(cluster: Cluster, leader: HutchNode, follower: HutchNode, begun) -> str:
    """Kill a follower, publish 32 MiB more (the ballast) without it, restart
    it, and SIGKILL the leader as soon as it starts sending the follower
    its snapshot. The half-synced follower must not lead; the ballast must
    survive (checked at the end)."""
    follower.kill()
    until(lambda: follower.name not in json.loads(cluster.etcd_get("in_sync") or "[]"), 30,
          "the killed follower to leave the in-sync set")
    cluster.ballast += cluster.inside(lambda: _publish_ballast(leader, 128), timeout=120)
    mark = len(leader.log_lines)
    follower.start()
    until(lambda: any("follower %s connected" % follower.name in line for line in leader.log_lines[mark:]), 60,
          "the leader to start %s's snapshot" % follower.name)
    leader.kill()
    begun()
    until(lambda: cluster.leader() not in (None, leader), 60, "another node to lead")
    elected = cluster.leader()
    leader.start()
    return "killed %s during %s's snapshot; %s elected" % (leader.name, follower.name, elected.name)


def _publish_ballast(node: HutchNode, count: int) -> int:
    import pika

    body = bytes(256 << 10)
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(BALLAST_QUEUE, durable=True)
        for _ in range(count):
            channel.basic_publish("", BALLAST_QUEUE, body, pika.BasicProperties(delivery_mode=2))
    return count


def ballast_count(cluster: Cluster) -> int:
    import pika

    def count():
        with pika.BlockingConnection(pika.URLParameters(cluster.leader().url)) as connection:
            return connection.channel().queue_declare(BALLAST_QUEUE, durable=True).method.message_count
    return cluster.inside(count)


# -- one run ---------------------------------------------------------------------------


def run(faults: list[str], lease_ttl: int = 2, keep: Path | None = None, log=lambda text: None,
        cut_until_alone: bool = False) -> dict:
    """A fresh cluster under the workload through `faults`, one after the
    other; then the history is checked. The report (a dict) says what was
    seen and `ok`. `cut_until_alone`: see `inject`."""
    with Cluster(lease_ttl, skew_clocks="clock-skew" in faults, keep=keep) as cluster:
        workload = Workload(cluster).start()
        done, unfinished = [], None
        try:
            for kind in faults:
                fault = inject(cluster, workload, kind, cut_until_alone=cut_until_alone)
                log("%s: %s" % (kind, json.dumps(fault.summary())))
                done.append(fault)
        except TimeoutError as exc:  # the cluster did not come back, or confirms stopped: checked all the same
            unfinished = "the run did not finish: %s" % exc
            log(unfinished)
        finally:
            workload.stop_publishing()
            cluster.net.heal()
        with contextlib.suppress(TimeoutError):
            cluster.wait_in_sync(60)
        workload.drain(90)
        verdict = check(cluster.history.ops, cluster.history.terms)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            with open(keep / "history.jsonl", "w") as out:
                for op in cluster.history.ops:
                    out.write(json.dumps(op.__dict__) + "\n")
                for term in cluster.history.terms:
                    out.write(json.dumps(dict(term.__dict__, kind="term")) + "\n")
        ballast = ballast_count(cluster) if cluster.ballast else 0
        origin = cluster.history.ops[0].t if cluster.history.ops else 0.0
        foreign: dict = {}
        for _number, node, leader, term, t in verdict.foreign_confirms:
            group = foreign.setdefault("%s confirmed in term %s (leader %s)" % (node, term, leader), [])
            group.append(round(t - origin, 2))
        report = {"faults": [dict(f.summary(), at=round(f.started - origin, 2)) for f in done],
                  "lease_ttl": lease_ttl,
                  "term_changes": [(round(t.seen - origin, 2), t.leader, t.term) for t in cluster.history.terms],
                  "foreign_confirms": {what: {"count": len(ts), "first": ts[0], "last": ts[-1]}
                                       for what, ts in foreign.items()},
                  "published": verdict.published, "confirmed": verdict.confirmed, "nacked": verdict.nacked,
                  "in_doubt": verdict.unknown, "deliveries": verdict.delivered, "terms": verdict.terms,
                  "lost": verdict.lost[:50], "lost_count": len(verdict.lost),
                  "acked_back_after_failover": verdict.acked_back_allowed,
                  "ballast_confirmed": cluster.ballast, "ballast_left": ballast,
                  "problems": verdict.problems()}
        if ballast < cluster.ballast:
            report["problems"].append("%d of %d confirmed ballast messages lost" % (cluster.ballast - ballast,
                                                                                     cluster.ballast))
        if unfinished:
            report["problems"].append(unfinished)
        for fault in done:
            if fault.in_sync_after is None:
                report["problems"].append("%s: not every node in sync again within 60 s of healing" % fault.kind)
        report["ok"] = not report["problems"]
        return report


if __name__ == "__main__":  # a quick look: python tests/partition_kit.py LOG_DIR leader-isolated ...
    print(json.dumps(run(sys.argv[2:] or ["leader-isolated"], keep=Path(sys.argv[1]),
                         log=lambda text: print(text, flush=True)), indent=1))


def management_get(node: HutchNode, path: str):
    """GET `path` of `node`'s management API from the calling namespace: the JSON, None on an error."""
    request = urllib.request.Request("http://%s:%d%s" % (node.host.address, HTTP_PORT, path))
    request.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as reply:
            return json.load(reply)
    except (OSError, ValueError):
        return None
