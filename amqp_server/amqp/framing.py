"""Sans-IO framing: bytes <-> AMQP frames.

Theory: `FrameReader.feed` appends to one buffer; `scan` lists the complete
frames at its front and `consume` drops them once handled. A frame's header is
checked before its payload is waited for, so an oversized frame is refused
from its first 7 bytes. Payloads are handed on as `bytes` (pamqp and the
publish path only ever see complete payloads). Methods are decoded with pamqp
here, so nothing above this module parses bytes except the content header,
which is kept raw (see `storage.message`).

The common publish, a basic.publish method frame followed at once by its
content header and a single body frame on the same channel, is listed as one
item (frame type CONTENT) with its arguments decoded, so the connection hands
the message on in one call instead of three frames' worth of dispatch; anything
else (a malformed or immediate publish too) is listed frame by frame. The
scan is the per-message hot path: `amqp_server.amqp._framing` (C, built when a
compiler is at hand) does it when importable and of this layout (C_VERSION),
`_scan_python` below otherwise, and tests/test_framing.py holds the two to the
same output.
"""
from __future__ import annotations

import struct

from pamqp import commands
from pamqp.frame import marshal as pamqp_marshal

from vhosts.errors import (
    AMQPError,
    COMMAND_INVALID,
    FRAME_ERROR,
)

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
# Not on the wire: a scanned item holding a basic.publish with its content.
CONTENT = 0
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
# type(1) channel(2) size(4) ... payload ... frame-end(1)
FRAME_OVERHEAD = 8

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_FRAME_HEADER = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_LONG = struct.Struct(">I")
_CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")
_BASIC_PUBLISH = b"\x00\x3c\x00\x28"
_BODY_SIZE = struct.Struct(">Q")

HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


class FrameReader:
    """Incremental frame parser for one connection."""

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self._buf = bytearray()
        self.frame_max = frame_max

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def scan(self, budget: int) -> list:
        """The complete frames at the front of the buffer, left there until
        `consume`: (frame_type, channel, payload, header, body, end) each,
        `end` the offset just past it. A publish with its whole content and
        plain arguments is one item (CONTENT, channel, (exchange,
        routing_key, mandatory, method payload), content header payload,
        body, end); every other frame has header and body None. Listing
        stops once `budget` payload bytes are listed (at least one item),
        and before an incomplete or bad frame; a bad frame at the front is
        raised here as AMQPError."""
        items = _scan(self._buf, self.frame_max, budget)
        if not items:
            self._check_front()
        return items

    def consume(self, end: int) -> None:
        if end:
            del self._buf[:end]

    def pending(self, start: int) -> bytes:
        """The buffered bytes from `start` on (a connection moving to another shard)."""
        return bytes(self._buf[start:])

    def _check_front(self) -> None:
        """Raise the AMQPError for the frame at the front if it is bad; an
        unknown frame type, being well delimited, is consumed (what follows,
        Close-Ok, is still read)."""
        buf = self._buf
        if len(buf) < 7:
            return
        frame_type, _channel, size = _FRAME_HEADER.unpack_from(buf)
        if size + FRAME_OVERHEAD > self.frame_max and self.frame_max:
            raise AMQPError(
                FRAME_ERROR,
                "type %d, all octets = <<>>: {frame_too_large,%d,%d}"
                % (frame_type, size, self.frame_max - FRAME_OVERHEAD),
            )
        end = 7 + size
        if end >= len(buf):
            return
        payload = bytes(buf[7:end])
        if buf[end] != FRAME_END:
            raise AMQPError(
                FRAME_ERROR,
                "type %d, %s: {invalid_frame_end_marker,%d}" % (frame_type, payload_snippet(payload), buf[end]),
            )
        if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
            del buf[:end + 1]
            raise AMQPError(FRAME_ERROR, "type %d, %s: unknown_frame" % (frame_type, payload_snippet(payload)))


def _scan_python(buf: bytearray, frame_max: int, budget: int) -> list:
    """`FrameReader.scan` without its error reporting (the C version's twin)."""
    items = []
    pos = 0
    limit = len(buf)
    while budget > 0 and limit - pos >= 7:
        frame_type, channel, size = _FRAME_HEADER.unpack_from(buf, pos)
        end = pos + 7 + size
        if (frame_max and size + FRAME_OVERHEAD > frame_max) or end >= limit or buf[end] != FRAME_END \
                or frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
            break
        payload = bytes(buf[pos + 7:end])
        pos = end + 1
        budget -= size
        if frame_type == FRAME_METHOD and channel and payload[:4] == _BASIC_PUBLISH:
            content = _content_at(buf, pos, limit, channel, frame_max)
            publish = _publish_arguments(payload) if content is not None else None
            if publish is not None:
                header, body, pos = content
                budget -= len(header) + len(body)
                items.append((CONTENT, channel, publish, header, body, pos))
                continue
        items.append((frame_type, channel, payload, None, None, pos))
    return items


def _publish_arguments(payload: bytes):
    """(exchange, routing_key, mandatory, payload) of a basic.publish payload
    (method id included) in the plain case; None when it is not: malformed,
    trailing bytes (RabbitMQ refuses them), a name that is not UTF-8, or
    immediate. The frame-by-frame path reports what is wrong."""
    if len(payload) < 7:
        return None
    pos = 7 + payload[6]
    if pos >= len(payload):
        return None
    end = pos + 1 + payload[pos]
    if end + 1 != len(payload) or payload[end] & 2:
        return None
    try:
        return payload[7:pos].decode("utf-8"), payload[pos + 1:end].decode("utf-8"), bool(payload[end] & 1), payload
    except UnicodeDecodeError:
        return None


def _content_at(buf: bytearray, pos: int, limit: int, channel: int, frame_max: int):
    """(header, body, end) when a basic content header, then (unless the
    body is empty) one body frame holding the whole body, both complete and
    on `channel`, start at `pos`; else None."""
    if limit - pos < 7:
        return None
    frame_type, number, size = _FRAME_HEADER.unpack_from(buf, pos)
    end = pos + 7 + size
    if frame_type != FRAME_HEADER or number != channel or size < 14 or end >= limit or buf[end] != FRAME_END \
            or (frame_max and size + FRAME_OVERHEAD > frame_max) or buf[pos + 7:pos + 9] != b"\x00\x3c":
        return None
    header = bytes(buf[pos + 7:end])
    (body_size,) = _BODY_SIZE.unpack_from(header, 4)
    pos = end + 1
    if body_size == 0:
        return header, b"", pos
    if limit - pos < 7:
        return None
    frame_type, number, size = _FRAME_HEADER.unpack_from(buf, pos)
    end = pos + 7 + size
    if frame_type != FRAME_BODY or number != channel or size != body_size or end >= limit or buf[end] != FRAME_END \
            or (frame_max and size + FRAME_OVERHEAD > frame_max):
        return None
    return header, bytes(buf[pos + 7:end]), end + 1


# The layout of the C twins' arguments and items (_framing.c's VERSION). A
# build of another layout (left from an older checkout) is not used.
C_VERSION = 3
try:
    from amqp_server.amqp import _framing as C_TWINS
except ImportError:  # no C compiler at install time
    C_TWINS = None
if getattr(C_TWINS, "VERSION", None) != C_VERSION:
    C_TWINS = None
_scan = _scan_python if C_TWINS is None else C_TWINS.scan
ACCELERATED = C_TWINS is not None


def payload_snippet(payload: bytes) -> str:
    """RabbitMQ's words for a bad frame's payload (rabbit_reader:payload_snippet)."""
    if len(payload) <= 16:
        return "all octets = " + erlang_binary(payload)
    return "first 16 octets = " + erlang_binary(payload[:16])


def erlang_binary(payload: bytes) -> str:
    shown = payload[:32]
    if shown and all(32 <= b < 127 and b not in (34, 92) for b in shown):
        text = '<<"%s">>' % shown.decode("ascii")
    else:
        text = "<<" + ",".join(str(b) for b in shown) + ">>"
    return text if len(payload) <= 32 else text[:-2] + ",...>>"


# pamqp slices strings and tables without checking they were complete, and
# ignores trailing bytes; RabbitMQ refuses both ("cannot decode").
_ARGUMENT_TYPES = {
    index: tuple(cls.amqp_type(name) for name in cls.__slots__) for index, cls in commands.INDEX_MAPPING.items()
}
_FIXED_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


def _arguments_end(types: tuple, payload: bytes) -> int:
    """Where the method arguments end (IndexError/struct.error if cut short)."""
    pos, bits = 4, 0
    for kind in types:
        if kind == "bit":
            if bits % 8 == 0:
                pos += 1
            bits += 1
            continue
        bits = 0
        if kind == "shortstr":
            pos += 1 + payload[pos]
        elif kind in ("longstr", "table"):
            pos += 4 + _LONG.unpack_from(payload, pos)[0]
        else:
            pos += _FIXED_SIZES[kind]
    return pos


def decode_method(payload: bytes):
    """pamqp method object for a method frame payload; malformed arguments are a
    FRAME_ERROR (RabbitMQ: "cannot decode ..."), an unknown method COMMAND_INVALID."""
    if len(payload) < 4:
        raise AMQPError(FRAME_ERROR, "cannot decode %s" % erlang_binary(payload))
    (index,) = _METHOD_ID.unpack_from(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise AMQPError(COMMAND_INVALID, "unknown method class %d method %d" % (index >> 16, index & 0xFFFF))
    method = cls.__new__(cls)
    try:
        if _arguments_end(_ARGUMENT_TYPES[index], payload) != len(payload):
            raise ValueError("truncated or trailing bytes")
        method.unmarshal(payload[4:])
    except Exception:
        raise AMQPError(FRAME_ERROR, "cannot decode %s" % erlang_binary(payload[4:])) from None
    if getattr(method, "delivery_tag", 0) < 0:  # pamqp reads longlong as signed
        method.delivery_tag += 1 << 64
    return method


def content_header_prefix(payload: bytes) -> tuple[int, int]:
    """(class_id, body_size) of a content header payload."""
    if len(payload) < 14:
        raise AMQPError(FRAME_ERROR, "cannot decode %s" % erlang_binary(payload))
    class_id, _weight, body_size = _CONTENT_HEADER_PREFIX.unpack_from(payload)
    return class_id, body_size


def named_method(cls, **fields):
    """A pamqp method carrying exchange or queue names, without pamqp's name
    validation: its pattern is ASCII-only, while RabbitMQ (and so hutch)
    accepts any UTF-8 name of up to 255 bytes, which the codec encodes fine.
    (A subclass whose `validate` accepts everything; pamqp calls it when
    building and when marshalling.)"""
    unchecked = _UNCHECKED.get(cls)
    if unchecked is None:
        unchecked = _UNCHECKED[cls] = type(cls.__name__, (cls,), {"validate": _accept})
    return unchecked(**fields)


_UNCHECKED: dict = {}


def _accept(_method) -> None:
    return None


def method_frame(channel: int, method) -> bytes:
    return pamqp_marshal(method, channel)


def raw_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEADER.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def content_frames(channel: int, header: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Content header (sent back exactly as published) and body frames, the body
    split so no frame exceeds frame_max."""
    out = [_FRAME_HEADER.pack(FRAME_HEADER, channel, len(header)), header, FRAME_END_BYTE]
    chunk = frame_max - FRAME_OVERHEAD
    size = len(body)
    if size <= chunk:
        if size:
            out += (_FRAME_HEADER.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE)
        return out
    view = memoryview(body)
    for start in range(0, size, chunk):
        part = view[start:start + chunk]
        out += (_FRAME_HEADER.pack(FRAME_BODY, channel, len(part)), part, FRAME_END_BYTE)
    return out
