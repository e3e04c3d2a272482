"""A cluster node's life: join, follow or lead, and stop.

Theory of operation:
- At start the node reaches etcd (retrying and saying so while it cannot),
  takes its lease (`LeaseKeeper`) and registers under `nodes/<name>`.
- It may become the leader only when it is *eligible*: etcd's `in_sync`
  list is absent (a new cluster) or names it. Eligible and leaderless, it
  campaigns; the etcd transaction lets exactly one node win.
- A follower keeps its data directory a copy of the leader's
  (replication.Follower), reconnecting whenever the leader changes.
- The leader opens the data directory exactly as a restart after a crash
  does (`BrokerServer`), records itself alone in `in_sync`, starts the
  replication stream (replication.Replicator: the storage writer's gate, so
  no durability reply leaves before the in-sync followers hold it or after
  the lease's local deadline) and serves; followers join `in_sync` once
  they hold everything confirmed.
- A node that loses its lease (leader or not) re-executes itself: every
  socket closes at once, nothing more is promised, and the fresh process
  rejoins as a follower of whoever leads now.
- A clean stop (SIGTERM) revokes the lease, so a successor need not wait
  for it to run out.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

from amqp_server.cluster.etcd import Etcd, EtcdUnavailable
from amqp_server.cluster.lease import LeaseKeeper
from amqp_server.cluster.proxy import Proxy
from amqp_server.cluster.replication import Follower, Replicator
from amqp_server.config import BrokerConfig
from amqp_server.server import CLEAN_SHUTDOWN, BrokerServer, ListenError

log = logging.getLogger("hutch.cluster")

POLL_SECONDS = 0.25  # how often a follower looks at the leader key


class ClusterNode:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        cluster = config.cluster
        self.name = cluster.node_name or socket.gethostname()
        self.advertise = cluster.advertise or socket.gethostname()
        timeout = max(0.5, cluster.lease_ttl / 4)
        self.etcd = Etcd(cluster.etcd, cluster.etcd_prefix, timeout)
        self.keeper = LeaseKeeper(lambda: Etcd(cluster.etcd, cluster.etcd_prefix, timeout), cluster.lease_ttl,
                                  self.fence)
        self.role = "joining"
        self.leader: str | None = None
        self.server: BrokerServer | None = None
        self.replicator: Replicator | None = None
        self.follower = Follower(self.name, config.data_dir, config.storage.durability == "fsync")
        self._following: asyncio.Task | None = None
        self._followed: str | None = None
        self._leader_info: dict = {}  # nodes/<leader> of the leader followed
        self.proxy = Proxy(self._leader_address)

    # -- membership ----------------------------------------------------------

    def describe(self) -> dict:
        """What `nodes/<name>` holds: how the others reach this node."""
        ports = {protocol: port for protocol, _host, port in (self.server.listeners if self.server else ())}
        return {"advertise": self.advertise, "replication_port": self.config.cluster.replication_port,
                "role": self.role, "ports": ports, "pid": os.getpid()}

    async def register(self) -> None:
        await self.etcd.register(self.name, self.describe(), self.keeper.lease_id)

    async def eligible(self) -> bool:
        names = await self.etcd.in_sync()
        return names is None or self.name in names

    # -- the roles -----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        log.info("cluster node %s: reaching etcd at %s", self.name, self.etcd.urls())
        # Only the node that stopped cleanly may trust its marker; a copy is changed under it.
        marker = os.path.join(self.config.data_dir, CLEAN_SHUTDOWN)
        if os.path.exists(marker):
            os.remove(marker)
        os.makedirs(self.config.data_dir, exist_ok=True)
        await self.etcd.connect()
        await self.keeper.start()
        self.role = "follower"
        await self._forward()
        await self._retrying(self.register)
        while not stop.is_set():
            try:
                self.leader = await self.etcd.leader()
                if self.leader is None:
                    await self._unfollow()
                    if await self.eligible() and await self.etcd.campaign(self.name, self.keeper.lease_id):
                        await self._lead()
                        break
                elif self.leader != self.name:
                    await self._follow(self.leader)
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass
        await stop.wait()

    async def _follow(self, leader: str) -> None:
        """Make sure a replication connection to `leader` runs, and know
        where its listeners are (it registers them once they are open)."""
        info = (await self.etcd.nodes()).get(leader)
        if self._followed == leader and self._following is not None and not self._following.done():
            self._leader_info = info or {}
            return
        await self._unfollow()
        if info is None:
            return
        self._followed = leader
        self._leader_info = info
        self._following = asyncio.get_running_loop().create_task(
            self._replicate(leader, info["advertise"], info["replication_port"]))

    async def _replicate(self, leader: str, host: str, port: int) -> None:
        try:
            log.info("following %s at %s:%d", leader, host, port)
            await self.follower.follow(host, port)
            log.info("replication connection to %s ended", leader)
        except (OSError, ValueError) as exc:
            log.warning("replication from %s: %s", leader, exc)
            await asyncio.sleep(POLL_SECONDS)

    async def _forward(self) -> None:
        """Listen where the broker would, forwarding to the leader."""
        config = self.config
        listeners = [("amqp", config.bind, config.port)]
        if config.tls.enabled:
            listeners.append(("amqp/ssl", config.bind, config.tls.port))
        if config.mqtt.enabled:
            listeners.append(("mqtt", config.bind, config.mqtt.port))
            if config.tls.enabled:
                listeners.append(("mqtt/ssl", config.bind, config.mqtt.tls_port))
        if config.management.enabled:
            listeners.append(("http", config.management.bind, config.management.port))
        for protocol, bind, port in listeners:
            try:
                await self.proxy.listen(protocol, bind, port)
            except OSError as exc:
                raise ListenError("cannot listen for %s on %s:%d: %s" % (protocol, bind, port,
                                                                        exc.strerror or exc)) from None

    def _leader_address(self, protocol: str) -> tuple[str, int] | None:
        info = self._leader_info
        port = info.get("ports", {}).get(protocol)
        return (info["advertise"], port) if port else None

    async def _unfollow(self) -> None:
        self.proxy.close_all()  # their leader is gone or changed: the clients reconnect
        self._leader_info = {}
        task, self._following, self._followed = self._following, None, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _lead(self) -> None:
        self.role = "leader"
        self.leader = self.name
        log.info("cluster node %s: elected leader", self.name)
        await self.proxy.stop()
        cluster = self.config.cluster
        self.server = BrokerServer(self.config)
        server = self.server
        self.replicator = Replicator(
            asyncio.get_running_loop(), self.config.data_dir, server.writer, server.definitions, server.mqtt_store,
            self.keeper.valid, cluster.min_in_sync_replicas or 0, cluster.max_lag_bytes, cluster.max_lag_seconds,
            self.record_in_sync)
        await self._retrying(lambda: self.etcd.set_in_sync(self.name, [self.name]))
        await self.replicator.start(self.config.bind, cluster.replication_port)
        await server.start()
        await self._retrying(self.register)

    async def record_in_sync(self, followers: list[str]) -> None:
        """etcd's in-sync set: this leader and `followers` (retried until it is
        written or the lease, and with it this process, ends)."""
        if not await self._retrying(lambda: self.etcd.set_in_sync(self.name, [self.name] + followers)):
            self.fence("another node holds the leader key")

    async def _retrying(self, call) -> object:
        while True:
            try:
                return await call()
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s; retrying", exc)
                await asyncio.sleep(0.5)

    # -- stopping ------------------------------------------------------------

    def fence(self, why: str) -> None:
        """Stop serving at once and rejoin (called from the lease thread)."""
        log.error("cluster node %s: %s; stopping at once and rejoining as a follower", self.name, why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.execv(sys.executable, sys.orig_argv)

    async def stop(self) -> None:
        await self._unfollow()
        await self.proxy.stop()
        if self.replicator is not None:
            self.replicator.stop()
        if self.server is not None:
            await self.server.stop()
        self.keeper.stop(revoke=True)
        await self.etcd.close()


async def serve_node(config: BrokerConfig) -> None:
    """Run a cluster node until SIGINT/SIGTERM."""
    node = ClusterNode(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = loop.create_task(node.run(stop))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait((running, stopping), return_when=asyncio.FIRST_COMPLETED)
    if running.done() and running.exception() is not None:
        stopping.cancel()
        await node.stop()
        raise running.exception()  # a listener that cannot open: reported by cli.server
    log.info("shutting down")
    if not running.done():
        running.cancel()
    try:
        await running
    except asyncio.CancelledError:
        pass
    await node.stop()
