"""Data is never thrown away to follow someone else (tests/cluster_kit.py:
real etcd, real hutch processes): a node with data turned into a cluster
keeps it, whatever the order the nodes start in; etcd losing hutch's keys
while the nodes run loses nothing; a restarted node knows how much it
holds; what a node gives up to follow a leader is set aside, not erased."""
from __future__ import annotations

import glob
import json
import signal
import subprocess
import sys

import pika
import pytest

from cluster_kit import ROOT, EtcdProcess, etcd_get, in_sync, leader_of, make_nodes, print_logs, running, until
from http_api import call

pytestmark = pytest.mark.timeout(240)

MESSAGES = 500


def publish_confirmed(node, queue: str, count: int, start: int = 0) -> None:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for number in range(start, start + count):
            channel.basic_publish("", queue, b"%d" % number, pika.BasicProperties(delivery_mode=2))


def message_count(node, queue: str) -> int:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


def has_user(node, name: str) -> bool:
    return call(node.ports["http"], "GET", "/api/users/" + name).status == 200


def fill_alone(node) -> None:
    """The node runs alone: a durable queue of MESSAGES confirmed messages and a user."""
    node.start_alone()
    publish_confirmed(node, "kept", MESSAGES)
    assert call(node.ports["http"], "PUT", "/api/users/keeper", {"password": "k", "tags": ""}).status == 201
    node.stop()


def hutchctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.hutchctl", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})


def registered(etcd, *nodes) -> bool:
    return all(etcd_get(etcd.url, "hutch/nodes/" + n.name) is not None for n in nodes)


def serving_leader(etcd, nodes):
    leader = leader_of(etcd, nodes)
    if leader is None or not json.loads(etcd_get(etcd.url, "hutch/nodes/" + leader.name) or b"{}").get("ports"):
        return None
    return leader


def test_a_node_with_data_started_just_after_two_empty_nodes_keeps_every_message_and_user(tmp_path):
    """The issue's scenario: n1 ran alone (500 confirmed messages, a user),
    is stopped, and restarted with --cluster-etcd right after two empty
    nodes joined a fresh etcd. Before the fix one of the empty nodes was
    elected at once and n1, following it, lost its queue, messages and
    user. Now the empty nodes wait (2 x lease_ttl) and n1 founds the
    cluster with its data; the others copy it, and it survives n1's stop."""
    etcd = EtcdProcess(tmp_path).start()
    nodes = make_nodes(tmp_path, etcd.url, 3, "--cluster-lease-ttl", "5")
    n1, n2, n3 = nodes
    try:
        fill_alone(n1)
        n2.start()
        n3.start()
        until(lambda: registered(etcd, n2, n3), 60, "the two empty nodes to join etcd")
        n1.start()
        until(lambda: len(in_sync(etcd)) == 3, 90, "three nodes in sync")
        leader = until(lambda: serving_leader(etcd, nodes), 30, "a serving leader")
        assert leader is n1
        assert message_count(n1, "kept") == MESSAGES
        assert has_user(n1, "keeper")
        n1.stop()
        leader = until(lambda: serving_leader(etcd, nodes), 60, "another leader")
        assert message_count(leader, "kept") == MESSAGES
        assert has_user(leader, "keeper")
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()
        print_logs(nodes)


def test_a_node_with_data_refuses_an_empty_cluster_formed_without_it_and_force_boot_makes_its_data_the_clusters(
        tmp_path):
    """n2 and n3 formed a cluster before n1 (with data of its own) arrived:
    n1 does not follow them (its data would be replaced) and says what to
    do. The operator stops n2 and n3 and runs `hutchctl force_boot` on n1's
    data directory: n1 leads with its data, and n2 and n3, rejoining, set
    aside the files they give up (beside their data directories)."""
    etcd = EtcdProcess(tmp_path).start()
    nodes = make_nodes(tmp_path, etcd.url, 3)
    n1, n2, n3 = nodes
    try:
        fill_alone(n1)
        n2.start()
        n3.start()
        until(lambda: len(in_sync(etcd)) == 2, 60, "the empty cluster")
        publish_confirmed(leader_of(etcd, nodes), "theirs", 10)
        n1.start()
        until(lambda: "holds data of its own (it never was in a cluster)" in n1.log, 30, "n1 to refuse")
        assert "hutchctl force_boot" in n1.log
        assert sorted(in_sync(etcd)) == ["n2", "n3"]
        n1.stop()
        n1.start_alone()  # n1's data is untouched
        assert message_count(n1, "kept") == MESSAGES
        n1.stop()

        n2.stop()
        n3.stop()
        done = hutchctl("force_boot", "--data-dir", str(n1.data_dir))
        assert done.returncode == 0, done.stderr
        n1.start()
        until(lambda: leader_of(etcd, nodes) is n1 and n1.serving(), 60, "n1 to lead")
        n2.start()
        n3.start()
        until(lambda: len(in_sync(etcd)) == 3, 90, "three nodes in sync")
        assert message_count(n1, "kept") == MESSAGES
        assert has_user(n1, "keeper")
        for node in (n2, n3):
            aside = glob.glob(str(node.data_dir) + ".set-aside-*")
            assert aside, "%s set nothing aside" % node.name
            assert "are moved to" in node.log
        refused = hutchctl("force_boot", "--data-dir", str(tmp_path / "nowhere"))
        assert refused.returncode != 0 and "is not a hutch data directory" in refused.stderr
    finally:
        for node in nodes:
            node.stop()
        etcd.stop()
        print_logs(nodes)


def delete_keys(etcd) -> None:
    import asyncio
    import urllib.parse

    import aetcd

    async def delete():
        parts = urllib.parse.urlsplit(etcd.url)
        client = aetcd.Client(host=parts.hostname, port=parts.port, timeout=5)
        try:
            await client.delete_prefix(b"hutch/")
        finally:
            await client.close()

    asyncio.run(delete())


def test_etcd_losing_hutchs_keys_while_the_nodes_run_loses_nothing(tmp_path):
    """hutch's keys are deleted from etcd under a running cluster: the
    leader notices and stops leading, and the cluster is re-established
    (same identity) from its most complete member, with every message."""
    with running(tmp_path, 3) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        identity = json.loads(etcd_get(etcd.url, "hutch/cluster"))["id"]
        publish_confirmed(leader, "kept", 300)
        delete_keys(etcd)
        until(lambda: any("re-established in etcd" in n.log for n in nodes), 60, "the cluster to be re-established")
        until(lambda: len(in_sync(etcd)) == 3, 90, "three nodes in sync again")
        assert json.loads(etcd_get(etcd.url, "hutch/cluster"))["id"] == identity
        new = until(lambda: serving_leader(etcd, nodes), 30, "a serving leader")
        assert "re-established in etcd" in new.log
        assert message_count(new, "kept") == 300


def test_etcd_losing_its_keys_with_a_member_gone_waits_and_force_boot_chooses(tmp_path):
    """The keys are lost while the leader is down: the others cannot know
    it held no more than they do, so they wait and say so, until the
    operator names the node to lead (hutchctl force_boot)."""
    with running(tmp_path, 3) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        publish_confirmed(leader, "kept", 300)
        first, second = [n for n in nodes if n is not leader]
        until(lambda: all(len(json.loads((n.data_dir / "cluster_state").read_text())["in_sync"]) == 3
                          for n in (first, second)), 30, "the followers to keep the in-sync set on disk")
        leader.kill()
        delete_keys(etcd)
        until(lambda: "waiting for %s" % leader.name in first.log, 30, "the others to wait for the leader")
        assert leader_of(etcd, nodes) is None
        done = hutchctl("force_boot", "--data-dir", str(first.data_dir))
        assert done.returncode == 0, done.stderr
        until(lambda: serving_leader(etcd, nodes) is first, 60, "the forced node to lead")
        assert message_count(first, "kept") == 300
        until(lambda: second.name in in_sync(etcd), 60, "the other node to follow")
        leader.start()
        until(lambda: len(in_sync(etcd)) == 3, 90, "the old leader back in sync")


def test_a_restarted_node_with_the_most_complete_copy_still_wins_and_a_killed_leader_sets_aside(tmp_path):
    """min_in_sync_replicas 1 on three nodes: B (the lower name) stalls
    while confirms go on with C alone. Every node is then killed, and B and
    C restarted: each knows how much it holds (before: a restarted process
    posted "unknown", B won the tie on its name and the messages only C had
    were lost), so C leads with every confirmed message. The old leader,
    killed with writes it may not have replicated, rejoins and moves what it
    gives up beside its data directory."""
    from test_cluster_failover import MIN_IN_SYNC_1, confirm_while_stopped

    with running(tmp_path, 3, *MIN_IN_SYNC_1) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        behind, ahead = sorted((n for n in nodes if n is not leader), key=lambda n: n.name)
        confirmed = confirm_while_stopped(leader, behind, "complete")
        assert behind.name in in_sync(etcd)
        for node in (leader, ahead, behind):
            node.kill()
        behind.start()
        ahead.start()
        new = until(lambda: (lambda n: n if n in (behind, ahead) else None)(serving_leader(etcd, nodes)), 60,
                    "a leader among the restarted nodes")
        posted = {n.name: etcd_get(etcd.url, "hutch/positions/" + n.name) for n in (behind, ahead)}
        assert new is ahead, "%s was elected, not %s; positions: %s" % (new.name, ahead.name, posted)
        assert message_count(ahead, "complete") == confirmed
        leader.start()
        until(lambda: leader.name in in_sync(etcd), 90, "the old leader in sync")
        assert glob.glob(str(leader.data_dir) + ".set-aside-*"), "the old leader set nothing aside"
        assert "are moved to" in leader.log


def put_keys(etcd, values: dict) -> None:
    import asyncio
    import urllib.parse

    import aetcd

    async def put():
        parts = urllib.parse.urlsplit(etcd.url)
        client = aetcd.Client(host=parts.hostname, port=parts.port, timeout=5)
        try:
            await client.delete_prefix(b"hutch/")
            for key, value in values.items():
                await client.put(key.encode(), value)
        finally:
            await client.close()

    asyncio.run(put())


def test_etcd_restored_from_an_older_backup_or_given_a_new_prefix_loses_nothing(tmp_path):
    """etcd's keys replaced by an older copy (as a restore from a backup
    taken before a failover would): the record's term is older than the
    nodes have seen, so they re-establish the cluster (a higher term) from
    the most complete member instead of trusting it. Then every node is
    restarted with another etcd prefix (no keys there): the same."""
    with running(tmp_path, 3) as (etcd, nodes):
        backup = {key: etcd_get(etcd.url, key) for key in ("hutch/cluster", "hutch/in_sync")}
        leader = leader_of(etcd, nodes)
        publish_confirmed(leader, "kept", 100)
        leader.kill()
        new = until(lambda: (lambda n: n if n not in (None, leader) else None)(serving_leader(etcd, nodes)), 60,
                    "another leader")
        leader.start()
        until(lambda: len(in_sync(etcd)) == 3, 90, "three nodes in sync")
        publish_confirmed(new, "kept", 100, 100)
        term = json.loads(etcd_get(etcd.url, "hutch/cluster"))["term"]
        assert json.loads(backup["hutch/cluster"])["term"] < term

        put_keys(etcd, backup)
        until(lambda: json.loads(etcd_get(etcd.url, "hutch/cluster") or b'{"term": 0}')["term"] > term, 60,
              "the cluster re-established with a newer term")
        until(lambda: len(in_sync(etcd)) == 3, 90, "three nodes in sync again")
        assert message_count(until(lambda: serving_leader(etcd, nodes), 30, "a leader"), "kept") == 200

        for node in nodes:
            node.stop()
        for node in nodes:
            node.extra = node.extra + ("--cluster-etcd-prefix", "moved")
            node.start()
        until(lambda: len(json.loads(etcd_get(etcd.url, "moved/in_sync") or b"[]")) == 3, 90,
              "the cluster under the new prefix")
        name = etcd_get(etcd.url, "moved/leader").decode()
        leader = next(n for n in nodes if n.name == name)
        until(lambda: json.loads(etcd_get(etcd.url, "moved/nodes/" + name)).get("ports"), 30, "it to serve")
        assert message_count(leader, "kept") == 200
