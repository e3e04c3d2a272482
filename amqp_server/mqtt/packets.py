"""MQTT 3.1 / 3.1.1 control packets, sans-IO: bytes -> packets -> bytes.

Theory of operation:
- A packet is a fixed header (type in the high nibble, flags in the low one),
  a "remaining length" of 1 to 4 bytes (7 bits each, high bit = more), then
  that many bytes. `PacketReader.feed` appends bytes and `packets` yields
  (type, flags, body) for every complete packet, leaving a partial one
  buffered; a fifth length byte or a packet over `max_size` is malformed.
- Decoders check what the spec makes a protocol violation and raise
  `MalformedPacket` (the session closes the network connection);
  `RefusedConnect` carries the CONNACK return code a CONNECT earns instead.
"""
from __future__ import annotations

import struct

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14

# CONNACK return codes
ACCEPTED = 0
UNACCEPTABLE_PROTOCOL_VERSION = 1
IDENTIFIER_REJECTED = 2
SERVER_UNAVAILABLE = 3
BAD_USERNAME_OR_PASSWORD = 4
NOT_AUTHORIZED = 5

SUBSCRIBE_FAILURE = 0x80
MAX_REMAINING_LENGTH = 268435455

_U16 = struct.Struct(">H")
# protocol name -> protocol level
PROTOCOLS = {"MQTT": 4, "MQIsdp": 3}


class MalformedPacket(Exception):
    """A protocol violation: the server closes the network connection."""


class RefusedConnect(Exception):
    """A CONNECT answered by a CONNACK with this non-zero return code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class PacketReader:
    __slots__ = ("buffer", "max_size")

    def __init__(self, max_size: int) -> None:
        self.buffer = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def packets(self):
        buffer = self.buffer
        pos = 0
        end = len(buffer)
        try:
            while end - pos >= 2:
                length = 0
                shift = 0
                at = pos + 1
                while True:
                    if at >= end:
                        return
                    byte = buffer[at]
                    at += 1
                    length |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 21:
                        raise MalformedPacket("remaining length longer than 4 bytes")
                if length > self.max_size:
                    raise MalformedPacket("packet of %d bytes over the limit of %d" % (length, self.max_size))
                if end - at < length:
                    return
                first = buffer[pos]
                body = bytes(buffer[at:at + length])
                pos = at + length
                yield first >> 4, first & 0x0F, body
        finally:
            del buffer[:pos]


# -- decoding ------------------------------------------------------------------


def _string(body: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _binary(body, pos)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not UTF-8") from None
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000")
    return text, pos


def _binary(body: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 2 > len(body):
        raise MalformedPacket("truncated string")
    (length,) = _U16.unpack_from(body, pos)
    pos += 2
    if pos + length > len(body):
        raise MalformedPacket("truncated string")
    return body[pos:pos + length], pos + length


def packet_id(body: bytes) -> int:
    if len(body) != 2:
        raise MalformedPacket("expected a packet identifier")
    return _U16.unpack(body)[0]


class Connect:
    __slots__ = ("level", "client_id", "clean", "keepalive", "username", "password",
                 "will_topic", "will_payload", "will_qos", "will_retain")


def decode_connect(body: bytes) -> Connect:
    name, pos = _string(body, 0)
    if name not in PROTOCOLS:
        raise MalformedPacket("unknown protocol name %r" % name)
    if pos + 4 > len(body):
        raise MalformedPacket("truncated CONNECT")
    level, flags = body[pos], body[pos + 1]
    (keepalive,) = _U16.unpack_from(body, pos + 2)
    pos += 4
    if level != PROTOCOLS[name]:
        raise RefusedConnect(UNACCEPTABLE_PROTOCOL_VERSION, "protocol %s level %d" % (name, level))
    if flags & 0x01:
        raise MalformedPacket("reserved CONNECT flag set")
    c = Connect()
    c.level = level
    c.clean = bool(flags & 0x02)
    c.keepalive = keepalive
    c.client_id, pos = _string(body, pos)
    will = flags & 0x04
    c.will_qos = (flags >> 3) & 0x03
    c.will_retain = bool(flags & 0x20)
    if not will and (c.will_qos or c.will_retain):
        raise MalformedPacket("will QoS or retain without a will")
    if c.will_qos == 3:
        raise MalformedPacket("will QoS 3")
    c.will_topic = c.will_payload = c.username = c.password = None
    if will:
        c.will_topic, pos = _string(body, pos)
        c.will_payload, pos = _binary(body, pos)
    if flags & 0x80:
        c.username, pos = _string(body, pos)
    if flags & 0x40:
        if c.username is None and level == 4:
            raise MalformedPacket("password without a username")
        password, pos = _binary(body, pos)
        c.password = password.decode("utf-8", "replace")
    if pos != len(body):
        raise MalformedPacket("trailing bytes in CONNECT")
    if not c.client_id and (level == 3 or not c.clean):
        raise RefusedConnect(IDENTIFIER_REJECTED, "empty client id without a clean session")
    if level == 3 and len(c.client_id) > 23:
        raise RefusedConnect(IDENTIFIER_REJECTED, "MQTT 3.1 client id longer than 23 characters")
    return c


def decode_publish(flags: int, body: bytes) -> tuple[str, int, int, bool, bool, bytes]:
    """(topic, qos, packet id or 0, retain, dup, payload)."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    topic, pos = _string(body, 0)
    if not topic or "+" in topic or "#" in topic:
        raise MalformedPacket("invalid topic name %r" % topic)
    pid = 0
    if qos:
        if pos + 2 > len(body):
            raise MalformedPacket("PUBLISH without a packet identifier")
        (pid,) = _U16.unpack_from(body, pos)
        pos += 2
        if not pid:
            raise MalformedPacket("packet identifier 0")
    return topic, qos, pid, bool(flags & 0x01), bool(flags & 0x08), body[pos:]


def _valid_filter(topic_filter: str) -> bool:
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def _leading_packet_id(what: str, flags: int, body: bytes) -> int:
    """The packet id that opens a (UN)SUBSCRIBE, whose fixed-header flags must be 0010."""
    if flags != 0x02:
        raise MalformedPacket("%s flags %d" % (what, flags))
    if len(body) < 2:
        raise MalformedPacket("%s without a packet identifier" % what)
    return _U16.unpack_from(body, 0)[0]


def decode_subscribe(flags: int, body: bytes) -> tuple[int, list[tuple[str, int]]]:
    """(packet id, [(topic filter, requested qos)]); an invalid filter gets qos 0x80."""
    pid = _leading_packet_id("SUBSCRIBE", flags, body)
    pos = 2
    requests = []
    while pos < len(body):
        topic_filter, pos = _string(body, pos)
        if pos >= len(body):
            raise MalformedPacket("SUBSCRIBE without a requested QoS")
        qos = body[pos]
        pos += 1
        if qos & 0xFC:
            raise MalformedPacket("requested QoS byte %d" % qos)
        requests.append((topic_filter, qos if _valid_filter(topic_filter) else SUBSCRIBE_FAILURE))
    if not requests:
        raise MalformedPacket("SUBSCRIBE without topic filters")
    return pid, requests


def decode_unsubscribe(flags: int, body: bytes) -> tuple[int, list[str]]:
    pid = _leading_packet_id("UNSUBSCRIBE", flags, body)
    pos = 2
    filters = []
    while pos < len(body):
        topic_filter, pos = _string(body, pos)
        filters.append(topic_filter)
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without topic filters")
    return pid, filters


# -- encoding ------------------------------------------------------------------


def _fixed_header(first: int, length: int) -> bytes:
    out = bytearray((first,))
    while True:
        byte = length & 0x7F
        length >>= 7
        if length:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def connack(session_present: bool, code: int) -> bytes:
    return bytes((CONNACK << 4, 2, 1 if session_present else 0, code))


def acknowledgement(kind: int, pid: int) -> bytes:
    """PUBACK, PUBREC, PUBREL (flags 0010), PUBCOMP or UNSUBACK."""
    return bytes(((kind << 4) | (2 if kind == PUBREL else 0), 2, pid >> 8, pid & 0xFF))


def suback(pid: int, codes: list[int]) -> bytes:
    return _fixed_header(SUBACK << 4, 2 + len(codes)) + _U16.pack(pid) + bytes(codes)


PINGRESP_PACKET = bytes((PINGRESP << 4, 0))


def publish(topic: bytes, payload: bytes, qos: int, pid: int, retain: bool, dup: bool) -> list[bytes]:
    """A PUBLISH as the pieces to write (the payload is not copied)."""
    first = (PUBLISH << 4) | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    variable = _U16.pack(len(topic)) + topic + (_U16.pack(pid) if qos else b"")
    return [_fixed_header(first, len(variable) + len(payload)) + variable, payload]
