"""The leader's replication port: every connection is admitted by the
cluster handshake (amqp_server.cluster.handshake) before it becomes what
its HELLO asked for: a follower's replication stream (a FollowerLink of the
Replicator, in TLS when `cluster.tls_*` is set), a client connection a
follower forwards (served by the named listener's own protocol under the
client's address, amqp_server.cluster.forwarded), or another shard
leader's link to this one (amqp_server.shards.link, in TLS too).

Hostile input costs little: at most MAX_HANDSHAKES connections may be in
their handshake at once, and PER_ADDRESS from one address (more are closed
at once: a flood from one address does not lock out the members at the
others), each must finish it within HANDSHAKE_SECONDS, and no handshake
frame exceeds HANDSHAKE_MAX bytes; a peer that fails is told why (REFUSED)
when it got that far, and closed.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
from typing import Awaitable, Callable

from amqp_server.cluster import handshake
from amqp_server.cluster.forwarded import forwarded

log = logging.getLogger("hutch.cluster")

MAX_HANDSHAKES = 1024
PER_ADDRESS = 64  # a follower's forwarded clients reconnecting at once come from one address


class Gateway:
    def __init__(self, secret: bytes, term: int, is_member: Callable[[str], Awaitable[bool]], replicator,
                 acceptor: Callable[[str], tuple | None], tls: ssl.SSLContext | None,
                 link: Callable[[], asyncio.Protocol] | None = None) -> None:
        self.secret = secret
        self.term = term
        self.is_member = is_member
        self.replicator = replicator
        self.acceptor = acceptor  # protocol -> (protocol factory, its TLS context, its address) or None
        self.tls = tls
        self.link = link  # a shard link's protocol; None: this leader is no shard of a node of several
        self.sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._handshakes: set[asyncio.Task] = set()
        self._from: collections.Counter = collections.Counter()  # handshakes under way per address

    async def start(self, bind: str, port: int) -> None:
        self.sock = socket.create_server((bind, port), backlog=128)
        self.sock.setblocking(False)
        host, bound = self.sock.getsockname()[:2]
        log.info("listening for replication on %s:%d", host, bound)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        if self.sock is not None:
            self.sock.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self.sock)
            except OSError as exc:  # out of file descriptors, say: keep serving the others
                log.warning("replication port: cannot accept: %s", exc)
                await asyncio.sleep(0.1)
                continue
            host = address[0] if isinstance(address, tuple) else str(address)
            if len(self._handshakes) >= MAX_HANDSHAKES or self._from[host] >= PER_ADDRESS:
                log.warning("replication port: %d handshakes under way (%d from %s); closing %s at once",
                            len(self._handshakes), self._from[host], host, _address(address))
                sock.close()
                continue
            sock.setblocking(False)
            task = loop.create_task(self._admit(sock, address))
            self._handshakes.add(task)
            self._from[host] += 1
            task.add_done_callback(lambda done, host=host: self._done(done, host))

    def _done(self, task: asyncio.Task, host: str) -> None:
        self._handshakes.discard(task)
        self._from[host] -= 1
        if not self._from[host]:
            del self._from[host]

    async def _admit(self, sock: socket.socket, address) -> None:
        loop = asyncio.get_running_loop()
        try:
            hello = await asyncio.wait_for(handshake.admit(loop, sock, self.secret, self.term, self.is_member),
                                           handshake.HANDSHAKE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("replication port: %s did not complete the handshake within %.0f s; closing",
                        _address(address), handshake.HANDSHAKE_SECONDS)
            sock.close()
            return
        except OSError as exc:
            log.warning("replication port: %s refused: %s", _address(address), exc)
            sock.close()
            return
        except BaseException:
            sock.close()
            raise
        try:
            if hello["purpose"] in ("replicate", "link"):
                factory = (lambda: self.replicator.link(hello["name"])) if hello["purpose"] == "replicate" \
                    else self.link
                if factory is None:
                    log.warning("replication port: %s asked for a shard link, and this node has one shard; closing",
                                hello["name"])
                    sock.close()
                    return
                await loop.connect_accepted_socket(factory, sock, ssl=self.tls,
                                                   ssl_handshake_timeout=handshake.HANDSHAKE_SECONDS if self.tls
                                                   else None)
            else:
                await self._forward(sock, hello)
        except (OSError, ssl.SSLError) as exc:
            log.warning("replication port: %s (%s): %s; closing", _address(address), hello["name"], exc)
            sock.close()

    async def _forward(self, sock: socket.socket, hello: dict) -> None:
        acceptor = self.acceptor(hello["protocol"])
        if acceptor is None:
            log.info("follower %s forwarded a %s connection: no such listener here; closing", hello["name"],
                     hello["protocol"])
            sock.close()
            return
        factory, context, sockname = acceptor
        client = tuple(hello["client"])
        await asyncio.get_running_loop().connect_accepted_socket(lambda: forwarded(factory(), client, sockname), sock,
                                                                 ssl=context)


def _address(address) -> str:
    return "%s:%d" % tuple(address[:2]) if isinstance(address, tuple) else str(address)
