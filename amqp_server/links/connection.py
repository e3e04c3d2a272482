"""The links' AMQP connections: aiormq's Connection and Channel, subclassed.

aiormq stays untouched for every other user in the process (a test's
aio-pika client included): nothing here replaces a module attribute; what
differs is in `LinkConnection` and `LinkChannel`, used only by the links.
Written against aiormq 7.2 (pyproject pins >=7.2.4,<7.3), through these
hooks of it:

- the transport factory (`LinkTransportFactory`, aiormq's documented
  extension point) gives the connection a `frames.LimitedStreamReader`,
  so the handshake's frames are limited to `frames.FRAME_MAX`;
- `_rpc`, through which aiormq sends each handshake method and reads the
  answer: the server's Connection.Tune is answered with a frame_max of at
  most `frames.FRAME_MAX` (aiormq echoes the proposal in its Tune-Ok);
- `_Connection__reader`, the connection's reader task (aiormq's private
  `__reader`, overridden by its mangled name: the one private contact):
  once the handshake is over it reads through a
  `frames.ScanningFrameReceiver` with the negotiated limit instead of
  aiormq's FrameReceiver;
- `channel()` makes `LinkChannel`s, whose `_on_deliver_frame` hands each
  delivery to a plain callback as it is read (`consume`), instead of a task
  per delivery (and refuses a message over `MAX_MESSAGE_SIZE`, which
  closes the channel: the link watches its channels), and whose `_on_confirm_frame` goes to the link's
  `client.Publisher` (`on_confirm`) when it keeps the confirms itself.
"""
from __future__ import annotations

import asyncio
import itertools
import logging

import aiormq
from aiormq.abc import DeliveredMessage
from aiormq.connection import TransportFactory
from aiormq.exceptions import AMQPConnectionError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.links import frames

log = logging.getLogger("hutch.links")

MAX_MESSAGE_SIZE = 128 * 1024 * 1024  # RabbitMQ's default max_message_size: a peer's content header is not trusted


class LinkTransportFactory(TransportFactory):
    """A TCP (or TLS, for amqps) connection read through a
    `frames.LimitedStreamReader` (asyncio.open_connection, with that reader)."""

    async def create(self, url, **kwargs):
        provider = kwargs.pop("ssl_context_provider", None)
        ssl = await provider.get_context() if url.scheme == "amqps" and provider is not None else None
        loop = asyncio.get_running_loop()
        reader = frames.LimitedStreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.create_connection(lambda: protocol, url.host, url.port, ssl=ssl, **kwargs)
        except OSError as exc:
            raise AMQPConnectionError(*exc.args) from exc
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class LinkConnection(aiormq.Connection):
    """A link's connection (see the module docstring)."""

    def __init__(self, url: str, name: str) -> None:
        super().__init__(url, transport_factory=LinkTransportFactory(), client_properties={"connection_name": name})
        self.frame_max = frames.FRAME_MAX  # negotiated in the handshake

    async def _rpc(self, request, writer, frame_receiver, wait_response: bool = True):
        frame = await super()._rpc(request, writer, frame_receiver, wait_response)
        if isinstance(frame, spec.Connection.Tune):
            frame.frame_max = self.frame_max = frames.tuned(frame.frame_max)
        return frame

    async def _Connection__reader(self, frame_receiver) -> None:  # noqa: N802 - aiormq's __reader
        await super()._Connection__reader(frames.ScanningFrameReceiver(frame_receiver.reader, self.frame_max))

    async def channel(self, publisher_confirms: bool = False, timeout=None) -> "LinkChannel":
        await self.connected.wait()
        if self.is_closed:
            raise RuntimeError("%r closed" % self)
        number = next(n for n in itertools.count(1) if n not in self.channels)
        channel = self.channels[number] = LinkChannel(
            self, number, publisher_confirms=publisher_confirms, frame_buffer=self.FRAME_BUFFER_SIZE)
        await channel.open(timeout=timeout)
        return channel


async def connect(uri: str, name: str) -> LinkConnection:
    """An open connection, named `name` in the peer's connection list."""
    connection = LinkConnection(uri, name)
    await connection.connect()
    return connection


_tags = itertools.count(1)


class LinkChannel(aiormq.Channel):
    """A link's channel (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inline_consumers: dict = {}  # consumer tag -> callback(DeliveredMessage)
        self.on_confirm = None  # callback(basic.ack or basic.nack), when a Publisher keeps the confirms

    async def consume(self, queue: str, callback, no_ack: bool) -> str:
        """basic.consume with deliveries handed to `callback(message)`, a
        plain function, as they are read; its consumer tag. A callback that
        raises is logged; the channel reads on."""
        for cancelled in [tag for tag in self.inline_consumers if tag not in self.consumers]:
            del self.inline_consumers[cancelled]
        # the tag is chosen here so that the callback is known before the first delivery, which may
        # be read before basic.consume-ok's reply reaches this coroutine
        tag = "ctag-link-%d.%d" % (self.number, next(_tags))
        self.inline_consumers[tag] = callback
        try:
            await self.basic_consume(queue, callback, consumer_tag=tag, no_ack=no_ack)
        except BaseException:
            self.inline_consumers.pop(tag, None)
            raise
        return tag

    async def _on_deliver_frame(self, frame: spec.Basic.Deliver) -> None:
        header = await self._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError("Unexpected frame %r instead of ContentHeader" % (header,))
        if header.body_size > MAX_MESSAGE_SIZE:
            raise ValueError("a message of %d bytes, larger than %d" % (header.body_size, MAX_MESSAGE_SIZE))
        parts = []
        size = 0
        while size < header.body_size:
            content = await self._get_frame()
            if not isinstance(content, ContentBody):
                raise ValueError("Unexpected frame %r" % (content,))
            parts.append(content.value)
            size += len(content.value)
        if frame.consumer_tag not in self.consumers:  # aiormq's own list: basic.cancel removes it
            return  # cancelled: what it still receives goes back to the queue with the channel
        callback = self.inline_consumers.get(frame.consumer_tag)
        if callback is None:
            return
        try:
            callback(DeliveredMessage(delivery=frame, header=header, body=b"".join(parts), channel=self))
        except Exception:  # noqa: BLE001 - as aiormq does for a failed consumer task
            log.exception("Consumer callback failed")

    async def _on_confirm_frame(self, frame) -> None:
        if self.on_confirm is None:
            await super()._on_confirm_frame(frame)
        else:
            self.on_confirm(frame)
