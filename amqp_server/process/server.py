"""A node's broker, composed: the data directory and storage, the domain
(vhosts), every face (AMQP, MQTT, management, links) given what it needs,
the listeners; and the process lifetime (start, stop on a signal)."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sqlite3

from amqp_server.amqp import framing
from amqp_server.amqp.protocol import AMQPProtocol
from amqp_server.links import federation
from amqp_server.links.client import LocalNode
from amqp_server.links.supervisor import Links
from amqp_server.management import ManagementListeners
from amqp_server.management import shards as management_shards
from amqp_server.management.listeners import ListenerError
from amqp_server.mqtt.protocol import MQTTProtocol
from amqp_server.mqtt.retained import RetainedMessages
from amqp_server.mqtt.sessions import Sessions
from amqp_server.process.listeners import open_listeners
from amqp_server.process.shards import Shard
from amqp_server.shards.node import ShardNode
from amqp_server.stream.protocol import StreamNode, StreamProtocol
from amqp_server.shared import allocator
from amqp_server.shared import alarms
from amqp_server.shared.alarms import ResourceAlarms
from amqp_server.shared.config import BrokerConfig
from amqp_server.shared.errors import ListenError
from amqp_server.shared.login_throttle import LoginThrottle
from storage.data_directory import CLEAN_SHUTDOWN, DataDirectory, Unclaimed
from storage.dead_letter_log import DeadLetterLogSettings
from storage.definitions import DefinitionStore
from storage.memory_monitor import MemoryMonitor, budget_bytes
from storage.mqtt_store import MQTTStore
from storage.vhost_storage import StorageSettings, VhostStorage, dir_name
from storage.writer import GroupCommitWriter
from vhosts import Broker
from vhosts.errors import CONNECTION_FORCED, AMQPError
from vhosts.node import NODE

log = logging.getLogger("hutch.server")


def claim_data_directory(path: str) -> DataDirectory:
    """The node's data directory, found or made and locked for the node's
    life (storage.data_directory): before anything else touches it."""
    try:
        return DataDirectory.claim(path)
    except Unclaimed as exc:
        raise ListenError(str(exc)) from None
    except OSError as exc:
        raise ListenError("cannot create the data directory %s: %s" % (path, exc.strerror or exc)) from None


def open_data_directory(path: str) -> DataDirectory:
    try:
        return DataDirectory.open(path)
    except OSError as exc:
        raise ListenError("cannot create the data directory %s: %s" % (path, exc.strerror or exc)) from None


def open_definitions(data_dir: str) -> DefinitionStore:
    """DATA_DIR/definitions.db (docs/storage.md)."""
    path = os.path.join(data_dir, "definitions.db")
    try:
        return DefinitionStore(path)
    except (OSError, sqlite3.Error) as exc:
        raise ListenError("cannot open the definitions store %s: %s" % (path, exc)) from None


class BrokerServer:
    def __init__(self, config: BrokerConfig, shard: Shard | None = None,
                 data_directory: DataDirectory | None = None) -> None:
        """Opens and recovers the data directory (blocking: before serving).
        Must run inside the event loop (the writer hands results back to it).
        If this fails, nothing stays open and a data directory this start
        created is removed (`abandon`). `shard`: this process is one shard
        of its node (amqp_server.process.shards); the management listeners
        and the links run on shard 0 only. `data_directory`: one process's
        node directory as its start claimed it (cli.server)."""
        self.config = config
        self.shard = shard
        found = shard.data_directory if shard is not None else data_directory  # claimed before
        self.data_directory = found if found is not None else open_data_directory(config.data_dir)
        # A failed start removes what it created, but the directory the supervisor claimed is the
        # supervisor's to remove, once every shard ended (the other shards' are inside it).
        self._owns_directory = shard is None or found is None
        self.accepted = False  # a client connection was accepted (`abandon` keeps the directory then)
        self.definitions: DefinitionStore | None = None
        self.writer: GroupCommitWriter | None = None
        self.mqtt_store: MQTTStore | None = None
        try:
            self._open(config)
        except BaseException:
            self.abandon()
            raise

    def _open(self, config: BrokerConfig) -> None:
        self.definitions = open_definitions(config.data_dir)
        marker = os.path.join(config.data_dir, CLEAN_SHUTDOWN)
        clean = os.path.exists(marker)
        if clean:
            os.remove(marker)
            log.info("clean-shutdown marker found in %s: loading the recovery summaries", config.data_dir)
        elif self.data_directory.created is not None:
            log.info("created a new data directory %s", config.data_dir)
        elif self.data_directory.new:
            log.info("data directory %s is empty: starting a new one there", config.data_dir)
        else:
            log.info("no clean-shutdown marker in %s: checking every store and index file", config.data_dir)
        settings = config.storage
        self.writer = GroupCommitWriter(asyncio.get_running_loop(), settings.durability)
        self.monitor = MemoryMonitor(budget_bytes(
            settings.vm_memory_high_watermark, settings.vm_memory_high_watermark_absolute, settings.paging_ratio,
            self.shard.count if self.shard is not None else 1))
        # Writes waiting for the disk are in RAM too: a small budget bounds them as well.
        backlog = max(self.monitor.budget, 1024 * 1024)
        if backlog < self.writer.backlog_high:
            self.writer.backlog_high = backlog
            self.writer.backlog_low = backlog // 4
        dead_letter_log = config.dead_letter_log
        storage_settings = StorageSettings(
            settings.msg_store_file_size, settings.embed_below, settings.segment_entries, unclean_start=not clean,
            dead_letter_log=DeadLetterLogSettings(dead_letter_log.include_bodies, dead_letter_log.retention_bytes,
                                                  dead_letter_log.retention_seconds, dead_letter_log.segment_bytes)
            if dead_letter_log.enabled else None)

        def message_storage(vhost: str) -> VhostStorage:
            directory = os.path.join(config.data_dir, "vhosts", dir_name(vhost))
            return VhostStorage(directory, self.writer, self.monitor, storage_settings)

        # The node's other shards, when it has several (docs/scaling.md).
        self.shards = ShardNode(self.shard, config.shard_timeout) if self.shard is not None else None
        self.broker = Broker(
            config.default_user, config.default_pass, config.default_vhost, config.loopback_users,
            definitions=self.definitions,
            message_storage=message_storage,
            shards=self.shards,
        )
        if self.shards is not None:
            self.shards.broker = self.broker
            self.shards.writer = self.writer
            self.broker.order_definition = self.shards.definitions.order_amqp
            if self.shard.index == 0:  # its replies promise changes every shard has made
                self.broker.durability_barrier = self.shards.definitions.barrier
        log.info(
            "definitions from %s: %d vhosts, %d users, %d exchanges, %d queues, %d bindings",
            self.definitions.path, len(self.broker.vhosts), len(self.broker.users),
            sum(sum(not x.builtin for x in v.exchanges.values()) for v in self.broker.vhosts.values()),
            sum(len(v.queues) for v in self.broker.vhosts.values()),
            sum(1 for v in self.broker.vhosts.values() for _ in v.bindings()),
        )
        log.info("event loop: %s", type(asyncio.get_running_loop()).__module__.split(".")[0])
        if framing.ACCELERATED:
            log.info("per-message paths: C (amqp_server.amqp._framing)")
        else:
            log.warning("per-message paths: pure Python (amqp_server.amqp._framing was not built: no C compiler or "
                        "Python headers at install); about a third slower")
        self.connections: set = set()
        self.alarms = ResourceAlarms(config)
        self.servers: list[asyncio.Server] = []
        # (protocol, address, port) of every open listener, as RabbitMQ lists them
        self.listeners: list[tuple[str, str, int]] = []
        # protocol -> (protocol factory, TLS context, address) of each listener (`acceptor`)
        self.acceptors: dict[str, tuple] = {}
        try:
            self.mqtt_store = MQTTStore(os.path.join(config.data_dir, "mqtt.db"))
        except sqlite3.Error as exc:
            raise ListenError("cannot open the MQTT store: %s" % exc) from None
        self.mqtt_sessions = Sessions(RetainedMessages(self.mqtt_store, self.writer), self.mqtt_store, self.writer)
        self.broker.on_vhost_deleted.append(self.mqtt_sessions.forget_vhost)
        # One table for every front end: AMQP, MQTT and HTTP failures of one
        # user from one address count together.
        self.logins = LoginThrottle(config.auth_failure_delay, config.auth_failure_delay_max)
        if self.shards is not None:  # ... and on every shard of the node
            self.shards.tallies.share_logins(self.logins)
            # the memory alarm weighs the node's memory: every process the supervisor forked
            self.alarms.memory_elsewhere = functools.partial(alarms.node_memory_elsewhere, os.getppid())
        self.stream_node = StreamNode(self.broker, config, self.writer, self.alarms, self.logins, self.connections,
                                      self.listeners)
        self.management = ManagementListeners(self.broker, self.connections, config, self.writer, self.monitor,
                                              self.listeners, self.alarms, self.mqtt_sessions, self.logins)
        if self.shards is not None:  # shard 0's management shows the whole node (docs/management.md)
            management_shards.attach(self.management.node, self.shards)
            # the federation links run on shard 0 and ask a queue's owner whether it wants messages
            self.shards.services[federation.DEMAND] = functools.partial(federation.demand_here, self.broker)
        self.links: Links | None = None  # once the AMQP listener is open (a link may point at this node)
        self._adoptions: set[asyncio.Task] = set()

    def abandon(self, failed: bool = True) -> None:
        """After a start that failed, or was stopped (`failed` False): close
        what is open. A failed start removes the data directory it created
        (storage.data_directory), unless a client was accepted meanwhile
        (what it did may be stored, and may have been confirmed); a stopped
        one keeps it, as any stop does. The shard links close first: a record
        still coming (shard 0's sync answer) must not reach a closed store."""
        if self.shards is not None:
            self.shards.abandon()
        for store in (self.definitions, self.mqtt_store):
            if store is not None:
                store.close()
        if self.writer is not None:
            self.writer.stop()
        if failed and self._owns_directory and not self.accepted:
            self.data_directory.remove_created()

    async def start(self) -> None:
        config = self.config
        logins = self.logins

        def factory() -> AMQPProtocol:
            self._accept()
            return AMQPProtocol(self.broker, config, self.connections, self.alarms, logins, self.writer)

        if self.shards is not None:
            self.shards.adopt = functools.partial(self._adopt, factory)

        def mqtt_factory() -> MQTTProtocol:
            self._accept()
            return MQTTProtocol(self.broker, config, self.mqtt_sessions, self.connections, self.alarms, logins,
                                self.writer)

        self.alarms.start()
        if self.shards is not None:
            await self.shards.start()
        # MQTT and the stream protocol are served by shard 0 only (docs/scaling.md).
        first = self.shard is None or self.shard.index == 0
        self.servers, self.listeners[:], acceptors = await open_listeners(
            config, factory, mqtt_factory if first else None,
            self._stream_factory if first else None)
        self.acceptors.update(acceptors)
        amqp_port = next(port for protocol, _host, port in self.listeners if protocol == "amqp")
        tls_port = next((port for protocol, _host, port in self.listeners if protocol == "amqp/ssl"), None)
        local_host = "127.0.0.1" if config.bind in ("0.0.0.0", "", "::") else config.bind
        if self.shard is not None and self.shard.index != 0:
            self.management.node.sampler.start()  # the rates its reports to shard 0 carry
            return
        self.links = Links(self.broker, LocalNode(
            local_host, amqp_port, config.default_user, config.default_pass, NODE,
            str(self.broker.global_parameters.get("internal_cluster_id", "")), tls_port))
        self.management.node.links = self.links
        await self.links.start()
        try:
            await self.management.start()
        except ListenerError as exc:
            raise ListenError(str(exc)) from None

    def _stream_factory(self) -> StreamProtocol:
        self._accept()
        return StreamProtocol(self.stream_node)

    def _accept(self) -> None:
        """A client connection is being accepted: from now on a failed start
        keeps the data directory (`abandon`; a shard tells its supervisor,
        which removes the node's)."""
        if not self.accepted:
            self.accepted = True
            if self.shard is not None:
                self.shard.accepted()

    def _adopt(self, factory, sock, state: dict, pending: bytes) -> None:
        """A client connection another shard moved here (amqp_server.amqp.hand_over)."""
        def moved_in() -> AMQPProtocol:
            protocol = factory()
            protocol.moved_in = (state, pending)
            return protocol

        async def serve() -> None:
            _transport, protocol = await asyncio.get_running_loop().connect_accepted_socket(moved_in, sock)
            log.info("the connection from %s:%d moved here", *protocol.connection.peer[:2])

        task = asyncio.get_running_loop().create_task(serve())
        self._adoptions.add(task)
        task.add_done_callback(self._adoptions.discard)

    def acceptor(self, protocol: str) -> tuple | None:
        """(protocol factory, TLS context, address) of the `protocol`
        listener: a client connection a cluster follower forwards is served
        by it (amqp_server.cluster.gateway)."""
        return self.acceptors.get(protocol) or self.management.acceptors.get(protocol)

    async def stop(self) -> None:
        # Definitions are final from here on: what closing the connections
        # auto-deletes stays stored, exactly as after a crash.
        self.broker.detach_definitions()
        if self.shards is not None:
            self.shards.say_bye()
        if self.links is not None:
            await self.links.stop()
        await self.management.stop()
        self.alarms.stop()
        for server in self.servers:
            server.close()
        for connection in list(self.connections):
            connection.close_with(AMQPError(CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"))
        for server in self.servers:
            await server.wait_closed()
        if self.shards is not None:
            await self.shards.stop()
        self.stream_node.snapshot_all()
        # Everything queued reaches disk, then the summaries describe it
        # (blocking, but nothing is served any more), then the marker says so.
        await self.writer.drained()
        self.writer.stop()
        if self.writer.in_flight:
            log.warning("storage jobs still in flight at the stop: no recovery summaries, the next start scans")
        else:
            for vhost in self.broker.vhosts.values():
                if vhost.message_storage is not None:
                    vhost.message_storage.write_summaries()
        self.definitions.close()
        self.mqtt_store.close()
        with open(os.path.join(self.config.data_dir, CLEAN_SHUTDOWN), "w") as marker:
            marker.write("hutch stopped cleanly\n")


def serve_shard(config: BrokerConfig, shard: Shard) -> int:
    """One shard of a node, in its own process (amqp_server.process.shards)."""
    run(config, functools.partial(serve, shard=shard))
    return 0


async def serve(config: BrokerConfig, shard: Shard | None = None,
                data_directory: DataDirectory | None = None) -> None:
    server = BrokerServer(config, shard, data_directory)
    # Handlers first: a signal that arrives once "listening" is logged (the
    # readiness line) must be a clean stop, not the default handler's exit.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.ensure_future(server.start())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        # A shard of a node waits for shard 0 at its start: a stop meanwhile ends the start.
        await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            server.abandon(failed=False)
            return
        starting.result()
    except BaseException:
        stopped.cancel()
        server.abandon()
        raise
    allocator.collect_rarely()
    await stopped
    log.info("shutting down")
    await server.stop()


def run(config: BrokerConfig, main=serve) -> None:
    """Run `main(config)` (the broker; a cluster node passes its own) until
    SIGINT/SIGTERM, on uvloop when it is installed
    (or asked for) and the standard library's loop otherwise: about a fifth
    more messages per second on uvloop (docs/benchmarks.md), the same
    behaviour on both (the test suite runs brokers on each)."""
    allocator.reuse_large_blocks()
    event_loop_runner(config)(main(config))


def event_loop_runner(config: BrokerConfig):
    """asyncio.run or uvloop.run, as `event_loop` says (ListenError: uvloop asked for, missing)."""
    if config.event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if config.event_loop == "uvloop":
                raise ListenError("event_loop is uvloop, but uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.run
    return asyncio.run
