"""The MQTT packet codec (amqp_server.mqtt.packets) and topic mapping, sans-IO."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_server.mqtt import packets, topics
from amqp_server.mqtt.packets import MalformedPacket, PacketReader, RefusedConnect
from mqtt_raw import connect_packet, publish_packet, subscribe_packet


def read_all(reader: PacketReader, data: bytes, step: int) -> list:
    out = []
    for i in range(0, len(data), step):
        reader.feed(data[i:i + step])
        out += list(reader.packets())
    return out


@given(st.lists(st.binary(max_size=300), max_size=5), st.integers(1, 50))
def test_packets_come_out_whole_however_the_bytes_are_split(payloads, step):
    stream = b"".join(publish_packet("t/x", p) for p in payloads)
    got = read_all(PacketReader(1 << 20), stream, step)
    assert [packets.decode_publish(flags, body)[5] for _kind, flags, body in got] == payloads


def test_a_partial_packet_stays_buffered():
    reader = PacketReader(1 << 20)
    data = publish_packet("a", b"x" * 200)
    reader.feed(data[:-1])
    assert list(reader.packets()) == []
    reader.feed(data[-1:] + b"\xc0")
    assert [k for k, _f, _b in reader.packets()] == [packets.PUBLISH]
    assert bytes(reader.buffer) == b"\xc0"


def test_a_fifth_length_byte_and_an_oversized_packet_are_malformed():
    reader = PacketReader(1 << 20)
    reader.feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(MalformedPacket):
        list(reader.packets())
    reader = PacketReader(10)
    reader.feed(publish_packet("a", b"x" * 20))
    with pytest.raises(MalformedPacket):
        list(reader.packets())


def body_of(data: bytes) -> bytes:
    reader = PacketReader(1 << 20)
    reader.feed(data)
    return next(reader.packets())[2]


def test_connect_fields():
    c = packets.decode_connect(body_of(connect_packet("dev1", clean=False, keepalive=30, username="vh:u",
                                                      password="pw", will=("w/t", b"gone", 1, True))))
    assert (c.client_id, c.clean, c.keepalive, c.username, c.password) == ("dev1", False, 30, "vh:u", "pw")
    assert (c.will_topic, c.will_payload, c.will_qos, c.will_retain) == ("w/t", b"gone", 1, True)


@pytest.mark.parametrize("kwargs, code", [
    ({"level": 5}, packets.UNACCEPTABLE_PROTOCOL_VERSION),
    ({"name": "MQIsdp", "level": 4}, packets.UNACCEPTABLE_PROTOCOL_VERSION),
    ({"client_id": "", "clean": False}, packets.IDENTIFIER_REJECTED),
    ({"client_id": "x" * 24, "name": "MQIsdp", "level": 3}, packets.IDENTIFIER_REJECTED),
])
def test_connects_refused_with_a_return_code(kwargs, code):
    kwargs.setdefault("client_id", "c")
    with pytest.raises(RefusedConnect) as refused:
        packets.decode_connect(body_of(connect_packet(**kwargs)))
    assert refused.value.code == code


def test_mqtt_3_1_connect_is_accepted():
    assert packets.decode_connect(body_of(connect_packet("c", name="MQIsdp", level=3))).level == 3


@pytest.mark.parametrize("data", [
    publish_packet("a/+", b"x"),
    publish_packet("", b"x"),
    b"\x36\x03\x00\x01a",  # QoS 3
    b"\x32\x03\x00\x01a",  # QoS 1 without a packet id
])
def test_malformed_publishes(data):
    reader = PacketReader(1 << 20)
    reader.feed(data)
    _kind, flags, body = next(reader.packets())
    with pytest.raises(MalformedPacket):
        packets.decode_publish(flags, body)


def test_subscribe_marks_invalid_filters_as_failures():
    reader = PacketReader(1 << 20)
    reader.feed(subscribe_packet(7, ("a/#", 1), ("a/#/b", 0), ("a+", 0)))
    _kind, flags, body = next(reader.packets())
    assert packets.decode_subscribe(flags, body) == (7, [("a/#", 1), ("a/#/b", 0x80), ("a+", 0x80)])


def test_encoded_publish_round_trips():
    data = b"".join(packets.publish(b"a/b", b"payload", 1, 513, True, True))
    reader = PacketReader(1 << 20)
    reader.feed(data)
    _kind, flags, body = next(reader.packets())
    assert packets.decode_publish(flags, body) == ("a/b", 1, 513, True, True, b"payload")


def test_topic_mapping_is_rabbitmqs():
    assert topics.to_amqp("a/+/c/#") == "a.*.c.#"
    assert topics.to_mqtt("sensors.kitchen.temp") == "sensors/kitchen/temp"


@pytest.mark.parametrize("topic_filter, topic, expected", [
    ("a/+/c", "a/b/c", True), ("a/+", "a/b/c", False), ("a/#", "a", True), ("#", "a/b", True),
    ("+/+", "/x", True), ("#", "$SYS/x", False), ("a/b", "a/b", True), ("a/b", "a/c", False),
])
def test_retained_matching(topic_filter, topic, expected):
    assert topics.matches(topic_filter, topic) is expected
