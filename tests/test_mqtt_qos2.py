"""QoS 2 exactly-once (beyond RabbitMQ): PUBLISH/PUBREC/PUBREL/PUBCOMP both
ways, resends deduplicated by packet id, state kept by persistent sessions
across reconnects and restarts."""
from __future__ import annotations

import struct

import pika
import pytest

from amqp_server.mqtt.sessions import queue_name
from helpers import confirm_channel, connect, unique, wait_for
from mqtt_raw import DISCONNECT, PINGREQ, RawMQTT, packet, parse_publish, publish_packet, subscribe_packet
from test_mqtt_pubsub import client, next_message


def pubrel(pid: int) -> bytes:
    return packet(0x62, struct.pack(">H", pid))


def pubrec(pid: int) -> bytes:
    return packet(0x50, struct.pack(">H", pid))


def pubcomp(pid: int) -> bytes:
    return packet(0x70, struct.pack(">H", pid))


def ack(kind: int, pid: int) -> tuple:
    return kind, 2 if kind == 6 else 0, struct.pack(">H", pid)


@pytest.fixture
def mqtt_port(broker) -> int:
    return broker.ports["MQTT"]


async def test_qos2_between_mqtt_clients(mqtt_port):
    topic = unique("q2")
    async with client(mqtt_port) as sub, client(mqtt_port) as pub:
        await sub.subscribe(topic, qos=2)
        await pub.publish(topic, b"once", qos=2)
        m = await next_message(sub)
        assert (m.payload, m.qos) == (b"once", 2)


def queue_bound_to(channel, key: str) -> str:
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", key)
    return queue


def test_a_resent_qos2_publish_is_routed_once(mqtt_port, broker):
    topic = unique("dedup")
    with connect(broker.port) as conn, RawMQTT(mqtt_port) as raw:
        channel = conn.channel()
        queue = queue_bound_to(channel, topic)
        raw.connect(unique("p"))
        raw.send(publish_packet(topic, b"m", qos=2, pid=7))
        assert raw.read() == ack(5, 7)
        raw.send(publish_packet(topic, b"m", qos=2, pid=7))  # PUBREC lost, say: the client resends
        assert raw.read() == ack(5, 7)
        raw.send(pubrel(7))
        assert raw.read() == ack(7, 7)
        raw.send(publish_packet(topic, b"again", qos=2, pid=7))  # the id is free again: a new message
        assert raw.read() == ack(5, 7)
        raw.send(pubrel(7))
        assert raw.read() == ack(7, 7)
        assert wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == 2)
        assert [channel.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [b"m", b"again"]


def qos2_publish(raw: RawMQTT) -> tuple:
    kind, flags, body = raw.read()
    assert kind == 3
    return parse_publish(flags, body)


def test_outbound_qos2_resumes_with_the_same_packet_id(mqtt_port):
    cid, topic = unique("s2"), unique("out")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(cid, clean=False)
        raw.send(subscribe_packet(1, (topic, 2)))
        assert raw.read() == (9, 0, b"\x00\x01\x02")
        raw.send(publish_packet(topic, b"exactly", qos=2, pid=1))
        got = [raw.read(), raw.read()]
        assert ack(5, 1) in got
        publish = next(p for p in got if p[0] == 3)
        _topic, qos, pid, _retain, dup, payload = parse_publish(publish[1], publish[2])
        assert (qos, dup, payload) == (2, False, b"exactly")
        raw.send(pubrel(1))
        assert raw.read() == ack(7, 1)
    with RawMQTT(mqtt_port) as raw:  # no PUBREC was sent: the PUBLISH again, same id, DUP
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        assert qos2_publish(raw)[1:] == (2, pid, False, True, b"exactly")
        raw.send(pubrec(pid))
        assert raw.read() == ack(6, pid)
    with RawMQTT(mqtt_port) as raw:  # no PUBCOMP was sent: the PUBREL again, not the message
        raw.connect(cid, clean=False)
        assert raw.read() == ack(6, pid)
        raw.send(pubcomp(pid))
        raw.send(PINGREQ)
        assert raw.read() == (13, 0, b"")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(cid, clean=False)
        raw.send(PINGREQ)
        assert raw.read() == (13, 0, b"")
        raw.send(DISCONNECT)
    with RawMQTT(mqtt_port) as raw:
        raw.connect(cid, clean=True)


def test_qos2_state_of_a_persistent_session_survives_a_restart(start_broker):
    first = start_broker(expect=("AMQP", "MQTT"))
    cid, topic = unique("r2"), unique("restart")
    with connect(first.port) as conn:
        channel = conn.channel()
        channel.queue_declare(topic, durable=True)
        channel.queue_bind(topic, "amq.topic", topic)
    with RawMQTT(first.ports["MQTT"]) as raw:
        raw.connect(cid, clean=False)
        raw.send(publish_packet(topic, b"before", qos=2, pid=9))
        assert raw.read() == ack(5, 9)
    first.stop()
    second = start_broker("--data-dir", str(first.data_dir), expect=("AMQP", "MQTT"))
    with RawMQTT(second.ports["MQTT"]) as raw:
        raw.connect(cid, clean=False)
        raw.send(publish_packet(topic, b"before", qos=2, pid=9))  # the resend after the restart
        assert raw.read() == ack(5, 9)
        raw.send(pubrel(9))
        assert raw.read() == ack(7, 9)
    with connect(second.port) as conn:
        assert conn.channel().queue_declare(topic, passive=True).method.message_count == 1


def test_a_clean_session_discards_the_qos2_state(mqtt_port, broker):
    cid, topic = unique("c2"), unique("clean")
    with connect(broker.port) as conn, RawMQTT(mqtt_port) as raw:
        channel = conn.channel()
        queue = queue_bound_to(channel, topic)
        raw.connect(cid, clean=False)
        raw.send(publish_packet(topic, b"one", qos=2, pid=3))
        assert raw.read() == ack(5, 3)
        raw.sock.close()
        with RawMQTT(mqtt_port) as again:
            again.connect(cid, clean=True)
            again.send(publish_packet(topic, b"two", qos=2, pid=3))
            assert again.read() == ack(5, 3)
        assert wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == 2)


def killed(proc) -> None:
    proc.process.kill()
    proc.process.wait()


def test_outbound_qos2_is_exactly_once_across_broker_crashes(start_broker):
    """kill -9 after the PUBLISH: it comes back with the packet id the client
    holds (so the client drops the duplicate); kill -9 after PUBREL: the
    PUBREL comes back and the message does not, acked or not on disk."""
    cid, topic = unique("x2"), unique("crash")
    broker = start_broker(expect=("AMQP", "MQTT"))
    data_dir = str(broker.data_dir)
    with RawMQTT(broker.ports["MQTT"]) as raw:
        raw.connect(cid, clean=False)
        raw.send(subscribe_packet(1, (topic, 2)))
        assert raw.read() == (9, 0, b"\x00\x01\x02")
        with connect(broker.port) as conn:
            confirm_channel(conn).basic_publish("amq.topic", topic, b"once", pika.BasicProperties(delivery_mode=2))
        _topic, qos, pid, _retain, dup, payload = qos2_publish(raw)
        assert (qos, dup, payload) == (2, False, b"once")
        killed(broker)
    broker = start_broker("--data-dir", data_dir, expect=("AMQP", "MQTT"))
    with RawMQTT(broker.ports["MQTT"]) as raw:
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        assert qos2_publish(raw)[1:] == (2, pid, False, True, b"once")
        raw.send(pubrec(pid))
        assert raw.read() == ack(6, pid)
        killed(broker)
    broker = start_broker("--data-dir", data_dir, expect=("AMQP", "MQTT"))
    with RawMQTT(broker.ports["MQTT"]) as raw:
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        assert raw.read() == ack(6, pid)
        raw.send(pubcomp(pid))
        raw.send(PINGREQ)
        assert raw.read() == (13, 0, b"")
    with connect(broker.port) as conn:
        assert conn.channel().queue_declare(queue_name(cid, 2), passive=True).method.message_count == 0
