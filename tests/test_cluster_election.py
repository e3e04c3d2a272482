"""Leader election and fencing on a real etcd (tests/cluster_kit.py): nodes
that wait for etcd, one leader at a time, and a stalled leader that confirms
nothing once its lease has run out."""
from __future__ import annotations

import json
import signal
import threading
import time

import pika
import pika.exceptions
import pytest

from cluster_kit import EtcdProcess, etcd_get, leader_of, make_nodes, until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cluster(tmp_path):
    """(etcd, nodes factory); everything stopped afterwards."""
    started = {"etcd": None, "nodes": []}

    def make(count: int):
        etcd = EtcdProcess(tmp_path).start()
        started["etcd"] = etcd
        nodes = make_nodes(tmp_path, etcd.url, count)
        started["nodes"] += nodes
        return etcd, nodes

    yield make
    for node in started["nodes"]:
        node.stop()
    if started["etcd"] is not None:
        started["etcd"].stop()


def confirmed_publish(url: str, queue: str, body: bytes) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def test_a_node_that_cannot_reach_etcd_says_so_and_leads_once_it_can(tmp_path):
    etcd = EtcdProcess(tmp_path)  # its port is chosen, nothing listens there yet
    (node,) = make_nodes(tmp_path, etcd.url, 1)
    try:
        node.start()
        until(lambda: "cannot reach etcd" in node.log, 30, "the node to say it cannot reach etcd")
        assert node.running() and not node.serving()
        etcd.start()
        until(node.serving, 30, "the node to lead once etcd is up")
        assert etcd_get(etcd.url, "hutch/leader") == b"n1"
        confirmed_publish(node.url, "q", b"m")
        info = json.loads(etcd_get(etcd.url, "hutch/nodes/n1"))
        assert info["role"] == "leader" and info["ports"]["amqp"] == node.port
    finally:
        node.stop()
        etcd.stop()


def test_one_leader_and_a_stalled_leader_confirms_nothing_after_its_lease(cluster):
    etcd, nodes = cluster(2)
    for node in nodes:
        node.start()
    leader = until(lambda: leader_of(etcd, nodes), 30, "a leader")
    until(leader.serving, 30, "the leader to listen")
    other = next(n for n in nodes if n is not leader)
    assert not other.serving()
    confirmed_publish(leader.url, "q", b"before")

    connection = pika.BlockingConnection(pika.URLParameters(leader.url))
    channel = connection.channel()
    channel.confirm_delivery()
    outcome = {}

    def publish_while_stalled():
        try:
            channel.basic_publish("", "q", b"during", pika.BasicProperties(delivery_mode=2))
            outcome["confirmed"] = True
        except Exception as exc:  # noqa: BLE001 - whatever ends the wait: not a confirm
            outcome["error"] = exc

    leader.signal(signal.SIGSTOP)
    stalled_at = time.monotonic()
    publisher = threading.Thread(target=publish_while_stalled)
    publisher.start()
    # The lease (2 s) runs out while the process is frozen; etcd drops the leader key.
    until(lambda: etcd_get(etcd.url, "hutch/leader") is None, 10, "etcd to end the stalled leader's lease")
    assert time.monotonic() - stalled_at >= 1.5
    leader.signal(signal.SIGCONT)
    publisher.join(30)
    assert not publisher.is_alive()
    assert "confirmed" not in outcome, "a stale leader confirmed a publish"
    until(lambda: "the etcd lease ran out" in leader.log, 10, "the stalled node to fence itself")
    # It rejoined; the only in-sync node, it is elected again and serves what it had confirmed.
    until(lambda: leader_of(etcd, nodes) is leader and leader.serving(), 30, "the node to lead again")
    with pika.BlockingConnection(pika.URLParameters(leader.url)) as again:
        method, _, body = again.channel().basic_get("q", auto_ack=True)
        assert body == b"before"
    assert not other.serving()
