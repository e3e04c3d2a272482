"""Peek and move, hutch's management API extensions (GET
/api/queues/{vhost}/{name}/peek, POST /api/queues/{vhost}/{name}/move):
a broker process with a small memory budget (queues page out), real HTTP
calls, and pika clients that publish and consume over real sockets.
Durability after a move is checked by copying the data directory the
moment the move answers, with the node stopped (what a crash at that
instant leaves), and starting a broker process on the copy.

Two tests stay in process: driving a move step by step to delete its
source while it waits for the disk, and a delayed exchange's held count
(neither is observable from outside at the instant that matters).
"""
from __future__ import annotations

import asyncio
import base64
import shutil

import aio_pika
import pika
import pytest

from amqp_server.shared.config import (BrokerConfig, ManagementConfig, MQTTConfig, PrometheusConfig, StorageConfig,
                                       StreamConfig)
from amqp_server.process.server import BrokerServer
from conftest import launch
from helpers import connect, drain, unique
from http_api import Api, segment

# a 2 MB paging budget under a watermark far above the broker's memory (no alarm)
PAGING = ("--storage-vm-memory-high-watermark-absolute", "4000000000", "--storage-paging-ratio", "0.0005",
          "--storage-segment-entries", "1024")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def paging_broker(tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("peek-move"), *PAGING, expect=("AMQP", "HTTP"))
    yield proc
    proc.stop()


@pytest.fixture
def api(paging_broker) -> Api:
    return Api(paging_broker.ports["HTTP"])


@pytest.fixture
def channel(paging_broker):
    connection = connect(paging_broker.port)
    yield connection.channel()
    connection.close()


def declare(channel, prefix: str, **kwargs) -> str:
    name = unique(prefix)
    channel.queue_declare(name, **kwargs)
    return name


def publish(channel, queue: str, bodies, properties=None) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body, properties)


def peek(api, queue: str, count=None, vhost="/"):
    query = "" if count is None else "?count=%s" % count
    return api.get("/api/queues/%s/%s/peek%s" % (segment(vhost), segment(queue), query))


def move(api, source: str, destination: dict, count=None, vhost="/"):
    return api.post("/api/queues/%s/%s/move" % (segment(vhost), segment(source)),
                    {"destination": destination, "count": count})


def bodies_of(shown) -> list[bytes]:
    return [m["payload"].encode() if m["payload_encoding"] == "string" else base64.b64decode(m["payload"])
            for m in shown]


def consume_all(channel, queue: str) -> list[bytes]:
    return [body for _method, _props, body in drain(channel, queue)]


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


# -- peek --------------------------------------------------------------------------


def test_peek_shows_the_first_messages_and_leaves_them(api, channel):
    queue = declare(channel, "peek")
    channel.basic_publish("", queue, b"first", pika.BasicProperties(
        headers={"h": "v", "n": 7}, content_type="text/plain", message_id="id-1", delivery_mode=2))
    publish(channel, queue, [b"second", b"third", b"\xff\xfe"])
    method, _props, _body = channel.basic_get(queue)  # "first", then given back: redelivered
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert ready(channel, queue) == 4  # a round trip: the nack is in

    reply = peek(api, queue, 3)
    assert reply.status == 200
    assert bodies_of(reply.body) == [b"first", b"second", b"third"]
    assert [m["redelivered"] for m in reply.body] == [True, False, False]
    assert [m["message_count"] for m in reply.body] == [3, 2, 1]
    first = reply.body[0]
    assert (first["exchange"], first["routing_key"], first["payload_bytes"]) == ("", queue, 5)
    assert first["properties"] == {"content_type": "text/plain", "headers": {"h": "v", "n": 7}, "delivery_mode": 2,
                                   "message_id": "id-1"}
    everything = peek(api, queue, 100).body
    assert bodies_of(everything) == [b"first", b"second", b"third", b"\xff\xfe"]
    assert everything[3]["payload_encoding"] == "base64"
    assert bodies_of(peek(api, queue).body) == [b"first"]  # count defaults to 1
    assert peek(api, queue, 0).body == []
    assert ready(channel, queue) == 4
    assert consume_all(channel, queue) == [b"first", b"second", b"third", b"\xff\xfe"]


def test_peek_reads_paged_out_messages_back_without_disturbing_the_queue(api, channel):
    queue = declare(channel, "peek-paged", durable=True)
    count = 6000  # more than a queue keeps in RAM (2048): the rest is on disk only (delta)
    # every tenth one too large to be embedded in the index: read from the message store
    bodies = [b"%05d" % i + b"." * (5000 if i % 10 == 0 else 300) for i in range(count)]
    publish(channel, queue, bodies, PERSISTENT)
    ready(channel, queue)
    states = api.get("/api/queues/%2F/" + queue).body["message_states"]
    assert states["delta"] > 0, states
    assert bodies_of(peek(api, queue, count + 10).body) == bodies
    assert api.get("/api/queues/%2F/" + queue).body["message_states"] == states
    assert consume_all(channel, queue) == bodies


def test_peek_of_a_priority_queue_follows_priorities(api, channel):
    queue = declare(channel, "peek-prio", arguments={"x-max-priority": 3})
    for body, priority in ((b"low", 1), (b"none", None), (b"high", 3), (b"low2", 1)):
        channel.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    ready(channel, queue)
    assert bodies_of(peek(api, queue, 3).body) == [b"high", b"low", b"low2"]


def test_peek_errors(api, channel):
    reply = peek(api, "no-such-queue")
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    queue = declare(channel, "peek")
    for count in ("-1", "x"):
        assert peek(api, queue, count).status == 400


# -- move ----------------------------------------------------------------------------


def test_move_everything_to_another_queue(api, channel):
    source, target = declare(channel, "dlq"), declare(channel, "work")
    channel.basic_publish("", source, b"with-props", pika.BasicProperties(
        headers={"x-death": [{"count": 1}]}, correlation_id="c1"))
    publish(channel, source, [b"m%d" % i for i in range(600)])
    ready(channel, source)
    assert move(api, source, {"queue": target}).body == {"moved": 601}
    assert ready(channel, source) == 0
    method, props, body = channel.basic_get(target, auto_ack=True)
    assert (body, props.correlation_id, method.routing_key) == (b"with-props", "c1", source)
    assert props.headers["x-death"][0]["count"] == 1
    assert consume_all(channel, target) == [b"m%d" % i for i in range(600)]


def test_move_at_most_n_keeps_the_rest_in_order(api, channel):
    source, target = declare(channel, "dlq"), declare(channel, "work")
    publish(channel, source, [b"m%d" % i for i in range(10)])
    ready(channel, source)
    assert move(api, source, {"queue": target}, 4).body == {"moved": 4}
    assert consume_all(channel, target) == [b"m0", b"m1", b"m2", b"m3"]
    assert consume_all(channel, source) == [b"m%d" % i for i in range(4, 10)]


def test_move_through_an_exchange_routes_each_by_its_key_and_stops_at_an_unroutable_one(api, channel):
    source, orders = declare(channel, "dlq"), declare(channel, "orders")
    exchange, staging = unique("replay"), unique("staging")
    channel.exchange_declare(exchange, "direct")
    channel.queue_bind(orders, exchange, "orders")
    # The source gets its messages through a fanout exchange, so each keeps its own key.
    channel.exchange_declare(staging, "fanout")
    channel.queue_bind(source, staging)
    for body, key in ((b"o1", "orders"), (b"o2", "orders"), (b"lost", "nowhere"), (b"o3", "orders")):
        channel.basic_publish(staging, key, body)
    ready(channel, source)

    assert move(api, source, {"exchange": exchange}).body == {"moved": 2}
    method, _props, body = channel.basic_get(orders, auto_ack=True)
    assert (body, method.exchange, method.routing_key) == (b"o1", exchange, "orders")
    assert consume_all(channel, orders) == [b"o2"]
    # the unroutable one is still first in the source (given back, redelivered), the rest behind it
    method, _props, body = channel.basic_get(source, auto_ack=True)
    assert (body, method.redelivered) == (b"lost", True)
    assert consume_all(channel, source) == [b"o3"]


def test_move_through_an_exchange_with_a_new_routing_key(api, channel):
    source, target = declare(channel, "dlq"), declare(channel, "work")
    publish(channel, source, [b"a", b"b"])
    ready(channel, source)
    assert move(api, source, {"exchange": "amq.default", "routing_key": target}).body == {"moved": 2}
    assert consume_all(channel, target) == [b"a", b"b"]
    publish(channel, source, [b"c"])
    ready(channel, source)
    assert move(api, source, {"exchange": "", "routing_key": target}).body == {"moved": 1}


def test_move_from_a_priority_queue_takes_the_highest_first(api, channel):
    source = declare(channel, "dlq", arguments={"x-max-priority": 5})
    target = declare(channel, "work")
    for body, priority in ((b"low", 1), (b"high", 5), (b"mid", 3), (b"high2", 5)):
        channel.basic_publish("", source, body, pika.BasicProperties(priority=priority))
    ready(channel, source)
    assert move(api, source, {"queue": target}, 3).body == {"moved": 3}
    assert consume_all(channel, target) == [b"high", b"high2", b"mid"]
    assert consume_all(channel, source) == [b"low"]


def test_move_errors(api, channel):
    source = declare(channel, "dlq")
    reply = move(api, source, {"queue": source})
    assert (reply.status, reply.body["error"]) == (400, "bad_request")
    reply = move(api, source, {"queue": "no-such-queue"})
    assert (reply.status, reply.body) == (404, {"error": "not_found", "reason": "no queue 'no-such-queue' in vhost '/'"})
    reply = move(api, source, {"exchange": "no-such-exchange"})
    assert (reply.status, reply.body) == (404, {"error": "not_found",
                                                "reason": "no exchange 'no-such-exchange' in vhost '/'"})
    assert move(api, "no-such-queue", {"queue": source}).status == 404
    for destination in ({}, {"queue": source, "exchange": "amq.direct"}, {"queue": 7}, "q"):
        assert move(api, source, destination).status == 400, destination
    assert move(api, source, {"queue": declare(channel, "work")}, -1).status == 400


def test_peek_and_move_need_the_users_permissions(api, channel):
    user, vhost = unique("shoveller"), unique("vh")
    api.put("/api/vhosts/" + vhost)
    api.put("/api/permissions/%s/guest" % vhost, {"configure": ".*", "write": ".*", "read": ".*"})
    api.put("/api/users/" + user, {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%s/%s" % (vhost, user), {"configure": "", "write": "^w", "read": "^r"})
    try:
        for queue in ("rq", "wq", "xq"):
            api.put("/api/queues/%s/%s" % (vhost, queue), {})
        limited = api.as_user(user, "pw")
        denied = (401, {"error": "not_authorised", "reason": "Access refused."})
        reply = peek(limited, "xq", vhost=vhost)
        assert (reply.status, reply.body) == denied
        assert peek(limited, "rq", vhost=vhost).status == 200
        reply = move(limited, "xq", {"queue": "wq"}, vhost=vhost)
        assert (reply.status, reply.body) == denied
        reply = move(limited, "rq", {"queue": "xq"}, vhost=vhost)
        assert (reply.status, reply.body) == denied
        reply = move(limited, "rq", {"exchange": "amq.direct", "routing_key": "wq"}, vhost=vhost)
        assert (reply.status, reply.body) == denied
        assert move(limited, "rq", {"queue": "wq"}, vhost=vhost).body == {"moved": 0}
    finally:
        api.delete("/api/vhosts/" + vhost)
        api.delete("/api/users/" + user)


def test_moved_persistent_messages_are_on_disk_when_the_move_answers(api, channel, paging_broker, tmp_path):
    """A copy of the data directory taken as the move answers (a crash at that
    instant) holds every moved message in the durable destination; a message
    may also still be in the source (at least once), none is lost."""
    source, target = declare(channel, "dlq", durable=True), declare(channel, "work", durable=True)
    bodies = [b"p%04d" % i + b"." * 5000 * (i % 2) for i in range(3000)]  # large ones go to the message store
    publish(channel, source, bodies, PERSISTENT)
    ready(channel, source)
    assert move(api, source, {"queue": target}, 2000).body == {"moved": 2000}
    snapshot = tmp_path / "crashed"
    with paging_broker.frozen():
        shutil.copytree(paging_broker.data_dir, snapshot)
    recovered = launch(tmp_path, "--data-dir", str(snapshot), "--storage-segment-entries", "1024")
    try:
        connection = connect(recovered.port)
        recovered_channel = connection.channel()
        assert consume_all(recovered_channel, target) == bodies[:2000]
        left = consume_all(recovered_channel, source)
        assert left[-1000:] == bodies[2000:]
        assert set(left[:-1000]) <= set(bodies[:2000])
        connection.close()
        assert "Traceback" not in recovered.log
    finally:
        recovered.stop()


# -- in process ----------------------------------------------------------------------


async def started(data_dir) -> BrokerServer:
    """An in-process broker whose memory budget makes queues page out."""
    config = BrokerConfig(bind="127.0.0.1", port=0, data_dir=str(data_dir),
                          storage=StorageConfig(vm_memory_high_watermark_absolute=4000000000, paging_ratio=0.0005,
                                                        segment_entries=1024),
                          management=ManagementConfig(enabled=False), prometheus=PrometheusConfig(enabled=False),
                          mqtt=MQTTConfig(enabled=False), stream=StreamConfig(enabled=False))
    broker = BrokerServer(config)
    await broker.start()
    broker.port = broker.servers[0].sockets[0].getsockname()[1]
    broker.vhost = broker.broker.vhosts["/"]
    return broker


async def synced(channel) -> None:
    """A round trip on the channel: every publish sent before it is routed."""
    await channel.declare_exchange("amq.direct", passive=True)


async def test_a_move_waiting_for_the_disk_ends_when_the_source_is_deleted(tmp_path):
    """After a restart a durable queue's messages are all on disk: a move
    first waits for the read back. Deleting the queue then ends the move
    (driven step by step, so the delete surely comes while it waits)."""
    first = await started(tmp_path / "data")
    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:%d/" % first.port)
    channel = await connection.channel()
    source = await channel.declare_queue(unique("dlq"), durable=True)
    target = await channel.declare_queue(unique("work"), durable=True)
    for _ in range(10):
        await channel.default_exchange.publish(aio_pika.Message(b"m", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                                               routing_key=source.name)
    await synced(channel)
    await connection.close()
    await first.stop()
    second = await started(tmp_path / "data")
    try:
        assert second.vhost.queues[source.name].backing.state_counts()["delta"] == 10
        moving = second.vhost.move_messages(source.name, target.name)
        waiting = moving.send(None)  # runs up to the wait for the disk read
        assert isinstance(waiting, asyncio.Future) and not waiting.done()
        second.vhost.delete_queue(source.name, None)
        with pytest.raises(StopIteration) as finished:
            moving.send(None)
        assert finished.value.value == 0
        assert second.vhost.queues[target.name].message_count == 0
    finally:
        await second.stop()


# -- delayed messages held ------------------------------------------------------------


async def test_held_counts_the_messages_a_delayed_exchange_holds(tmp_path):
    server = await started(tmp_path / "data")
    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:%d/" % server.port)
    client = await connection.channel(publisher_confirms=False)
    exchange = await client.declare_exchange(unique("delayed"), "x-delayed-message",
                                             arguments={"x-delayed-type": "fanout"})
    other = await client.declare_exchange(unique("delayed"), "x-delayed-message",
                                          arguments={"x-delayed-type": "fanout"})
    for delay in (60000, 60000, 0):
        await exchange.publish(aio_pika.Message(b"m", headers={"x-delay": delay}), routing_key="")
    await other.publish(aio_pika.Message(b"m", headers={"x-delay": 60000}), routing_key="")
    await synced(client)
    assert (server.vhost.delayer.held(exchange.name), server.vhost.delayer.held(other.name)) == (2, 1)
    await connection.close()
    await server.stop()
