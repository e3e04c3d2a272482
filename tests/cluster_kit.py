"""Helpers for the cluster tests: an etcd process and hutch nodes on loopback.

Each node gets fixed free ports (not 0), so a node that re-executes itself
(fencing) or is restarted after a kill comes back on the same addresses.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import wait_for

SECRET = "the-test-clusters-shared-secret"  # cluster.secret of every node the tests start
from server_process import ROOT, ServerProcess, spawn  # noqa: F401 - ROOT for the cluster tests


# The ports free_ports hands out: a node binds its ports only once it runs (and again on each
# restart, after a kill or a fencing), so a port must stay out of every other hand's reach from
# being handed out to the end of the process. Hence ports below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range), which neither a listener on port 0 nor a client's
# connect is ever given, each reserved by a file of its own in RESERVED that names the process
# holding it: two test processes (pytest-xdist's workers, another run of the suite) never hold
# the same port. A reservation ends with its process; one of a process that is gone is taken
# over. (Seen before: n2 given n1's MQTT port for AMQP, "address already in use".)
RESERVED = Path(tempfile.gettempdir()) / "hutch-test-ports"
LOWEST_PORT = 20000
_held: list[int] = []


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reserve(port: int) -> bool:
    """Whether `port` is now this process's (the caller holds RESERVED's lock)."""
    path = RESERVED / str(port)
    try:
        owner = int(path.read_text() or "0")
    except FileNotFoundError:
        owner = None
    except ValueError:
        owner = 0
    if owner is not None:
        if owner == os.getpid() or os.path.exists("/proc/%d" % owner):
            return False
        path.unlink()
    if not _bindable(port):
        return False
    path.write_text(str(os.getpid()))
    _held.append(port)
    return True


@atexit.register
def _release() -> None:
    for port in _held:
        with contextlib.suppress(OSError):
            (RESERVED / str(port)).unlink()


def _handing_out(count: int, consecutive: bool) -> list[int]:
    top = min(_ephemeral_start(), 65536)
    if top - LOWEST_PORT < 1000:
        raise RuntimeError("the ephemeral port range starts at %d: too few ports below it for the tests" % top)
    RESERVED.mkdir(exist_ok=True)
    with open(RESERVED / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ports: list[int] = []
        port = random.randrange(LOWEST_PORT, top - count)
        for _ in range(top - LOWEST_PORT):
            port = port + 1 if port + 1 < top else LOWEST_PORT
            if consecutive and ports and port != ports[-1] + 1:
                ports = []  # wrapped around: a run cannot go on past the top
            if _reserve(port):
                ports.append(port)
                if len(ports) == count:
                    return ports
            elif consecutive:
                ports = []  # the run ends here; what it held stays held (this process's)
        raise RuntimeError("no %d free test ports between %d and %d" % (count, LOWEST_PORT, top))


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports, free and reserved for this
    process (a node of `count` shards listens for replication on each)."""
    return _handing_out(count, consecutive=True)[0]


def free_ports(count: int) -> list[int]:
    """`count` ports free now and reserved for this process (above)."""
    return _handing_out(count, consecutive=False)


def until(predicate, timeout: float, what: str, interval: float = 0.05):
    """helpers.wait_for, saying what it waits for, polling every 50 ms."""
    return wait_for(predicate, timeout, interval, what)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class EtcdProcess:
    """etcd 3.4 on two free loopback ports with its own data directory."""

    def __init__(self, tmp: Path, client_port: int | None = None, tls: dict | None = None) -> None:
        self.client_port, self.peer_port = free_ports(2)
        if client_port is not None:
            self.client_port = client_port
        self.data_dir = tmp / "etcd"
        self.process: subprocess.Popen | None = None
        self.tls = tls  # {"cert", "key", "ca"}: clients must present a certificate that "ca" signed

    @property
    def url(self) -> str:
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.client_port)

    def start(self) -> "EtcdProcess":
        if shutil.which("etcd") is None:
            reason = "no etcd binary (Debian: etcd-server; tests/prepare.sh installs it)"
            if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
                pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
            pytest.skip(reason)
        client, peer = self.url, "http://127.0.0.1:%d" % self.peer_port
        self.log = open(str(self.data_dir) + ".log", "w")
        self.process = subprocess.Popen(
            ["etcd", "--name", "default", "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "default=" + peer,
             *(["--cert-file", self.tls["cert"], "--key-file", self.tls["key"], "--client-cert-auth",
                "--trusted-ca-file", self.tls["ca"]] if self.tls else [])],
            stdout=self.log, stderr=subprocess.STDOUT)
        until(lambda: port_open(self.client_port), 20, "etcd to listen")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.log.close()


@dataclass
class Node(ServerProcess):
    name: str
    data_dir: Path
    etcd_url: str
    ports: dict
    extra: tuple = ()
    secret: str = SECRET
    process: subprocess.Popen | None = None
    log_lines: list = field(default_factory=list)

    stop_grace = 15.0  # seconds (ServerProcess.stop)

    @property
    def port(self) -> int:
        return self.ports["amqp"]

    def _listeners(self) -> list[str]:
        p = self.ports
        return ["--bind", "127.0.0.1", "--port", str(p["amqp"]),
                "--management-bind", "127.0.0.1", "--management-port", str(p["http"]),
                "--prometheus-bind", "127.0.0.1", "--prometheus-port", str(p["prometheus"]),
                "--mqtt-port", str(p["mqtt"]), "--mqtt-tls-port", "0", "--stream-port", str(p["stream"]),
                "--stream-tls-port", "0", "--data-dir", str(self.data_dir)]

    def start(self) -> "Node":
        self.log_lines.append("---- start\n")
        p = self.ports
        self.process = spawn(
            [*self._listeners(),
             "--cluster-etcd", self.etcd_url, "--cluster-node-name", self.name,
             "--cluster-replication-port", str(p["replication"]), "--cluster-advertise", "127.0.0.1",
             "--cluster-lease-ttl", "2", *self.extra],
            self.log_lines, env={"HUTCH_CLUSTER_SECRET": self.secret})
        return self

    def start_alone(self, *extra: str) -> "Node":
        """The same node without a cluster: a single broker on its data directory."""
        self.log_lines.append("---- start alone\n")
        self.process = spawn([*self._listeners(), *extra], self.log_lines)
        until(self.serving, 60, "%s to serve alone" % self.name)
        return self

    def serving(self) -> bool:
        """Its AMQP port accepts connections (the leader, or a forwarding follower)."""
        return port_open(self.port)

    def leads(self) -> bool:
        """It holds the leader key and has registered its client listeners,
        which it does once they are open: a client connecting now reaches
        its broker (a port that accepts may still be its follower's
        forwarding, closed as the promotion goes on)."""
        import json

        if etcd_get(self.etcd_url, "hutch/leader") != self.name.encode():
            return False
        info = json.loads(etcd_get(self.etcd_url, "hutch/nodes/" + self.name) or b"{}")
        return info.get("role") == "leader" and "amqp" in info.get("ports", {})


def make_nodes(tmp: Path, etcd_url: str, count: int, *extra: str) -> list[Node]:
    nodes = []
    for i in range(1, count + 1):
        amqp, http, prometheus, mqtt, replication, stream = free_ports(6)
        nodes.append(Node("n%d" % i, tmp / ("n%d" % i), etcd_url,
                          {"amqp": amqp, "http": http, "prometheus": prometheus, "mqtt": mqtt,
                           "replication": replication, "stream": stream}, extra))
    return nodes


def etcd_get(url: str, key: str) -> bytes | None:
    """One key from etcd (the tests' view of the election), None when absent."""
    import asyncio
    import urllib.parse

    import aetcd

    async def get():
        parts = urllib.parse.urlsplit(url)
        client = aetcd.Client(host=parts.hostname, port=parts.port, timeout=5)
        try:
            got = await client.get(key.encode())
            return got.value if got is not None else None
        finally:
            await client.close()

    return asyncio.run(get())


def etcd_put(url: str, key: str, value: bytes, lease_of: str | None = None) -> None:
    """Write one key; `lease_of`: on the lease the key of that name has
    (so a test can change a running node's registration without detaching
    it from the node's lease)."""
    import asyncio
    import urllib.parse

    import aetcd

    async def put():
        parts = urllib.parse.urlsplit(url)
        client = aetcd.Client(host=parts.hostname, port=parts.port, timeout=5)
        try:
            lease = (await client.get(lease_of.encode())).lease if lease_of is not None else None
            await client.put(key.encode(), value, lease=lease or None)
        finally:
            await client.close()

    asyncio.run(put())


def leader_of(etcd: EtcdProcess, nodes: list[Node]) -> Node | None:
    name = etcd_get(etcd.url, "hutch/leader")
    return next((n for n in nodes if name is not None and n.name == name.decode()), None)


def in_sync(etcd: EtcdProcess) -> list[str]:
    import json

    value = etcd_get(etcd.url, "hutch/in_sync")
    return json.loads(value) if value else []


@contextlib.contextmanager
def started(etcd: EtcdProcess, nodes: list[Node]):
    """Start the nodes; enter once every one is in sync and the leader
    serves (the in-sync set is written before its listeners open). On
    leaving (also when they did not get in sync), the nodes and etcd are
    stopped."""
    try:
        for node in nodes:
            node.start()
        until(lambda: len(in_sync(etcd)) == len(nodes), 60, "%d nodes in sync" % len(nodes))
        until(lambda: any(node.leads() for node in nodes), 30, "the leader to serve")
        yield
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()


QUEUE = "cluster-load"
ARGUMENTS = {"x-queue-type": "quorum"}


class Load:
    """A confirmed persistent publisher and a consumer (manual acks), each a
    thread with its own pika connection to any node of `urls`, reconnecting
    to the next node whenever its connection ends. Bodies are the message
    numbers; `confirmed` holds those the cluster confirmed, `received`
    every delivery (duplicates included). `queue`: declared with
    `arguments` by both threads; `namespace`: the network namespace they
    run in (tests/netns.py), when the nodes are in namespaces."""

    def __init__(self, urls: list[str], queue: str = QUEUE, arguments: dict = ARGUMENTS,
                 namespace: str | None = None) -> None:
        self.urls = urls
        self.queue, self.arguments = queue, arguments
        # across a partition, a node that cannot answer is given up on sooner (as tests/partition_kit.py does)
        self.stack_timeout = 4 if namespace is not None else None
        self.confirmed: list[int] = []
        # (time.monotonic(), when its connection was opened) of each confirm (bench/cluster.py)
        self.confirm_times: list[tuple[float, float]] = []
        self.received: list[int] = []
        self.reconnects = 0
        self._stop_publishing = threading.Event()
        self._stop_consuming = threading.Event()
        if namespace is None:
            self._threads = [threading.Thread(target=self._publish, daemon=True),
                             threading.Thread(target=self._consume, daemon=True)]
        else:
            import netns

            self._threads = [netns.Thread(namespace, self._publish), netns.Thread(namespace, self._consume)]

    def start(self) -> "Load":
        for thread in self._threads:
            thread.start()
        return self

    def _connect(self, turn: int):
        import pika

        params = pika.URLParameters(self.urls[turn % len(self.urls)])
        params.socket_timeout = 5
        params.blocked_connection_timeout = 10
        params.heartbeat = 5
        if self.stack_timeout is not None:
            params.stack_timeout = self.stack_timeout
            params.connection_attempts = 1
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.queue_declare(self.queue, durable=True, arguments=self.arguments)
        return connection, channel

    def _publish(self) -> None:
        import pika

        number, turn = 0, 0
        properties = pika.BasicProperties(delivery_mode=2)
        while not self._stop_publishing.is_set():
            try:
                connection, channel = self._connect(turn)
                opened = time.monotonic()
                channel.confirm_delivery()
                while not self._stop_publishing.is_set():
                    number += 1
                    channel.basic_publish("", self.queue, b"%d" % number, properties)
                    self.confirm_times.append((time.monotonic(), opened))
                    self.confirmed.append(number)
                connection.close()
            except Exception:  # noqa: BLE001 - any failure: that publish is unconfirmed; next node
                turn += 1
                self.reconnects += 1
                time.sleep(0.1)

    def _consume(self) -> None:
        turn = 0
        while not self._stop_consuming.is_set():
            try:
                connection, channel = self._connect(turn)
                channel.basic_qos(prefetch_count=50)

                def on_message(ch, method, _properties, body):
                    self.received.append(int(body))
                    ch.basic_ack(method.delivery_tag)

                channel.basic_consume(self.queue, on_message)
                while not self._stop_consuming.is_set():
                    connection.process_data_events(time_limit=0.1)
                    if not channel.consumer_tags:
                        # basic.cancel from the broker: the queue's shard changed leader
                        # (docs/scaling.md); consume again, as RabbitMQ asks of clients of
                        # a queue whose node went away
                        channel.basic_consume(self.queue, on_message)
                connection.close()
            except Exception:  # noqa: BLE001 - reconnect to the next node
                turn += 1
                self.reconnects += 1
                time.sleep(0.1)

    def progress(self, more: int, timeout: float, what: str) -> None:
        """Until `more` further messages are confirmed."""
        target = len(self.confirmed) + more
        until(lambda: len(self.confirmed) >= target, timeout, what)

    def stop_publishing(self) -> set[int]:
        """The numbers confirmed, once the publisher has stopped."""
        self._stop_publishing.set()
        self._threads[0].join(30)
        return set(self.confirmed)

    def stop_consuming(self) -> None:
        self._stop_consuming.set()
        self._threads[1].join(30)

    def finish(self, timeout: float) -> tuple[set[int], int]:
        """Stop publishing; wait until every confirmed message was received.
        Returns (confirmed but never received, duplicate deliveries)."""
        confirmed = self.stop_publishing()
        try:
            until(lambda: confirmed <= set(self.received), timeout, "every confirmed message to be consumed")
        except AssertionError:
            pass
        self.stop_consuming()
        return confirmed - set(self.received), len(self.received) - len(set(self.received))


# -- shared by the cluster test modules ----------------------------------------


def seed(node: Node) -> None:
    """Run `node` alone once (its data directory then holds data of its
    own), so that in a new cluster it founds the cluster at once: empty
    nodes wait 2 x lease_ttl from their start before one founds an empty
    cluster (a node with data may be on its way), a wait that is the
    subject of only a few tests (test_cluster_election, test_cluster_safety)
    and would cost every other test 4 s (20 s with lease_ttl 10)."""
    try:
        node.start_alone()
    finally:
        node.stop()


@contextlib.contextmanager
def running(tmp: Path, count: int, *extra: str):
    """(etcd, nodes): `count` nodes started with the `extra` arguments, a
    leader serving and every node in sync; all stopped at the end. n1 is
    seeded (`seed`): it founds the cluster and leads first."""
    etcd = EtcdProcess(tmp)
    nodes = make_nodes(tmp, etcd.url, count, *extra)
    seed(nodes[0])
    etcd.start()
    try:
        with started(etcd, nodes):
            yield etcd, nodes
    finally:
        print_logs(nodes)


def shard_key(shard: int, name: str) -> str:
    """etcd's key `name` of shard `shard`'s replication group (docs/scaling.md)."""
    return "hutch/%s" % name if shard == 0 else "hutch/shards/%d/%s" % (shard, name)


def shard_leaders(etcd: EtcdProcess, shards: int) -> list[str | None]:
    """The node etcd names leader of each shard's group."""
    return [(lambda v: v.decode() if v else None)(etcd_get(etcd.url, shard_key(shard, "leader")))
            for shard in range(shards)]


def groups_in_sync(etcd: EtcdProcess, names, shards: int) -> bool:
    """Every shard's group has exactly `names` in its in-sync set."""
    import json

    for shard in range(shards):
        value = etcd_get(etcd.url, shard_key(shard, "in_sync"))
        if value is None or set(json.loads(value)) != set(names):
            return False
    return True


@contextlib.contextmanager
def spread(tmp: Path, count: int, shards: int, *extra: str):
    """(etcd, nodes): `count` nodes of `shards` shards each, started empty
    (so each shard's group is founded by the node it prefers: the leaders
    spread), every group in sync; all stopped at the end."""
    etcd = EtcdProcess(tmp)
    nodes = make_nodes(tmp, etcd.url, count, "--shards", str(shards), *extra)
    for node in nodes:
        node.ports["replication"] = free_port_run(shards)  # shard K listens on the port K after it
    etcd.start()
    try:
        for node in nodes:
            node.start()
        until(lambda: groups_in_sync(etcd, [n.name for n in nodes], shards), 90, "every shard's group in sync")
        yield etcd, nodes
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()
        print_logs(nodes)


@pytest.fixture
def cluster(tmp_path):
    """(etcd, [n1, n2, n3]) with a leader serving and every node in sync."""
    with running(tmp_path, 3) as etcd_and_nodes:
        yield etcd_and_nodes


def print_logs(nodes: list[Node]) -> None:
    """The nodes' logs, in the captured output pytest shows for a failed test."""
    for node in nodes:
        print("===== %s" % node.name)
        print(node.log[-20000:])


def new_leader(etcd: EtcdProcess, nodes: list[Node], old: Node) -> Node:
    """The node elected after `old`, once it serves."""
    def other():
        leader = leader_of(etcd, nodes)
        return leader if leader is not old else None

    leader = until(other, 30, "another node to be elected")
    until(leader.leads, 30, "the new leader to serve")
    return leader

