"""A client connection a follower forwarded, as the leader serves it: the
listener's own protocol object (AMQP, MQTT, management HTTP), shown a
transport whose `peername` is the client's address (proved by the
follower's handshake, amqp_server.cluster.handshake) and whose `sockname`
is the listener's, instead of the replication connection's two ends. So
loopback users, connection listings, per-address login throttling and logs
see the client, as RabbitMQ behind a PROXY-protocol proxy does.

Only the replication port, after the cluster handshake, makes these: a
client connecting to a public listener can never claim an address.
"""
from __future__ import annotations

import asyncio


class _Transport:
    """The real transport, but for the two addresses."""

    def __init__(self, transport: asyncio.Transport, peername: tuple, sockname: tuple) -> None:
        self._transport = transport
        self._addresses = {"peername": peername, "sockname": sockname}

    def get_extra_info(self, name: str, default=None):
        if name in self._addresses:
            return self._addresses[name]
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class _Common(asyncio.BaseProtocol):
    def __init__(self, inner: asyncio.BaseProtocol, peername: tuple, sockname: tuple) -> None:
        self.inner = inner
        self.peername = peername
        self.sockname = sockname

    def connection_made(self, transport) -> None:
        self.inner.connection_made(_Transport(transport, self.peername, self.sockname))

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _Forwarded(_Common, asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)


class _BufferedForwarded(_Common, asyncio.BufferedProtocol):
    def get_buffer(self, sizehint: int):
        return self.inner.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.inner.buffer_updated(nbytes)


def forwarded(inner: asyncio.BaseProtocol, peername: tuple, sockname: tuple) -> asyncio.BaseProtocol:
    # asyncio tells the two kinds apart by their methods (MQTTProtocol is
    # buffered without deriving from asyncio.BufferedProtocol)
    kind = _BufferedForwarded if hasattr(inner, "get_buffer") else _Forwarded
    return kind(inner, peername, sockname)
