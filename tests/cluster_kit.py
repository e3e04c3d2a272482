"""Helpers for the cluster tests: an etcd process and hutch nodes on loopback.

Each node gets fixed free ports (not 0), so a node that re-executes itself
(fencing) or is restarted after a kill comes back on the same addresses.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class EtcdProcess:
    """etcd 3.4 on two free loopback ports with its own data directory."""

    def __init__(self, tmp: Path, client_port: int | None = None) -> None:
        self.client_port, self.peer_port = free_ports(2)
        if client_port is not None:
            self.client_port = client_port
        self.data_dir = tmp / "etcd"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.client_port

    def start(self) -> "EtcdProcess":
        client, peer = self.url, "http://127.0.0.1:%d" % self.peer_port
        self.log = open(str(self.data_dir) + ".log", "w")
        self.process = subprocess.Popen(
            ["etcd", "--name", "default", "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "default=" + peer],
            stdout=self.log, stderr=subprocess.STDOUT)
        until(lambda: port_open(self.client_port), 20, "etcd to listen")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.log.close()


@dataclass
class Node:
    name: str
    data_dir: Path
    etcd_url: str
    ports: dict
    extra: tuple = ()
    process: subprocess.Popen | None = None
    log_lines: list = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.ports["amqp"]

    @property
    def url(self) -> str:
        return "amqp://guest:guest@127.0.0.1:%d/" % self.port

    @property
    def log(self) -> str:
        return "".join(self.log_lines)

    def start(self) -> "Node":
        self.log_lines.append("---- start\n")
        p = self.ports
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.server", "--bind", "127.0.0.1", "--port", str(p["amqp"]),
             "--management-bind", "127.0.0.1", "--management-port", str(p["http"]),
             "--prometheus-bind", "127.0.0.1", "--prometheus-port", str(p["prometheus"]),
             "--mqtt-port", str(p["mqtt"]), "--mqtt-tls-port", "0", "--data-dir", str(self.data_dir),
             "--cluster-etcd", self.etcd_url, "--cluster-node-name", self.name,
             "--cluster-replication-port", str(p["replication"]), "--cluster-advertise", "127.0.0.1",
             "--cluster-lease-ttl", "2", *self.extra],
            cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")},
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        lines, stream = self.log_lines, self.process.stderr
        threading.Thread(target=lambda: lines.extend(stream), daemon=True).start()
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.running():
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def serving(self) -> bool:
        """Its AMQP port accepts connections (the leader, or a forwarding follower)."""
        return port_open(self.port)


def make_nodes(tmp: Path, etcd_url: str, count: int, *extra: str) -> list[Node]:
    nodes = []
    for i in range(1, count + 1):
        amqp, http, prometheus, mqtt, replication = free_ports(5)
        nodes.append(Node("n%d" % i, tmp / ("n%d" % i), etcd_url,
                          {"amqp": amqp, "http": http, "prometheus": prometheus, "mqtt": mqtt,
                           "replication": replication}, extra))
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


def leader_of(etcd: EtcdProcess, nodes: list[Node]) -> Node | None:
    name = etcd_get(etcd.url, "hutch/leader")
    return next((n for n in nodes if name is not None and n.name == name.decode()), None)
