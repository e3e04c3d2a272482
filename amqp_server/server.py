"""Listeners and the process lifetime: start, log the ports, stop on a signal."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import ssl

from amqp_server.config import BrokerConfig
from amqp_server.protocol import AMQPProtocol
from storage.definitions import DefinitionStore
from vhosts import Broker
from vhosts.errors import CONNECTION_FORCED, AMQPError

log = logging.getLogger("hutch.server")


def tls_context(config: BrokerConfig) -> ssl.SSLContext:
    tls = config.tls
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.cacertfile:
        context.load_verify_locations(tls.cacertfile)
    if tls.verify_peer:
        context.verify_mode = ssl.CERT_REQUIRED if tls.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return context


def open_definitions(data_dir: str) -> DefinitionStore:
    """DATA_DIR/definitions.db (docs/storage.md), creating the directories."""
    path = os.path.join(data_dir, "definitions.db")
    try:
        os.makedirs(data_dir, exist_ok=True)
        return DefinitionStore(path)
    except (OSError, sqlite3.Error) as exc:
        raise ListenError("cannot open the definitions store %s: %s" % (path, exc)) from None


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.definitions = open_definitions(config.data_dir)
        try:
            self.broker = Broker(
                config.default_user, config.default_pass, config.default_vhost, config.loopback_users,
                definitions=self.definitions,
            )
        except BaseException:
            self.definitions.close()
            raise
        log.info(
            "definitions from %s: %d vhosts, %d users, %d exchanges, %d queues, %d bindings",
            self.definitions.path, len(self.broker.vhosts), len(self.broker.users),
            sum(sum(not x.builtin for x in v.exchanges.values()) for v in self.broker.vhosts.values()),
            sum(len(v.queues) for v in self.broker.vhosts.values()),
            sum(1 for v in self.broker.vhosts.values() for _ in v.bindings()),
        )
        self.connections: set = set()
        self.servers: list[asyncio.Server] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config

        def factory() -> AMQPProtocol:
            return AMQPProtocol(self.broker, config, self.connections)

        listeners = [("AMQP", config.port, None)]
        if config.tls.enabled:
            try:
                context = tls_context(config)
            except (OSError, ssl.SSLError) as exc:
                raise ListenError("cannot load the TLS certificate or key: %s" % exc) from None
            listeners.append(("AMQPS", config.tls.port, context))
        for name, port, context in listeners:
            try:
                server = await loop.create_server(factory, config.bind, port, ssl=context, reuse_address=True)
            except OSError as exc:
                raise ListenError("cannot listen for %s on %s:%d: %s" % (name, config.bind, port, exc.strerror or exc)) from None
            self.servers.append(server)
            for sock in server.sockets:
                host, bound = sock.getsockname()[:2]
                log.info("listening for %s on %s:%d", name, host, bound)

    async def stop(self) -> None:
        # Definitions are final from here on: what closing the connections
        # auto-deletes stays stored, exactly as after a crash.
        self.broker.detach_definitions()
        for server in self.servers:
            server.close()
        for connection in list(self.connections):
            connection.close_with(AMQPError(CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"))
        for server in self.servers:
            await server.wait_closed()
        self.definitions.close()


async def serve(config: BrokerConfig) -> None:
    server = BrokerServer(config)
    # Handlers first: a signal that arrives once "listening" is logged (the
    # readiness line) must be a clean stop, not the default handler's exit.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except BaseException:
        server.definitions.close()
        raise
    await stop.wait()
    log.info("shutting down")
    await server.stop()


def run(config: BrokerConfig) -> None:
    """Run the broker until SIGINT/SIGTERM.

    On the stdlib event loop: measured with amqpbench (1 producer, 1 consumer,
    16 B, autoack), uvloop 0.23 starved the consumer's socket while a publisher
    kept the loop busy (about 4k msg/s delivered against 93k on the stdlib
    loop), so it is not used until that is understood (docs/benchmarks.md).
    """
    asyncio.run(serve(config))


class ListenError(Exception):
    """The broker cannot start: a listener could not be opened (port in use,
    bad address, TLS files) or the definitions store could not be opened."""
