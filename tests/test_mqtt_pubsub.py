"""MQTT clients on the broker: CONNECT and login, QoS 0/1 publish and
subscribe, and AMQP <-> MQTT through amq.topic (aiomqtt, paho-mqtt, pika,
raw sockets for exact packets)."""
from __future__ import annotations

import asyncio
import struct
import threading

import aiomqtt
import paho.mqtt.client as paho
import pika
import pytest

from helpers import connect, exists, unique, wait_for
from http_api import segment
from mqtt_raw import (DISCONNECT, PINGREQ, RawMQTT, connect_packet, parse_publish, publish_packet, puback_packet,
                      subscribe_packet)


@pytest.fixture
def mqtt_port(broker) -> int:
    return broker.ports["MQTT"]


def client(port: int, **kwargs) -> aiomqtt.Client:
    kwargs.setdefault("identifier", unique("c"))
    return aiomqtt.Client("127.0.0.1", port, **kwargs)


async def next_message(c: aiomqtt.Client, timeout: float = 5.0) -> aiomqtt.Message:
    return await asyncio.wait_for(anext(aiter(c.messages)), timeout)


async def test_qos0_and_qos1_between_mqtt_clients_with_wildcards(mqtt_port):
    room = unique("room")
    async with client(mqtt_port) as sub, client(mqtt_port) as pub:
        await sub.subscribe("%s/+/temp" % room, qos=1)
        await sub.subscribe("%s/kitchen/#" % room, qos=0)
        await pub.publish("%s/hall/temp" % room, b"19", qos=1)
        m = await next_message(sub)
        assert (str(m.topic), m.payload, m.qos) == ("%s/hall/temp" % room, b"19", 1)
        await pub.publish("%s/kitchen/light" % room, b"on", qos=0)
        m = await next_message(sub)
        assert (str(m.topic), m.payload, m.qos) == ("%s/kitchen/light" % room, b"on", 0)


async def test_delivery_qos_is_the_lower_of_publish_and_subscription(mqtt_port):
    topic = unique("t")
    async with client(mqtt_port) as sub, client(mqtt_port) as pub:
        await sub.subscribe(topic, qos=1)
        await pub.publish(topic, b"zero", qos=0)
        assert (await next_message(sub)).qos == 0


async def test_amqp_publisher_reaches_mqtt_subscriber(mqtt_port, broker):
    key = unique("dev")
    async with client(mqtt_port) as sub:
        await sub.subscribe("%s/status" % key, qos=1)
        with connect(broker.port) as conn:
            conn.channel().basic_publish("amq.topic", "%s.status" % key, b"from amqp",
                                         pika.BasicProperties(delivery_mode=2))
        m = await next_message(sub)
        assert (str(m.topic), m.payload, m.qos) == ("%s/status" % key, b"from amqp", 1)


def test_mqtt_publisher_reaches_amqp_queue(mqtt_port, broker):
    key = unique("sensor")
    with connect(broker.port) as conn:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", "%s.*" % key)
        done = threading.Event()
        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=unique("paho"))
        c.on_publish = lambda *args: done.set()
        c.connect("127.0.0.1", mqtt_port)
        c.loop_start()
        try:
            c.publish("%s/humidity" % key, b"40%", qos=1).wait_for_publish(5)
            assert done.wait(5)  # PUBACK
        finally:
            c.disconnect()
            c.loop_stop()
        method, props, body = _get(channel, queue)
        assert (method.routing_key, body) == ("%s.humidity" % key, b"40%")
        assert props.delivery_mode == 2
        assert props.headers == {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}


def _get(channel, queue):
    return wait_for(lambda: (lambda r: r if r[0] else None)(channel.basic_get(queue, auto_ack=True)))


def test_subscription_queue_is_rabbitmqs_and_goes_with_a_clean_session(mqtt_port, broker):
    cid = unique("cs")
    with connect(broker.port) as conn, RawMQTT(mqtt_port) as raw:
        assert raw.connect(cid) == b"\x00\x00"
        raw.send(subscribe_packet(1, ("q/a", 1), ("q/b", 0)))
        assert raw.read() == (9, 0, b"\x00\x01\x01\x00")
        channel = conn.channel()
        declared = channel.queue_declare("mqtt-subscription-%sqos1" % cid, passive=True)
        assert declared.method.consumer_count == 1
        channel.queue_declare("mqtt-subscription-%sqos0" % cid, passive=True)
        raw.send(DISCONNECT)
        assert raw.closed_by_server()
        wait_for(lambda: not exists(conn, "queue", "mqtt-subscription-%sqos1" % cid))


def test_pingreq_gets_pingresp_and_qos1_publish_gets_puback(mqtt_port):
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("p"))
        raw.send(PINGREQ)
        assert raw.read() == (13, 0, b"")
        raw.send(publish_packet(unique("nobody"), b"x", qos=1, pid=300))
        assert raw.read() == (4, 0, b"\x01\x2c")


def test_qos1_delivery_not_acked_is_redelivered_with_dup_to_a_persistent_session(mqtt_port):
    cid, topic = unique("ps"), unique("redeliver")
    with RawMQTT(mqtt_port) as raw:
        assert raw.connect(cid, clean=False) == b"\x00\x00"
        raw.send(subscribe_packet(1, (topic, 1)))
        raw.read()
        raw.send(publish_packet(topic, b"m1", qos=1, pid=1))
        seen = [raw.read(), raw.read()]
        publish = next(p for p in seen if p[0] == 3)
        assert parse_publish(publish[1], publish[2])[4] is False
    with RawMQTT(mqtt_port) as raw:
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        kind, flags, body = raw.read()
        topic_got, qos, pid, _retain, dup, payload = parse_publish(flags, body)
        assert (kind, topic_got, qos, dup, payload) == (3, topic, 1, True, b"m1")
        raw.send(puback_packet(pid))
        raw.send(DISCONNECT)
    with RawMQTT(mqtt_port) as raw:  # acked: nothing comes back; clean now removes the session
        assert raw.connect(cid, clean=True) == b"\x00\x00"


async def test_persistent_session_keeps_qos1_messages_while_away(mqtt_port, broker):
    cid, topic = unique("away"), unique("inbox")
    async with client(mqtt_port, identifier=cid, clean_session=False) as sub:
        await sub.subscribe(topic, qos=1)
    async with client(mqtt_port) as pub:
        await pub.publish(topic, b"while away", qos=1)
        await pub.publish(topic, b"qos0 while away", qos=0)
    async with client(mqtt_port, identifier=cid, clean_session=False) as sub:
        first = await next_message(sub)
        second = await next_message(sub)
        assert {(first.payload, first.qos), (second.payload, second.qos)} == {
            (b"while away", 1), (b"qos0 while away", 0)}
    async with client(mqtt_port, identifier=cid, clean_session=True):
        pass


# -- login ---------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, code", [
    ({"level": 5}, 1),
    ({"clean": False, "client_id": ""}, 2),
    ({"username": "guest", "password": "wrong"}, 4),
    ({"username": "nobody-at-all", "password": "x"}, 4),
    ({"username": "no-such-vhost:guest", "password": "guest"}, 5),
])
def test_refused_connects_get_their_connack_code_and_are_closed(mqtt_port, kwargs, code):
    kwargs.setdefault("client_id", unique("r"))
    with RawMQTT(mqtt_port) as raw:
        raw.send(connect_packet(**kwargs))
        assert raw.read() == (2, 0, bytes((0, code)))
        assert raw.closed_by_server()


@pytest.fixture
def vhost_user(api):
    vhost, user = unique("vh"), unique("u")
    assert api.put("/api/vhosts/" + segment(vhost)).status == 201
    assert api.put("/api/users/" + user, {"password": "pw", "tags": ""}).status == 201
    yield vhost, user
    api.delete("/api/vhosts/" + segment(vhost))
    api.delete("/api/users/" + user)


def test_vhost_colon_user_logs_into_that_vhost(mqtt_port, api, vhost_user, broker):
    vhost, user = vhost_user
    with RawMQTT(mqtt_port) as raw:  # no permissions on the vhost yet
        raw.send(connect_packet(unique("v"), username="%s:%s" % (vhost, user), password="pw"))
        assert raw.read() == (2, 0, b"\x00\x05")
    assert api.put("/api/permissions/%s/%s" % (segment(vhost), user),
                   {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    topic = unique("vt")
    with RawMQTT(mqtt_port) as raw, connect(broker.port, virtual_host=vhost,
                                            credentials=pika.PlainCredentials(user, "pw")) as conn:
        assert raw.connect(unique("v"), username="%s:%s" % (vhost, user), password="pw") == b"\x00\x00"
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", topic)
        raw.send(publish_packet(topic, b"in the vhost", qos=1, pid=2))
        assert raw.read() == (4, 0, b"\x00\x02")
        assert _get(channel, queue)[2] == b"in the vhost"


def test_a_malformed_packet_closes_only_that_client(mqtt_port):
    with RawMQTT(mqtt_port) as other, RawMQTT(mqtt_port) as bad:
        other.connect(unique("ok"))
        bad.connect(unique("bad"))
        bad.send(b"\x36\x03\x00\x01a")  # PUBLISH with QoS 3
        assert bad.closed_by_server()
        other.send(PINGREQ)
        assert other.read() == (13, 0, b"")


def test_a_packet_before_connect_closes_the_connection(mqtt_port):
    with RawMQTT(mqtt_port) as raw:
        raw.send(PINGREQ)
        assert raw.closed_by_server()


def test_a_burst_bigger_than_one_turns_input_budget_arrives_whole_and_in_order(mqtt_port, broker):
    topic = unique("burst")
    payloads = [b"%04d" % n + b"x" * 2000 for n in range(300)]  # about 600 KiB in one write
    with connect(broker.port) as conn, RawMQTT(mqtt_port) as raw:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, "amq.topic", topic)
        raw.connect(unique("burst"))
        raw.send(b"".join(publish_packet(topic, p, qos=1, pid=n + 1) for n, p in enumerate(payloads)))
        assert [raw.read()[2] for _ in payloads] == [struct.pack(">H", n + 1) for n in range(len(payloads))]
        got = [_get(channel, queue)[2] for _ in payloads]
        assert got == payloads
