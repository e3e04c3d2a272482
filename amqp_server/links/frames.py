"""Reading frames from a peer broker, for the links' connections
(amqp_server.links.connection), with a size limit: a peer is not trusted.

- `FRAME_MAX`: the largest frame a link accepts, header and end octet
  included. The link offers it in its Connection.Tune-Ok (a server that
  proposes more, or no limit, gets this), and refuses a larger frame from
  its 7-byte header, before buffering the payload: the connection fails
  with the reason (`InvalidFrameError`), and the link reconnects later.
- `LimitedStreamReader`: the socket's StreamReader. During the handshake,
  aiormq's own frame reader reads Connection.Start and Tune with
  `readexactly(size)`; this reader refuses a size beyond `FRAME_MAX`, so a
  peer announcing a 4 GiB frame there is refused too.
- `ScanningFrameReceiver`: after the handshake, what reads the connection's
  frames: one read of whatever the socket holds, cut into frames by the
  broker's own scanner (`amqp_server.amqp.framing.FrameReader`, the C scan, which
  checks the size from the header and the end octet of every frame),
  instead of aiormq's three `readexactly` and a BytesIO per frame.
- `ReadContentHeader`: a content header as read, whose properties are
  decoded only when asked for: a shovel that changes none sends the header
  on as its bytes.
- basic.deliver, the one method a link reads per message, is decoded
  directly rather than by pamqp's generic method decoder (0.8 against 3.4
  us); every other method by pamqp.
"""
from __future__ import annotations

import asyncio
import struct
from collections import deque

from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from amqp_server.amqp import framing
from vhosts.errors import AMQPError

FRAME_MAX = 131072  # RabbitMQ's default frame_max, and pika's


FRAME_MIN_SIZE = 4096  # AMQP 0-9-1's frame-min-size: no peer may ask for less


def tuned(proposed: int) -> int:
    """The frame_max a link answers a server's proposal with (0: no limit)."""
    if 0 < proposed < FRAME_MIN_SIZE:
        raise InvalidFrameError("the server proposed frame_max %d, below AMQP's frame-min-size %d" % (
            proposed, FRAME_MIN_SIZE))
    return min(proposed, FRAME_MAX) if proposed else FRAME_MAX


class LimitedStreamReader(asyncio.StreamReader):
    """A StreamReader that refuses to wait for more than a frame's worth
    (see the module docstring)."""

    async def readexactly(self, n: int) -> bytes:
        if n > FRAME_MAX:
            raise InvalidFrameError("a frame of %d bytes from the server, larger than frame_max %d" % (
                n + 7, FRAME_MAX))
        return await super().readexactly(n)


class ScanningFrameReceiver:
    """The frames of an open connection, as aiormq's connection reader
    iterates them: (weight, channel, frame)."""

    READ_SIZE = 256 * 1024

    def __init__(self, reader: asyncio.StreamReader, frame_max: int) -> None:
        self.reader = reader
        self._scanner = framing.FrameReader(frame_max)
        self._frames: deque = deque()

    def __aiter__(self) -> "ScanningFrameReceiver":
        return self

    async def __anext__(self):
        return await self.get_frame()

    async def get_frame(self):
        frames = self._frames
        scanner = self._scanner
        while not frames:
            try:
                items = scanner.scan(1 << 62)  # a bad frame at the front raises, however little follows it
                for frame_type, channel, payload, _header, _body, _end in items:
                    frames.append((len(payload) + framing.FRAME_OVERHEAD, channel, _decode(frame_type, payload)))
            except AMQPError as exc:
                raise InvalidFrameError(exc.reply_text) from exc
            except (PAMQPException, ValueError) as exc:
                raise InvalidFrameError(str(exc)) from exc
            if items:
                scanner.consume(items[-1][5])
                break
            try:
                data = await self.reader.read(self.READ_SIZE)
            except OSError as exc:
                raise AMQPConnectionError("Server communication error: %r" % (exc,)) from exc
            if not data:
                raise AMQPConnectionError("Server connection unexpectedly closed")
            scanner.feed(data)
        return frames.popleft()


def _decode(frame_type: int, payload):
    if frame_type == framing.FRAME_BODY:
        return ContentBody(payload)
    if frame_type == framing.FRAME_METHOD:
        if payload.startswith(_BASIC_DELIVER):
            return _basic_deliver(payload)
        return pamqp_frame._unmarshal_method_frame(payload)
    if frame_type == framing.FRAME_HEADER:
        return ReadContentHeader(payload)
    if frame_type == framing.FRAME_HEARTBEAT:
        return Heartbeat()
    raise ValueError("a server sent a frame of type %d" % frame_type)


_BASIC_DELIVER = b"\x00\x3c\x00\x3c"
_DELIVERY_TAG = struct.Struct(">qB")  # signed, as pamqp decodes a long-long


def _basic_deliver(payload: bytes) -> spec.Basic.Deliver:
    try:
        end = 5 + payload[4]
        consumer_tag = payload[5:end].decode()
        delivery_tag, bits = _DELIVERY_TAG.unpack_from(payload, end)
        start = end + 10
        end = start + payload[start - 1]
        exchange = payload[start:end].decode()
        start = end + 1
        end = start + payload[end]
        routing_key = payload[start:end].decode()
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError("basic.deliver: %s" % exc) from exc
    if end != len(payload):
        raise ValueError("basic.deliver of %d bytes, %d expected" % (len(payload), end))
    return spec.Basic.Deliver(consumer_tag, delivery_tag, bool(bits & 1), exchange, routing_key)


class ReadContentHeader(ContentHeader):
    """A content header as read. `raw` is its payload until `properties`
    is first read, which decodes them (the reader may change them: from
    then on they are marshalled again)."""

    _PREFIX = struct.Struct(">HHQ")

    def __init__(self, payload: bytes) -> None:  # noqa: super().__init__ would build empty properties
        if len(payload) < 14:
            raise ValueError("content header of %d bytes" % len(payload))
        self.class_id, self.weight, self.body_size = self._PREFIX.unpack_from(payload)
        self.raw: bytes | None = payload
        self._properties: spec.Basic.Properties | None = None

    @property
    def properties(self) -> spec.Basic.Properties:
        if self._properties is None:
            self._properties = pamqp_frame._unmarshal_header_frame(self.raw).properties
            self.raw = None
        return self._properties

    @properties.setter
    def properties(self, value: spec.Basic.Properties) -> None:
        self._properties, self.raw = value, None
