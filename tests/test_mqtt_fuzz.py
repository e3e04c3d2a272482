"""The MQTT listener against hostile bytes, as tests/test_fuzz_live.py does for
AMQP: a valid MQTT 3.1.1 session (CONNECT, SUBSCRIBE, PUBLISH at QoS 0, 1
and 2 with PUBREL, PINGREQ, UNSUBSCRIBE, DISCONNECT) is mutated (bit flips,
byte overwrites, truncation, splices, duplicated or dropped packets, a
packet's type, flags or remaining length rewritten) and each case is sent to a
real broker in one write, then half-closed. The broker must close every
connection (no hang), log no traceback, serve new MQTT and AMQP clients, and
its file descriptors and memory must settle. A client that has not logged in
cannot make it buffer a large packet."""
from __future__ import annotations

import random
import socket
import struct

import pytest

from fuzz_session import broker_resources, run_case
from helpers import assert_serves, wait_for
from mqtt_raw import (DISCONNECT, PINGREQ, RawMQTT, connect_packet, packet, publish_packet, remaining_length,
                      subscribe_packet)

CASES = 600


def valid_packets(rnd: random.Random) -> list[bytes]:
    client = "fuzz-%d" % rnd.randrange(1 << 30)
    return [
        connect_packet(client, username="guest", password="guest", keepalive=30,
                       will=("fuzz/will", "gone", 1, False) if rnd.random() < 0.3 else None),
        subscribe_packet(1, ("fuzz/#", 1), ("fuzz/+/two", 2)),
        publish_packet("fuzz/a", b"zero"),
        publish_packet("fuzz/b", b"one", qos=1, pid=2),
        publish_packet("fuzz/c/two", rnd.randbytes(rnd.choice([0, 5, 300])), qos=2, pid=3),
        packet(0x62, struct.pack(">H", 3)),  # PUBREL
        PINGREQ,
        packet(0xA2, struct.pack(">H", 4) + struct.pack(">H", 6) + b"fuzz/#"),  # UNSUBSCRIBE
        DISCONNECT,
    ]


def _set_remaining_length(chosen: bytes, rnd: random.Random) -> bytes:
    """The packet's first byte, a rewritten remaining length, its old body."""
    at = 1
    while chosen[at] & 0x80:
        at += 1
    size = rnd.choice([0, 1, 2, 127, 128, 16383, 16384, 65535, 65537, 2097151, 268435455])
    prefix = remaining_length(size) if rnd.random() < 0.9 else b"\xff\xff\xff\xff\x7f"  # five bytes: malformed
    return chosen[:1] + prefix + chosen[at + 1:]


def mutate(rnd: random.Random) -> tuple[str, bytes]:
    packets = valid_packets(rnd)
    op = rnd.choice(["bitflip", "bytes", "truncate", "splice", "dup", "drop", "type", "flags", "length"])
    if op in ("dup", "drop", "type", "flags", "length"):
        index = rnd.randrange(len(packets))
        chosen = packets[index]
        if op == "dup":
            packets.insert(index, chosen)
        elif op == "drop":
            del packets[index]
        elif op == "type":
            packets[index] = bytes([(rnd.randrange(16) << 4) | (chosen[0] & 0x0F)]) + chosen[1:]
        elif op == "flags":
            packets[index] = bytes([(chosen[0] & 0xF0) | rnd.randrange(16)]) + chosen[1:]
        else:
            packets[index] = _set_remaining_length(chosen, rnd)
        return op, b"".join(packets)
    data = bytearray(b"".join(packets))
    if op == "bitflip":
        for _ in range(rnd.randint(1, 8)):
            data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
    elif op == "bytes":
        for _ in range(rnd.randint(1, 8)):
            data[rnd.randrange(len(data))] = rnd.choice([0, 1, 0x7F, 0x80, 0xC0, 0xFF, rnd.randrange(256)])
    elif op == "truncate":
        del data[rnd.randrange(len(data)):]
    else:
        other = b"".join(valid_packets(rnd))
        data = data[:rnd.randrange(len(data))] + other[rnd.randrange(len(other)):]
    return op, bytes(data)


@pytest.fixture
def mqtt_broker(start_broker):
    return start_broker(expect=("AMQP", "MQTT"))


def mqtt_serves(port: int) -> None:
    with RawMQTT(port) as raw:
        assert raw.connect("fuzz-check", username="guest", password="guest") == b"\x00\x00"
        raw.send(PINGREQ)
        assert raw.read()[0] == 13  # PINGRESP
        raw.send(DISCONNECT)


def test_the_valid_session_is_served(mqtt_broker):
    answer = run_case(mqtt_broker.ports["MQTT"], b"".join(valid_packets(random.Random(1))))
    kinds = []
    while answer:
        at = 1
        length = 0
        shift = 0
        while True:
            length |= (answer[at] & 0x7F) << shift
            shift += 7
            at += 1
            if not answer[at - 1] & 0x80:
                break
        kinds.append(answer[0] >> 4)
        answer = answer[at + length:]
    assert kinds[:2] == [2, 9]  # CONNACK, SUBACK
    assert {4, 5, 7, 13, 11} <= set(kinds)  # PUBACK, PUBREC, PUBCOMP, PINGRESP, UNSUBACK


def test_mutated_sessions(mqtt_broker):
    port, pid = mqtt_broker.ports["MQTT"], mqtt_broker.process.pid
    rnd = random.Random(28)
    for _ in range(50):  # warm up caches and pools before the baseline
        run_case(port, mutate(rnd)[1])
    fds_before, rss_before = broker_resources(pid)
    for case in range(CASES):
        op, data = mutate(rnd)
        try:
            run_case(port, data)
        except AssertionError as exc:
            raise AssertionError("case %d (%s): %s\n%r" % (case, op, exc, data)) from None
        if case % 100 == 0:
            mqtt_serves(port)
    mqtt_serves(port)
    assert_serves(mqtt_broker.port)
    assert "Traceback" not in mqtt_broker.log
    assert wait_for(lambda: broker_resources(pid)[0] <= fds_before + 2, what="the fds to settle")
    assert broker_resources(pid)[1] < rss_before + 30 * 1024  # KiB: bounded, not growing per case


def test_a_client_that_has_not_logged_in_cannot_make_the_broker_buffer_a_large_packet(mqtt_broker):
    """A CONNECT announcing 100 MB is refused from its header (RabbitMQ 3.12's
    64 KiB limit before login), not read until the connect timeout."""
    port, pid = mqtt_broker.ports["MQTT"], mqtt_broker.process.pid
    _fds, rss_before = broker_resources(pid)
    sockets = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"\x10" + remaining_length(100_000_000) + b"\x00\x04MQTT\x04\x02\x00\x3c" + b"x" * 65536)
        sockets.append(sock)
    for sock in sockets:
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except socket.timeout:
            raise AssertionError("the broker kept reading a 100 MB CONNECT") from None
        sock.close()
    assert broker_resources(pid)[1] < rss_before + 30 * 1024
    # once logged in, the limit is the message size: a 1 MiB publish is delivered
    with RawMQTT(port) as raw:
        assert raw.connect("big", username="guest", password="guest") == b"\x00\x00"
        raw.send(subscribe_packet(1, ("big/t", 0)))
        assert raw.read()[0] == 9
        raw.send(publish_packet("big/t", b"b" * (1 << 20)))
        kind, _flags, body = raw.read()
        assert kind == 3 and len(body) == 2 + 5 + (1 << 20)
    assert "Traceback" not in mqtt_broker.log
