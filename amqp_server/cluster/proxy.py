"""A follower's client listeners: every AMQP, MQTT and management HTTP
connection made to a follower is forwarded, byte for byte, to the same
listener on the current leader (as LavinMQ's followers do), so a client with
a list of node addresses, or one load balancer address, always reaches the
leader. TLS passes through untouched: the leader terminates it.

A forwarded connection goes to the leader's replication port, not to its
public listener: the follower passes the cluster handshake there, naming
the listener and the client's address (amqp_server.cluster.handshake), and
the leader serves it under that address (amqp_server.cluster.forwarded).
So the leader sees the client, not the follower, and only a cluster member
can claim an address.

Each forwarded connection is two transports piped into each other, with
back-pressure both ways (a side whose output buffer is full pauses reading
on the other). When no leader's listener is known yet (an election, or a new
leader that has not registered its listeners in etcd, a lone first node that
founds the cluster only after two lease TTLs), the client waits for one, as
long as founding takes (`leader_wait`); when none is known then, or it cannot
be reached, the client connection is closed; when the leader changes, `close_forwarded` ends
the forwarded connections (their clients reconnect, as after a node failure).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger("hutch.cluster")
LEADER_POLL = 0.05


class _Side(asyncio.Protocol):
    """One end of a pipe; `peer` is the other end's transport."""

    def __init__(self, pipe: "_Pipe", client: bool) -> None:
        self.pipe = pipe
        self.client = client
        self.transport = None
        self.peer: "_Side | None" = None
        self.early: list[bytes] = []  # what a client sent before the leader was reached

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.client:
            transport.pause_reading()  # until the leader is reached

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def eof_received(self):
        if self.peer is not None and self.peer.transport is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
            return True  # half-close: keep reading the other way
        return False

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.pipe.close()


class _Pipe:
    def __init__(self, proxy: "Proxy") -> None:
        self.proxy = proxy
        self.client = _Side(self, True)
        self.upstream = _Side(self, False)
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.pipes.discard(self)
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()


class Proxy:
    """Listeners that forward to `target(protocol)` -> (host, port) of the
    leader's replication port, or None, through `dial(host, port, protocol,
    client address)` -> a socket past the handshake; a client waits up to
    `leader_wait` seconds for a leader to be known."""

    def __init__(self, target: Callable[[str], tuple[str, int] | None],
                 dial: Callable[[str, int, str, list], Awaitable], leader_wait: float) -> None:
        self.target = target
        self.dial = dial
        self.leader_wait = leader_wait
        self.servers: list[asyncio.Server] = []
        self.pipes: set[_Pipe] = set()
        self.listening: dict[str, int] = {}  # protocol -> the port it listens on (what the node registers)

    async def listen(self, protocol: str, bind: str, port: int, reuse_port: bool = False) -> None:
        """`reuse_port`: the node's other shards listen on the same port (amqp_server.process.shards)."""
        loop = asyncio.get_running_loop()

        def accept() -> _Side:
            pipe = _Pipe(self)
            self.pipes.add(pipe)
            loop.create_task(self._connect(pipe, protocol))
            return pipe.client

        server = await loop.create_server(accept, bind, port, reuse_address=True, reuse_port=reuse_port)
        self.servers.append(server)
        for sock in server.sockets:
            host, bound = sock.getsockname()[:2]
            log.info("forwarding %s on %s:%d to the leader", protocol, host, bound)
            self.listening[protocol] = bound

    async def _connect(self, pipe: _Pipe, protocol: str) -> None:
        await asyncio.sleep(0)  # the client side's connection_made has run
        client = pipe.client.transport
        if client is None or pipe.closed:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.leader_wait
        target = self.target(protocol)
        while target is None and not pipe.closed and loop.time() < deadline:
            await asyncio.sleep(LEADER_POLL)
            target = self.target(protocol)
        if target is None or pipe.closed:
            pipe.close()
            return
        peer = client.get_extra_info("peername")
        try:
            sock = await self.dial(target[0], target[1], protocol, [str(peer[0]), int(peer[1])])
        except OSError as exc:
            log.info("cannot forward a %s connection to %s:%d: %s", protocol, target[0], target[1], exc)
            pipe.close()
            return
        try:
            await loop.create_connection(lambda: pipe.upstream, sock=sock)
        except OSError as exc:
            sock.close()
            log.info("cannot forward a %s connection to %s:%d: %s", protocol, target[0], target[1], exc)
            pipe.close()
            return
        if pipe.closed:
            pipe.upstream.transport.close()
            return
        pipe.client.peer, pipe.upstream.peer = pipe.upstream, pipe.client
        if pipe.client.early:
            pipe.upstream.transport.write(b"".join(pipe.client.early))
            pipe.client.early.clear()
        client.resume_reading()

    def close_all(self) -> None:
        for pipe in list(self.pipes):
            pipe.close()

    def close_forwarded(self) -> None:
        """The leader they reached is gone or changed: those connections end (their clients
        reconnect); a client still waiting for a leader goes on waiting."""
        for pipe in list(self.pipes):
            if pipe.client.peer is not None:
                pipe.close()

    async def stop_listening(self) -> None:
        """Accept no more (this node is to serve its ports itself); a client still waiting for
        a leader goes on waiting, and is forwarded to this node once it leads (`target`)."""
        for server in self.servers:
            server.close()
        self.close_forwarded()
        for server in self.servers:
            await server.wait_closed()
        self.servers.clear()
        self.listening.clear()

    async def stop(self) -> None:
        await self.stop_listening()
        self.close_all()
