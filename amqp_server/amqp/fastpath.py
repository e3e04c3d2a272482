"""Hand-written codecs for the per-message methods.

basic.publish and basic.ack arrive once per message and basic.deliver leaves
once per message; pamqp's generic (de)serialisers cost several times more than
these. Each function here must give exactly what pamqp gives (property tests in
tests/test_fastpath.py hold them to it); everything else goes through pamqp.
`deliver`, a whole delivery in one bytes object, is the C twin in
amqp_server.amqp._framing when that is built, `deliver_python` otherwise.
"""
from __future__ import annotations

import struct

from amqp_server.amqp.framing import C_TWINS, FRAME_END_BYTE, FRAME_METHOD, content_frames

PUBLISH = 0x003C0028
ACK = 0x003C0050
DELIVER = 0x003C003C

_ACK = struct.Struct(">QB")
_DELIVER_HEAD = struct.Struct(">BHIIB")  # frame type, channel, size, method id, tag length
_TAG_FLAG = struct.Struct(">QB")
_ACK_FRAME = struct.Struct(">BHIIQBB")


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """(exchange, routing_key, mandatory, immediate) of a basic.publish payload
    (method id included). Raises ValueError/IndexError on malformed input,
    trailing bytes included (RabbitMQ refuses them)."""
    pos = 6  # method id (4) + ticket (2)
    length = payload[pos]
    exchange = payload[pos + 1:pos + 1 + length].decode("utf-8")
    pos += 1 + length
    length = payload[pos]
    routing_key = payload[pos + 1:pos + 1 + length].decode("utf-8")
    bits = payload[pos + 1 + length]
    if len(payload) != pos + 2 + length:
        raise ValueError("trailing bytes after basic.publish")
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """(delivery_tag, multiple) of a basic.ack payload (method id included).
    Raises ValueError unless exactly 13 bytes (struct.error is not a ValueError)."""
    if len(payload) != 13:
        raise ValueError("truncated basic.ack or trailing bytes")
    tag, bits = _ACK.unpack_from(payload, 4)
    return tag, bool(bits & 1)


def deliver_frame(channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool,
                  exchange: bytes, routing_key: bytes) -> bytes:
    """A complete basic.deliver method frame; string arguments already UTF-8."""
    size = 4 + 1 + len(consumer_tag) + 9 + 1 + len(exchange) + 1 + len(routing_key)
    return b"".join((
        _DELIVER_HEAD.pack(FRAME_METHOD, channel, size, DELIVER, len(consumer_tag)),
        consumer_tag,
        _TAG_FLAG.pack(delivery_tag, 1 if redelivered else 0),
        bytes((len(exchange),)),
        exchange,
        bytes((len(routing_key),)),
        routing_key,
        FRAME_END_BYTE,
    ))


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A complete basic.ack method frame (publisher confirms)."""
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, ACK, delivery_tag, 1 if multiple else 0, 0xCE)


def deliver_python(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                   routing_key: str, header: bytes, body: bytes, frame_max: int) -> bytes:
    """A whole delivery: the basic.deliver method frame, the content header
    (as published) and the body frames (none for an empty body, split so no
    frame exceeds frame_max). The names are str: the C twin reads the UTF-8
    that CPython keeps with each str instead of encoding per delivery."""
    frames = content_frames(channel, header, body, frame_max)
    frames.insert(0, deliver_frame(channel, consumer_tag.encode("utf-8"), delivery_tag, redelivered,
                                   exchange.encode("utf-8"), routing_key.encode("utf-8")))
    return b"".join(frames)


# The C twin when built (and of this layout: framing.C_VERSION), else the Python one.
deliver = deliver_python if C_TWINS is None else C_TWINS.deliver
