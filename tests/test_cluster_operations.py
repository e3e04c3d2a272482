"""Operating a three-node cluster (tests/cluster_kit.py): every front end
forwarded by a follower, hutchctl cluster_status, /api/nodes and the
metrics of each node, a planned leadership transfer under confirmed load,
and forget_cluster_node."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_kit import ROOT, Load, cluster, in_sync, leader_of, until  # noqa: F401 - cluster is a fixture
from http_api import call
from mqtt_raw import RawMQTT

pytestmark = pytest.mark.timeout(150)


def hutchctl(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.hutchctl", "--url", "http://127.0.0.1:%d" % node.ports["http"],
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


def metrics(port: int) -> str:
    reply = call(port, "GET", "/metrics")
    assert reply.status == 200
    return reply.body if isinstance(reply.body, str) else reply.body.decode()


def test_operating_a_cluster(cluster):
    etcd, nodes = cluster
    leader = leader_of(etcd, nodes)
    follower, other = [n for n in nodes if n is not leader]

    # a follower forwards MQTT and the management API (AMQP: tests/test_cluster_failover.py)
    with RawMQTT(follower.ports["mqtt"]) as mqtt:
        assert mqtt.connect("through-a-follower") == b"\x00\x00"
    def status() -> dict:
        done = hutchctl(follower, "cluster_status", "--formatter", "json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    # the leader refreshes its view of the members every second
    seen = until(lambda: (lambda s: s if len(s["running_nodes"]) == 3 else None)(status()), 30, "three running")
    assert seen["leader"] == leader.name
    assert sorted(seen["running_nodes"]) == ["n1", "n2", "n3"]
    states = {n["name"]: n["state"] for n in seen["nodes"]}
    assert states[follower.name] == states[other.name] == "in sync"
    text = hutchctl(leader, "cluster_status").stdout
    assert "Leader: %s" % leader.name in text and "Running Nodes" in text

    listed = call(leader.ports["http"], "GET", "/api/nodes").body
    assert sorted(n["cluster_role"] for n in listed) == ["follower", "follower", "leader"]
    assert "hutch_cluster_in_sync_followers 2" in metrics(leader.ports["prometheus"])
    assert 'hutch_cluster_role{node="%s",role="follower"} 1' % follower.name in metrics(follower.ports["prometheus"])

    # a planned hand-over under confirmed load loses nothing
    load = Load([n.url for n in nodes]).start()
    load.progress(200, 30, "confirms before the transfer")
    done = hutchctl(other, "transfer_leadership", follower.name)
    assert done.returncode == 0, done.stderr
    until(follower.leads, 30, "the transfer")
    load.progress(200, 60, "confirms from the new leader")
    lost, _duplicates = load.finish(60)
    assert not lost
    until(lambda: len(in_sync(etcd)) == 3, 60, "the former leader to be in sync again")

    # forgetting: refused for a running node, done for a stopped one
    refused = hutchctl(follower, "forget_cluster_node", other.name)
    assert refused.returncode != 0 and "is running: stop it before forgetting it" in refused.stderr
    other.stop()
    until(lambda: other.name not in status()["running_nodes"], 30, "the stopped node to be seen stopped")
    assert other.name in status()["disk_nodes"]
    done = hutchctl(follower, "forget_cluster_node", other.name)
    assert done.returncode == 0, done.stderr
    assert other.name not in status()["disk_nodes"]


def test_a_node_that_runs_alone_reports_itself_and_refuses_cluster_operations(api):
    status = api.get("/api/hutch/cluster").body
    assert [(n["role"], n["running"]) for n in status["nodes"]] == [("leader", True)]
    refused = api.delete("/api/hutch/cluster/nodes/n2")
    assert refused.status == 400 and "not part of a cluster" in refused.body["reason"]
    refused = api.post("/api/hutch/cluster/transfer-leadership", {"node": "n2"})
    assert refused.status == 400 and "not part of a cluster" in refused.body["reason"]
