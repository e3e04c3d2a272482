"""The AMQP client side of shovels and federation links: aiormq, with what
a link needs that aiormq does not give as is.

- `resolve(uri, local)`: RabbitMQ's "amqp://" with no host means this very
  node; here it is this broker's own AMQP listener, logged in as the
  configured default user unless the URI names one (`LocalNode`).
- `Publisher`: basic.publish that sends the properties as given, the
  messages of one event-loop turn written together, and its own
  bookkeeping of confirms: a callback per message, called from the confirm
  frame as it is read (an ack with `multiple` settles a run of them at
  once), or with the error when the channel closes first. aiormq's
  `basic_publish` gives every message without a message_id a random one (it
  uses them to match basic.return), which would change what a shovel moves,
  writes each message on its own, and keeps a future per message resolved
  one loop callback at a time; a link never publishes mandatory, so it
  needs none of that. The basic.publish frame of an (exchange, routing key)
  is marshalled once, and a content header as read (`ReadContentHeader`)
  whose properties nobody looked at is sent on as its bytes.
- `consume(channel, queue, callback, no_ack)`: basic.consume whose
  deliveries go to `callback`, a plain function, as the channel reads
  them, instead of a task per delivery.
  Both replace one of aiormq's per-channel dispatch methods
  (`_on_confirm_frame`, `_on_deliver_frame`) on that channel object only:
  written against aiormq 6.8 to 7.x (pyproject pins it); the link is the
  only user of those channels.
- `ScanningFrameReceiver`: what reads a link connection's frames: a read
  of whatever the socket has, cut into frames by the broker's own scanner
  (`amqp_server.amqp.framing`, the C scan), instead of aiormq's three
  `readexactly` and a BytesIO per frame. Installed as aiormq's
  `FrameReceiver` for the broker process, in which links are aiormq's only
  user. Content headers it reads decode their properties when first asked
  for (`ReadContentHeader`): a shovel that changes none never decodes them.
- `Acks`: acknowledgements of one consumer's deliveries, settled in any
  order and sent once per loop turn as one basic.ack with `multiple` up to
  the highest tag below which everything is settled.
- `redacted(uri)`: a URI without its password, for status and logs.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections import deque
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import aiormq
import aiormq.connection
from aiormq.abc import ChannelFrame, DeliveredMessage
from aiormq.exceptions import AMQPConnectionError, DeliveryError, InvalidFrameError
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.frame import marshal
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from amqp_server.amqp import framing
from vhosts.errors import AMQPError

log = logging.getLogger("hutch.links")


@dataclass(frozen=True)
class LocalNode:
    """How a link reaches the broker it runs in."""

    host: str
    port: int
    username: str
    password: str
    node: str = "hutch@localhost"  # this node's name (amqp_server.NODE), for status and x-received-from
    cluster_id: str = ""  # the global parameter internal_cluster_id: names what this node leaves upstream


def resolve(uri: str, local: LocalNode) -> str:
    """The URI to connect to: a host-less one ("amqp://", "amqp:///vhost")
    is this node."""
    parts = urlsplit(uri)
    if parts.hostname:
        return uri
    user = parts.username if parts.username is not None else local.username
    password = parts.password if parts.password is not None else local.password
    netloc = "%s:%s@%s:%d" % (quote(user, safe=""), quote(password, safe=""), local.host, local.port)
    return urlunsplit(("amqp", netloc, parts.path, parts.query, ""))


def redacted(uri: str) -> str:
    """The URI without its password (RabbitMQ shows no credentials either)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = "%s@%s%s" % (parts.username, host, ":%d" % parts.port if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


class ScanningFrameReceiver(aiormq.connection.FrameReceiver):
    """aiormq's frame source for a connection (see the module docstring).
    The first frame (connection.start, or the protocol header a server
    that refuses the version answers with) is read by aiormq's own code."""

    READ_SIZE = 256 * 1024

    def __init__(self, reader) -> None:
        super().__init__(reader)
        self._scanner = framing.FrameReader(0)  # the size limit is the server's to enforce
        self._frames: deque = deque()

    async def get_frame(self):
        if not self.started:
            return await super().get_frame()
        frames = self._frames
        while not frames:
            try:
                data = await self.reader.read(self.READ_SIZE)
            except OSError as exc:
                raise AMQPConnectionError("Server communication error: %r" % (exc,)) from exc
            if not data:
                raise AMQPConnectionError("Server connection unexpectedly closed")
            scanner = self._scanner
            scanner.feed(data)
            try:
                items = scanner.scan(1 << 62)
                for frame_type, channel, payload, _header, _body, _end in items:
                    frames.append((len(payload) + framing.FRAME_OVERHEAD, channel, _decode(frame_type, payload)))
            except (AMQPError, PAMQPException, ValueError) as exc:
                raise InvalidFrameError(str(exc)) from exc
            if items:
                scanner.consume(items[-1][5])
        return frames.popleft()


def _decode(frame_type: int, payload: bytes):
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
    raise ValueError("frame type %d from a server" % frame_type)


_BASIC_DELIVER = b"\x00\x3c\x00\x3c"
_DELIVERY_TAG = struct.Struct(">qB")  # signed, as pamqp decodes a long-long


def _basic_deliver(payload: bytes) -> spec.Basic.Deliver:
    """basic.deliver, the one method per message a link reads, decoded
    directly (pamqp's generic decode costs four times as much)."""
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


aiormq.connection.FrameReceiver = ScanningFrameReceiver


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


async def connect(uri: str, name: str) -> aiormq.abc.AbstractConnection:
    """A connection, named `name` in the peer's connection list."""
    return await aiormq.connect(uri, client_properties={"connection_name": name})


_HEADER_FRAME = struct.Struct(">BHI")


class Publisher:
    """Publishes on one aiormq channel (see the module docstring)."""

    def __init__(self, channel) -> None:
        self.channel = channel
        self._frame_max = channel.connection.connection_tune.frame_max - 8  # a frame's header and end octet
        self._pending: list[bytes] = []  # marshalled frames not yet handed to the connection
        self._chunks: deque = deque()  # joined turns waiting for room in the connection's write queue
        self._writer: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self._methods: dict = {}  # (exchange, routing key) -> the basic.publish frame
        # confirms: sequence numbers in publishing order, and the callback of each not yet confirmed
        # (a single ack or nack may settle one out of order: it leaves its number in the deque)
        self._sequence: deque = deque()
        self._callbacks: dict = {}
        if channel.publisher_confirms:
            channel._on_confirm_frame = self._on_confirm_frame
            channel.closing.add_done_callback(self._closed)

    def publish(self, body: bytes, exchange: str, routing_key: str, header: ContentHeader,
                on_confirm=None) -> None:
        """Queue one message for this loop turn's write, with the properties
        of `header` (the one it was received with). In confirm mode,
        `on_confirm(error)` is called once: error None when the peer acked
        it, else why it was not (a nack, the channel closed)."""
        channel = self.channel
        number = channel.number
        pending = self._pending
        if not pending:
            self._loop.call_soon(self._flush)
        method = self._methods.get((exchange, routing_key))
        if method is None:
            if len(self._methods) > 1000:  # routing by the message's own key: do not grow without bound
                self._methods.clear()
            method = self._methods[exchange, routing_key] = marshal(
                spec.Basic.Publish(exchange=exchange, routing_key=routing_key), number)
        pending.append(method)
        raw = getattr(header, "raw", None)
        if raw is not None and header.body_size == len(body):
            pending.append(_HEADER_FRAME.pack(framing.FRAME_HEADER, number, len(raw)) + raw + framing.FRAME_END_BYTE)
        else:
            pending.append(marshal(ContentHeader(properties=header.properties, body_size=len(body)), number))
        step = self._frame_max
        for start in range(0, len(body), step):
            pending.append(marshal(ContentBody(body[start:start + step]), number))
        if channel.publisher_confirms:
            channel.delivery_tag += 1
            self._sequence.append(channel.delivery_tag)
            self._callbacks[channel.delivery_tag] = on_confirm

    async def _on_confirm_frame(self, frame) -> None:
        error = None if isinstance(frame, spec.Basic.Ack) else DeliveryError(None, frame)
        callbacks = self._callbacks
        if frame.multiple:
            sequence, last = self._sequence, frame.delivery_tag
            while sequence and sequence[0] <= last:
                callback = callbacks.pop(sequence.popleft(), None)
                if callback is not None:
                    callback(error)
        else:
            callback = callbacks.pop(frame.delivery_tag, None)
            if callback is not None:
                callback(error)

    def _closed(self, closing: asyncio.Future) -> None:
        """Every publish not yet confirmed fails with the channel."""
        error = RuntimeError("the channel closed before it confirmed")
        if not closing.cancelled() and closing.exception() is not None:
            error = closing.exception()
        callbacks, self._callbacks = self._callbacks, {}
        self._sequence.clear()
        for callback in callbacks.values():
            callback(error)

    def _flush(self) -> None:
        chunk = ChannelFrame(payload=b"".join(self._pending), should_close=False)
        self._pending.clear()
        if self._writer is None:
            try:
                self.channel.write_queue.put_nowait(chunk)
                return
            except asyncio.QueueFull:
                pass
        self._chunks.append(chunk)
        if self._writer is None:
            self._writer = self._loop.create_task(self._write())

    async def _write(self) -> None:
        """Wait for room in the write queue, keeping the chunks in order."""
        try:
            while self._chunks:
                await self.channel.write_queue.put(self._chunks[0])
                self._chunks.popleft()
        finally:
            self._writer = None


async def consume(channel, queue: str, callback, no_ack: bool) -> str:
    """basic.consume with deliveries handed to `callback(message)`, a plain
    function, as they are read (see the module docstring); its consumer
    tag. A callback that raises is logged; the channel reads on."""
    callbacks = getattr(channel, "inline_consumers", None)
    if callbacks is None:
        callbacks = channel.inline_consumers = {}
        _deliver_inline(channel, callbacks)
    for cancelled in [tag for tag in callbacks if tag not in channel.consumers]:
        del callbacks[cancelled]
    # the tag is chosen here so that the callback is known before the first delivery, which may
    # be read before basic.consume-ok's reply reaches this coroutine
    tag = "ctag-link-%d.%d" % (channel.number, next(_tags))
    callbacks[tag] = callback
    try:
        await channel.basic_consume(queue, callback, consumer_tag=tag, no_ack=no_ack)
    except BaseException:
        callbacks.pop(tag, None)
        raise
    return tag


_tags = itertools.count(1)


def _deliver_inline(channel, callbacks: dict) -> None:
    get_frame = channel._get_frame

    async def on_deliver_frame(frame: spec.Basic.Deliver) -> None:
        header = await get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError("Unexpected frame %r instead of ContentHeader" % (header,))
        parts = []
        size = 0
        while size < header.body_size:
            content = await get_frame()
            if not isinstance(content, ContentBody):
                raise ValueError("Unexpected frame %r" % (content,))
            parts.append(content.value)
            size += len(content.value)
        if frame.consumer_tag not in channel.consumers:  # aiormq's own list: basic.cancel removes it
            return  # cancelled: what it still receives goes back to the queue with the channel
        try:
            callbacks[frame.consumer_tag](DeliveredMessage(delivery=frame, header=header, body=b"".join(parts),
                                                           channel=channel))
        except Exception:  # noqa: BLE001 - as aiormq does for a failed consumer task
            log.exception("Consumer callback failed")

    channel._on_deliver_frame = on_deliver_frame


class Acks:
    """basic.ack for one consumer's deliveries, coalesced (see the module
    docstring). `delivered(tag)` for every delivery, in order;
    `settle(tag)` once it may be acknowledged."""

    def __init__(self, channel, on_error) -> None:
        self.channel = channel
        self.on_error = on_error  # called with the exception if an ack cannot be sent
        self._outstanding: deque = deque()
        self._settled: set = set()
        self._scheduled = False
        self._last: asyncio.Task | None = None  # the latest basic.ack being written
        self._loop = asyncio.get_running_loop()

    def delivered(self, tag: int) -> None:
        self._outstanding.append(tag)

    def settle(self, tag: int) -> None:
        self._settled.add(tag)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        outstanding, settled = self._outstanding, self._settled
        last = None
        while outstanding and outstanding[0] in settled:
            last = outstanding.popleft()
            settled.discard(last)
        if last is not None:
            self._last = task = self._loop.create_task(self.channel.basic_ack(last, multiple=True))
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.on_error(task.exception())

    async def sent(self) -> None:
        """Wait until every settled delivery's ack has been written."""
        if self._scheduled:
            await asyncio.sleep(0)  # let the scheduled flush run
        if self._last is not None:
            await asyncio.wait([self._last])
