"""bench/cpu_quota.py and scale.py's view of shard processes: the CPU quotas that bench/scale.py
simulates cores with (docs/scaling.md, "Measuring"), which process holds a connection. Real
cgroups, real processes; the cgroup tests need root (a skip on a developer's machine without it,
a failure in CI)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from cpu_quota import CgroupError, CpuQuota, QuotaSet  # noqa: E402
from harness import cpu_seconds  # noqa: E402
from scale import children, connection_holder, place_shards  # noqa: E402

from helpers import unavailable  # noqa: E402

BUSY = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def quotas():
    try:
        with QuotaSet() as q:
            q.new("probe")
            yield q
    except CgroupError as exc:
        unavailable("cgroups are not writable here: %s" % exc)


def _wait(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("not within %.0f s" % timeout)


def test_a_busy_process_started_in_a_group_stays_under_its_quota(quotas):
    group = quotas.new("busy")
    group.set(0.2)
    assert group.cores() == pytest.approx(0.2)
    busy = subprocess.Popen(BUSY, preexec_fn=group.enter)
    try:
        assert group.pids() == [busy.pid]
        t0, cpu0 = time.monotonic(), cpu_seconds(busy.pid)
        _wait(lambda: cpu_seconds(busy.pid) - cpu0 >= 0.3)  # ~1.5 s at 0.2 of a core
        used = (cpu_seconds(busy.pid) - cpu0) / (time.monotonic() - t0)
        periods, throttled = group.throttled()
        assert periods > 0 and throttled > 0, "the kernel never throttled the group"
        assert used < 0.2 * 1.25, "a busy loop used %.2f of a core under a quota of 0.2" % used
    finally:
        busy.kill()
        busy.wait()


def test_removing_a_group_moves_what_is_left_in_it_out_first(quotas):
    group = CpuQuota("leftover")
    busy = subprocess.Popen(BUSY, preexec_fn=group.enter)
    try:
        group.set(0.1)
        group.remove()
        assert not os.path.exists(group.path)
        assert busy.poll() is None, "the process was killed, not moved"
    finally:
        busy.kill()
        busy.wait()


def test_each_shard_of_a_supervisor_gets_a_group_of_its_own(quotas):
    """A 'supervisor' with three children born in its group: after place_shards every group holds
    one shard (the first shares the supervisor's); a fourth child, as a restarted shard would be,
    is born in the first group and moves to the group its predecessor left."""
    first = quotas.new("shard-1")
    supervisor = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys\n"
         "kids = [subprocess.Popen(['sleep', '60']) for _ in range(3)]\n"
         "sys.stdin.readline(); kids[1].kill(); kids[1].wait(); subprocess.Popen(['sleep', '60'])\n"
         "sys.stdin.readline()"], stdin=subprocess.PIPE, text=True, preexec_fn=first.enter)
    try:
        groups = [first, quotas.new("shard-2"), quotas.new("shard-3")]
        shards = _wait(lambda: len(children(supervisor.pid)) == 3 and children(supervisor.pid))
        place_shards(supervisor.pid, groups)
        held = [set(g.pids()) & set(shards) for g in groups]
        assert all(len(h) == 1 for h in held) and set.union(*held) == set(shards)
        assert supervisor.pid in first.pids()

        supervisor.stdin.write("restart\n")
        supervisor.stdin.flush()
        restarted = _wait(lambda: [c for c in children(supervisor.pid) if c not in shards])
        place_shards(supervisor.pid, groups)
        now = children(supervisor.pid)
        assert len(now) == 3
        assert [len(set(g.pids()) & set(now)) for g in groups] == [1, 1, 1]
        assert restarted[0] not in first.pids()
    finally:
        for pid in children(supervisor.pid):
            os.kill(pid, 9)
        supervisor.kill()
        supervisor.wait()


def test_the_process_holding_a_client_connection_is_found():
    """scale.py --hop tells which shard took the producer's connection by the established socket on
    the AMQP port; here the listener is this process, and a child that holds no socket is not it."""
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE)
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            assert connection_holder(port, [os.getpid(), other.pid]) is None  # listening only
            with socket.create_connection(("127.0.0.1", port)):
                accepted, _ = server.accept()
                with accepted:
                    assert connection_holder(port, [other.pid, os.getpid()]) == os.getpid()
                    assert connection_holder(port, [other.pid]) is None
    finally:
        other.kill()
        other.wait()


def test_a_cluster_under_quota_has_each_node_whole_in_a_group_of_its_own(quotas):
    """scale.py --cluster (bench/scale_cluster.py): each node's processes, and nothing else, in its
    own group, limited to the quota while a run measures and unlimited otherwise; etcd outside."""
    from scale_cluster import URI, cluster_running

    with cluster_running([], 2, 0.5) as (running, members, _etcd):
        groups = [group for group, _cores in running.quotas]
        assert [set(group.pids()) for group in groups] == [
            {node.process.pid, *children(node.process.pid)} for node in members]
        assert sorted(running.processes()) == sorted(pid for group in groups for pid in group.pids())
        running.limit(True)
        assert [group.cores() for group in groups] == [0.5, 0.5]
        running.limit(False)
        assert [group.cores() for group in groups] == [None, None]
        assert running.uri in [URI % node.port for node in members]
