"""Shovels and federation between hutch and the real RabbitMQ, both ways:
hutch's links pointed at RabbitMQ, and RabbitMQ's own shovel and federation
plugins pointed at hutch. Each test works in a fresh vhost on each broker."""
from __future__ import annotations

import pika
import pika.exceptions
import pytest

from helpers import wait_for
from http_api import segment

pytestmark = [pytest.mark.differential, pytest.mark.timeout(120)]


@pytest.fixture
def pair(vhost_on_both, broker, rabbitmq_url):
    """(hutch Api, RabbitMQ Api, vhost name, hutch vhost URI, RabbitMQ vhost URI)."""
    api, rabbit, name = vhost_on_both
    rabbit_amqp = pika.URLParameters(rabbitmq_url)
    return (api, rabbit, name, "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(name)),
            "amqp://%s:%s@%s:%d/%s" % (rabbit_amqp.credentials.username, rabbit_amqp.credentials.password,
                                       rabbit_amqp.host, rabbit_amqp.port, segment(name)))


def channel_at(uri: str):
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def publish(uri: str, queue: str, count: int) -> None:
    connection, channel = channel_at(uri)
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2, headers={"i": i}))
    connection.close()


def collect(uri: str, queue: str, count: int) -> list:
    """`count` messages from `queue`, once the link has declared it."""
    connection, channel = channel_at(uri)
    got = []

    def more():
        nonlocal channel
        try:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            channel = connection.channel()
            return False
        if method is not None:
            got.append((properties, body))
        return len(got) >= count
    wait_for(more, 60)
    connection.close()
    return got


def shovel(side, vhost: str, name: str, value: dict) -> None:
    reply = side.put("/api/parameters/shovel/%s/%s" % (segment(vhost), name), {"value": value})
    assert reply.status == 201, reply.body


@pytest.mark.parametrize("runs_on", ["hutch", "rabbitmq"])
def test_shovel_hutch_to_rabbitmq(pair, runs_on):
    api, rabbit, vhost, hutch_uri, rabbit_uri = pair
    publish(hutch_uri, "out", 100)
    shovel(api if runs_on == "hutch" else rabbit, vhost, "h2r",
           {"src-uri": hutch_uri, "src-queue": "out", "dest-uri": rabbit_uri, "dest-queue": "in"})
    got = collect(rabbit_uri, "in", 100)
    assert [body for _p, body in got] == [b"%d" % i for i in range(100)]
    assert got[7][0].headers == {"i": 7} and got[7][0].delivery_mode == 2


@pytest.mark.parametrize("runs_on", ["hutch", "rabbitmq"])
def test_shovel_rabbitmq_to_hutch(pair, runs_on):
    api, rabbit, vhost, hutch_uri, rabbit_uri = pair
    publish(rabbit_uri, "out", 100)
    shovel(api if runs_on == "hutch" else rabbit, vhost, "r2h",
           {"src-uri": rabbit_uri, "src-queue": "out", "dest-uri": hutch_uri, "dest-queue": "in",
            "ack-mode": "on-confirm"})
    got = collect(hutch_uri, "in", 100)
    assert [body for _p, body in got] == [b"%d" % i for i in range(100)]


def federate(side, vhost: str, upstream_uri: str, pattern: str) -> None:
    assert side.put("/api/parameters/federation-upstream/%s/up" % segment(vhost),
                    {"value": {"uri": upstream_uri}}).status == 201
    assert side.put("/api/policies/%s/fed" % segment(vhost),
                    {"pattern": pattern, "definition": {"federation-upstream": "up"}}).status == 201


def running_link(side, vhost: str) -> dict:
    return wait_for(lambda: next((link for link in side.get("/api/federation-links/" + segment(vhost)).body
                                  if link["status"] == "running"), None), 60)


@pytest.mark.parametrize("downstream", ["hutch", "rabbitmq"])
def test_federated_exchange_across(pair, downstream):
    api, rabbit, vhost, hutch_uri, rabbit_uri = pair
    down_side, down_uri, up_uri = (api, hutch_uri, rabbit_uri) if downstream == "hutch" else \
        (rabbit, rabbit_uri, hutch_uri)
    up_connection, up_channel = channel_at(up_uri)
    up_channel.exchange_declare("fx", "direct", durable=True)
    down_connection, down_channel = channel_at(down_uri)
    down_channel.exchange_declare("fx", "direct", durable=True)
    down_channel.queue_declare("dq")
    down_channel.queue_bind("dq", "fx", "wanted")
    federate(down_side, vhost, up_uri, "^fx$")
    running_link(down_side, vhost)
    up_side = rabbit if downstream == "hutch" else api
    wait_for(lambda: any(b["routing_key"] == "wanted" and b["source"] == "fx"
                         for b in up_side.get("/api/bindings/" + segment(vhost)).body), 60)
    for key in ("other", "wanted"):
        up_channel.basic_publish("fx", key, key.encode())
    got = collect(down_uri, "dq", 1)
    assert got[0][1] == b"wanted"
    assert len(got[0][0].headers["x-received-from"]) == 1
    up_connection.close()
    down_connection.close()


@pytest.mark.parametrize("downstream", ["hutch", "rabbitmq"])
def test_federated_queue_across(pair, downstream):
    api, rabbit, vhost, hutch_uri, rabbit_uri = pair
    down_side, down_uri, up_uri = (api, hutch_uri, rabbit_uri) if downstream == "hutch" else \
        (rabbit, rabbit_uri, hutch_uri)
    publish(up_uri, "fq", 10)
    down_connection, down_channel = channel_at(down_uri)
    down_channel.queue_declare("fq", durable=True)
    federate(down_side, vhost, up_uri, "^fq$")
    running_link(down_side, vhost)
    got = []
    down_channel.basic_consume("fq", lambda ch, method, props, body: (got.append(body),
                                                                          ch.basic_ack(method.delivery_tag)))
    wait_for(lambda: down_connection.process_data_events(0.05) or len(got) == 10, 60)
    assert sorted(got, key=int) == [b"%d" % i for i in range(10)]
    down_connection.close()
