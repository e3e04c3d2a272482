"""One node per data directory, and a default shard count that never refuses
one (issue 39, docs/scaling.md "Who owns what"): a second start on a running
node's directory is refused (a cluster node's too), one after a SIGKILL of
the supervisor waits until the shards it left have ended, and a node moved
to fewer cores runs as many shards as hold its queues. Real broker processes
and pika clients; the SIGKILL test holds the left shards alive with cgroup
v1's freezer (in which a SIGKILLed process stays until thawed), so it needs
root."""
from __future__ import annotations

import os
import time
import uuid

import pika
import pytest

from cluster_kit import EtcdProcess, make_nodes, until
from conftest import LISTENING, PORT_ARGS, launch
from helpers import confirm_channel, connect, drain, unavailable, wait_for
from server_process import ServerProcess, spawn
from shard_kit import on_shard, queue_on
from storage.data_directory import LOCK_WAIT

IN_USE = "the data directory %s is in use by another hutch node"
WAITING = "is locked by another hutch node"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
FREEZER = "/sys/fs/cgroup/freezer"


class Node(ServerProcess):
    """`python -m cli.server` on free ports and `data_dir`, after `wrap`; the
    monotonic time of its first "listening for AMQP" line in `listening_at`."""

    def __init__(self, data_dir, *args: str, wrap: list = ()) -> None:
        self.log_lines: list[str] = []
        self.ports: dict[str, int] = {}
        self.listening_at: float | None = None
        self.process = spawn([*PORT_ARGS, "--data-dir", str(data_dir), *args], self.log_lines, None, self._line,
                             wrap)

    def _line(self, line: str) -> None:
        match = LISTENING.search(line)
        if match:
            self.ports.setdefault(match.group(1), int(match.group(2)))
            if match.group(1) == "AMQP" and self.listening_at is None:
                self.listening_at = time.monotonic()

    @property
    def port(self) -> int:
        return self.ports["AMQP"]

    def shards(self) -> int:
        """How many shards the log says the node runs (1: it never mentions shards)."""
        for line in self.log_lines:
            if "shard 0 of " in line:
                return int(line.split("shard 0 of ")[1].split(":")[0])
        return 1

    def serving(self, timeout: float = 30) -> "Node":
        wait_for(lambda: self.log.count("listening for AMQP") >= self.shards() or not self.running(), timeout,
                 what="every shard listening")
        assert self.running(), self.log
        return self


def fill(port: int, queue: str, count: int, shard: int | None = None) -> None:
    """`count` confirmed persistent messages into the durable `queue` (m0, m1, ...)."""
    connection = connect(port) if shard is None else on_shard(port, shard)
    try:
        channel = confirm_channel(connection)
        for i in range(count):
            channel.basic_publish("", queue, b"m%d" % i, PERSISTENT)
    finally:
        connection.close()


def bodies(port: int, queue: str) -> list[bytes]:
    with connect(port) as connection:
        return [body for _method, _props, body in drain(connection.channel(), queue)]


def expected(count: int) -> list[bytes]:
    return [b"m%d" % i for i in range(count)]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("shards", [(), ("--shards", "1")], ids=["default", "one-process"])
def test_a_second_node_on_a_running_nodes_data_directory_is_refused(tmp_path, shards):
    first = launch(tmp_path, *shards)
    try:
        with connect(first.port) as connection:
            connection.channel().queue_declare("kept", durable=True)
        fill(first.port, "kept", 50)
        started = time.monotonic()
        second = Node(first.data_dir, *shards)
        try:
            second.process.wait(LOCK_WAIT + 15)
        finally:
            second.stop()  # a second node that served (no lock) is stopped, and the test fails below
        elapsed = time.monotonic() - started
        assert second.process.returncode == 1, second.log
        assert "hutch-server: " + IN_USE % first.data_dir in second.log
        assert WAITING in second.log  # it waited for the holder before it gave up, for a bounded time
        assert LOCK_WAIT <= elapsed < LOCK_WAIT + 10
        # it never opened the directory: no recovery, no store, no listener
        assert "clean-shutdown marker" not in second.log and "definitions from" not in second.log
        assert "listening for" not in second.log and "Traceback" not in second.log
        with connect(first.port) as connection:  # the first node serves on, every message there
            assert connection.channel().queue_declare("kept", durable=True, passive=True).method.message_count == 50
        assert bodies(first.port, "kept") == expected(50)
    finally:
        first.stop()
    assert os.path.exists(first.data_dir / "definitions.db")


@pytest.mark.timeout(90)
def test_a_second_cluster_node_on_a_cluster_nodes_data_directory_is_refused(tmp_path):
    etcd = EtcdProcess(tmp_path).start()
    first, other = make_nodes(tmp_path, etcd.url, 2)
    try:
        first.start()
        until(first.leads, 40, "n1 to lead")
        with connect(first.port) as connection:
            connection.channel().queue_declare("kept", durable=True)
        fill(first.port, "kept", 20)
        other.data_dir = first.data_dir  # n2, another cluster node, started on n1's directory
        other.start()
        other.process.wait(LOCK_WAIT + 15)
        assert other.process.returncode == 1, other.log
        assert "hutch-server: " + IN_USE % first.data_dir in other.log
        assert "cluster node n2" not in other.log  # it never read the directory's cluster files
        assert first.leads() and bodies(first.port, "kept") == expected(20)
    finally:
        other.stop()
        first.stop()
        etcd.stop()


class Frozen:
    """Processes held in a cgroup v1 freezer group: a signal, SIGKILL too, takes
    effect only once they are thawed (they stay alive, their descriptors open)."""

    def __init__(self, pids: list[int]) -> None:
        if not os.access(os.path.join(FREEZER, "cgroup.procs"), os.W_OK):
            unavailable("no writable cgroup v1 freezer at %s (root needed)" % FREEZER)
        self.path = os.path.join(FREEZER, "hutch-test-%s" % uuid.uuid4().hex[:8])
        os.mkdir(self.path)
        for pid in pids:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as procs:
                procs.write(str(pid))
        self._state("FROZEN")

    def _state(self, state: str) -> None:
        with open(os.path.join(self.path, "freezer.state"), "w") as control:
            control.write(state)

        def reached() -> bool:
            with open(os.path.join(self.path, "freezer.state")) as control:
                return control.read().strip() == state
        wait_for(reached, 10, what="the freezer group " + state)

    def thaw(self) -> None:
        """Thawed, and the group removed once its processes have gone."""
        self._state("THAWED")

        def removed() -> bool:
            try:
                os.rmdir(self.path)
            except OSError:
                return False
            return True
        wait_for(removed, 10, what="the frozen processes gone")


def children(pid: int) -> list[int]:
    with open("/proc/%d/task/%d/children" % (pid, pid)) as found:
        return [int(child) for child in found.read().split()]


def alive(pid: int) -> bool:
    """Running (not gone, nor a zombie not yet reaped: its descriptors are closed)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(90)
def test_a_start_after_a_sigkill_of_the_supervisor_waits_until_its_shards_have_ended(tmp_path):
    first = launch(tmp_path, "--shards", "2")
    frozen = None
    try:
        queues = []
        for shard in (0, 1):
            connection = on_shard(first.port, shard)
            queues.append(queue_on(first, connection.channel(), shard))
            connection.close()
            fill(first.port, queues[-1], 30, shard)
        shards = children(first.process.pid)
        assert len(shards) == 2
        # The supervisor is SIGKILLed; its shards are sent SIGKILL too (PR_SET_PDEATHSIG), but
        # frozen they live on as a busy machine's shards do for a moment, and keep the directory.
        frozen = Frozen(shards)
        first.process.kill()
        first.process.wait(10)
        again = Node(first.data_dir, "--shards", "2")
        try:
            wait_for(lambda: WAITING in again.log or again.listening_at is not None or not again.running(), 20,
                     what="the new start waiting for the lock (or serving)")
            time.sleep(0.5)  # the left shards live on a little more, and the new start goes on waiting
            thawed = time.monotonic()
            frozen.thaw()
            frozen = None
            again.serving()
            assert WAITING in again.log
            assert again.listening_at > thawed  # it served only once the left shards had ended
            assert not any(alive(pid) for pid in shards)
            for queue in queues:  # every confirmed persistent message of both shards is there
                assert bodies(again.port, queue) == expected(30)
        finally:
            again.stop()
    finally:
        if frozen is not None:
            frozen.thaw()
        first.stop()


@pytest.mark.timeout(60)
def test_the_default_shard_count_on_fewer_cores_covers_the_shards_that_hold_queues(tmp_path):
    first = launch(tmp_path, "--shards", "2")
    try:
        connection = on_shard(first.port, 1)
        queue = queue_on(first, connection.channel(), 1)
        connection.close()
        fill(first.port, queue, 20, 1)
    finally:
        first.stop()
    # The default shard count on one core (a smaller machine, a container limited to a core).
    again = Node(first.data_dir, wrap=["taskset", "-c", "0"])
    try:
        again.serving()
        assert again.shards() == 2
        assert "2 shards, not the 1 of the cores this process may use: shard 1 holds queues ('%s' in vhost '/')" \
            % queue in again.log
        assert bodies(again.port, queue) == expected(20)
    finally:
        again.stop()
