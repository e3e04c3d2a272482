"""The AMQP client side of shovels and federation links, on their own
connections (amqp_server.links.connection: aiormq's, subclassed, with a
frame limit), with what a link needs that aiormq does not give as is.

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
  is marshalled once, and a content header as read
  (`frames.ReadContentHeader`) whose properties nobody looked at is sent on
  as its bytes.
- `Acks`: acknowledgements of one consumer's deliveries, settled in any
  order and sent once per loop turn as one basic.ack with `multiple` up to
  the highest tag below which everything is settled.
- `redacted(uri)`: a URI without its password, for status and logs.
"""
from __future__ import annotations

import asyncio
import struct
from collections import deque
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from aiormq.abc import ChannelFrame
from aiormq.exceptions import DeliveryError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.frame import marshal
from pamqp.header import ContentHeader

from amqp_server.amqp import framing

@dataclass(frozen=True)
class LocalNode:
    """How a link reaches the broker it runs in."""

    host: str
    port: int
    username: str
    password: str
    node: str = "hutch@localhost"  # this node's name (amqp_server.NODE), for status and x-received-from
    cluster_id: str = ""  # the global parameter internal_cluster_id: names what this node leaves upstream
    tls_port: int | None = None  # the AMQPS listener's, when there is one


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


_HEADER_FRAME = struct.Struct(">BHI")


class Publisher:
    """Publishes on one `connection.LinkChannel` (see the module docstring)."""

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
            channel.on_confirm = self._on_confirm_frame
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

    def _on_confirm_frame(self, frame) -> None:
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
