"""Joining a cluster on a real etcd (tests/cluster_kit.py): a node that
cannot reach etcd says so, keeps trying, and leads once it can. Failover and
fencing: tests/test_cluster_failover.py."""
from __future__ import annotations

import json

import pika
import pytest

from cluster_kit import EtcdProcess, etcd_get, make_nodes, until

pytestmark = pytest.mark.timeout(90)


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
        # an empty node founds a cluster after 2 x lease_ttl (a node with data may be on its way)
        until(node.leads, 30, "the node to lead once etcd is up")
        confirmed_publish(node.url, "q", b"m")
        info = json.loads(etcd_get(etcd.url, "hutch/nodes/n1"))
        assert info["role"] == "leader" and info["ports"]["amqp"] == node.port
    finally:
        node.stop()
        etcd.stop()


def test_a_client_of_a_lone_first_node_waits_until_it_founds_the_cluster(tmp_path):
    """A lone empty node founds its cluster only after 2 x lease_ttl (8 s here); a client that
    connects as soon as its port accepts is held until it leads, then served, instead of
    having its socket closed before the protocol header (pika: IncompatibleProtocolError)."""
    etcd = EtcdProcess(tmp_path).start()
    (node,) = make_nodes(tmp_path, etcd.url, 1, "--cluster-lease-ttl", "4")
    try:
        node.start()
        until(node.serving, 30, "the node's port to accept")
        assert not node.leads()
        confirmed_publish(node.url, "early", b"held, then served")
        assert node.leads()
        with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
            assert connection.channel().basic_get("early", auto_ack=True)[2] == b"held, then served"
    finally:
        node.stop()
        etcd.stop()
