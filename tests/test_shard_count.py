"""How many shards a node runs when it is not told (docs/scaling.md): as many
as the cores the process may use, its CPU affinity capped by its cgroup's
CPU quota; one in a cluster. Real broker processes, real cgroups (root
needed: a skip on a developer's machine without it, a failure in CI)."""
from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path

import pytest

from conftest import PORT_ARGS
from helpers import unavailable, wait_for
from server_process import spawn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from cpu_quota import CgroupError, QuotaSet  # noqa: E402

from amqp_server.process.shards import shard_count  # noqa: E402
from cli.settings import load_settings  # noqa: E402


def _started(tmp_path, wrap: list = ()) -> str:
    """The log of a node started without --shards, once it serves; stopped after."""
    lines: list[str] = []
    serving = threading.Event()
    process = spawn([*PORT_ARGS, "--data-dir", str(tmp_path / "data")], lines, None,
                    lambda line: (not line or "listening for AMQP" in line) and serving.set(), wrap)
    try:
        assert serving.wait(30), "".join(lines)
        wait_for(lambda: "".join(lines).count("listening for AMQP") >= _shards("".join(lines)), 20)
        return "".join(lines)
    finally:
        process.terminate()
        process.wait(30)


def _shards(log: str) -> int:
    """How many shards the log says the node has (1: it never mentions shards)."""
    for line in log.splitlines():
        if "shard 0 of " in line:
            return int(line.split("shard 0 of ")[1].split(":")[0])
    return 1


def test_a_node_runs_as_many_shards_as_the_cores_it_may_use(tmp_path):
    cores = len(os.sched_getaffinity(0))
    log = _started(tmp_path)
    assert _shards(log) == cores
    assert log.count("listening for AMQP") == cores


@pytest.mark.parametrize("quota", [1.0, 1.5])
def test_a_cpu_quota_caps_the_default(tmp_path, quota):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a quota cannot lower the default")
    try:
        with QuotaSet() as quotas:
            group = quotas.new("shards")
            group.set(quota)
            # the node starts inside the group, as in a container limited to `quota` cores
            enter = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(group.path, "cgroup.procs")]
            log = _started(tmp_path, enter)
    except CgroupError as exc:
        unavailable("cgroups are not writable here: %s" % exc)
    assert _shards(log) == min(math.ceil(quota), len(os.sched_getaffinity(0)))


def test_a_cluster_node_is_one_shard_unless_told_more_and_then_no_connection_moves():
    cluster = ["--cluster-etcd", "http://127.0.0.1:2379", "--cluster-node-name", "n1"]
    env = {"HUTCH_CLUSTER_SECRET": "s" * 32}
    assert shard_count(load_settings(cluster, env)) == 1
    assert shard_count(load_settings([], {})) == len(os.sched_getaffinity(0))
    several = load_settings([*cluster, "--shards", "2"], env)
    # a shard's leader may run on another node, where a client's socket cannot move
    assert shard_count(several) == 2 and not several.shard_moves
    assert load_settings(["--shards", "2"], {}).shard_moves
