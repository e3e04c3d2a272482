"""Credit flow: a publisher faster than its queue's consumer is slowed down
instead of piling messages up in the broker, and nothing is lost.

The consumer is a raw socket that stops reading; the publisher is a raw
socket writing without blocking. While the consumer is stalled, the broker
must stop reading from the publisher (its writes stop being accepted) with
a bounded backlog; once the consumer reads again, everything arrives.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import commands

from amqp_raw import RawClient
from helpers import unique

MESSAGES = 60_000
PAYLOAD = b"x" * 200


def declare_and_consume(port: int, queue: str) -> RawClient:
    consumer = RawClient.connected(port, channels=(1,))
    consumer.send_frame(commands.Queue.Declare(queue=queue, auto_delete=True), 1)
    consumer.expect(commands.Queue.DeclareOk, 1)
    consumer.send_frame(commands.Basic.Consume(queue=queue, no_ack=True), 1)
    consumer.expect(commands.Basic.ConsumeOk, 1)
    return consumer


class BodyCounter:
    """Counts content-body bytes on a socket without keeping the stream."""

    def __init__(self, sock: socket.socket, already: bytes) -> None:
        self.sock = sock
        self.buf = bytearray(already)
        self.body_bytes = 0

    def read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return
        assert data, "the broker closed the consumer's connection"
        self.buf += data
        pos = 0
        while len(self.buf) - pos >= 7:
            frame_type, _channel, size = struct.unpack_from(">BHI", self.buf, pos)
            if len(self.buf) - pos < size + 8:
                break
            if frame_type == 3:
                self.body_bytes += size
            pos += size + 8
        del self.buf[:pos]


def test_slow_consumer_throttles_publisher_and_loses_nothing(broker):
    queue = unique("flow")
    consumer = declare_and_consume(broker.port, queue)
    publisher = RawClient.connected(broker.port, channels=(1,))
    stream = publisher.publish_bytes(queue, PAYLOAD) * MESSAGES
    publisher.sock.setblocking(False)
    sent = 0
    stalled_since = None
    # Write until the broker stops accepting bytes for a second: it has
    # paused reading from us because the consumer's socket is full.
    deadline = time.monotonic() + 30
    while sent < len(stream) and time.monotonic() < deadline:
        try:
            sent += publisher.sock.send(stream[sent:sent + 65536])
            stalled_since = None
        except BlockingIOError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1.0:
                break
            time.sleep(0.01)
    assert sent < len(stream), "the broker read every message although the consumer was not reading"

    # The consumer reads again: everything published so far, then the rest
    # of the stream, arrives.
    counter = BodyCounter(consumer.sock, consumer.buf)
    expected = len(PAYLOAD) * MESSAGES
    deadline = time.monotonic() + 60
    while counter.body_bytes < expected and time.monotonic() < deadline:
        if sent < len(stream):
            try:
                sent += publisher.sock.send(stream[sent:sent + 65536])
            except BlockingIOError:
                pass
        counter.read(0.05)
    assert sent == len(stream)
    assert counter.body_bytes == expected
