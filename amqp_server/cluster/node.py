"""A cluster node's life: join, follow or lead, and stop.

Theory of operation:
- At start the node reaches etcd (retrying and saying so while it cannot),
  takes its lease (`LeaseKeeper`) and registers under `nodes/<name>`.
- It may become the leader only when it is *eligible*: etcd's `in_sync`
  list is absent (a new cluster) or names it. Eligible and leaderless, it
  campaigns; the etcd transaction lets exactly one node win.
- Election by position: with no leader, every node posts how much of the
  last leader's stream it holds (`positions/<name>`: that leader's term and
  the position it has applied and synced, Follower.synced; null when it
  does not know, as in a restarted process). An eligible node campaigns
  only once every other running node on the `in_sync` list has posted, and
  none holds more: a position of the same term further on, or a known one
  where its own is unknown (ties: the lowest name). A position of another
  term is one not posted yet for this election: it is waited for, as a
  node that posted nothing is (each posts within a poll; one that stalls
  drops out when its lease ends). A node withdraws its position once it
  follows a leader, so a position left from an earlier leaderless time (the
  null every node posts before the first election) is never read as one
  for this election. So the most complete in-sync node leads,
  which `cluster.min_in_sync_replicas` relies on (a confirm waits for N
  in-sync followers, not all; replication.py). A planned hand-over names
  its node (`transfer`), which campaigns alone once it has everything.
- A follower keeps its data directory a copy of the leader's
  (follower.Follower), reconnecting whenever the leader changes.
- The leader opens the data directory exactly as a restart after a crash
  does (`BrokerServer`), records itself alone in `in_sync`, starts the
  replication stream (replication.Replicator: the storage writer's gate, so
  no durability reply leaves before the in-sync followers hold it or after
  the lease's local deadline) and its replication port (gateway.Gateway:
  only running members holding the cluster secret pass), and serves;
  followers join `in_sync` once they hold everything confirmed. Its term
  is the etcd revision that created its `leader` key: it grows with every
  election, and a follower never follows a lower one (follower.Follower).
- A node that loses its lease (leader or not) re-executes itself: every
  socket closes at once, nothing more is promised, and the fresh process
  rejoins as a follower of whoever leads now.
- A clean stop (SIGTERM) revokes the lease, so a successor need not wait
  for it to run out.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import ssl
import sys
import time
from typing import Any, Callable

from aiohttp import web

from amqp_server.cluster import handshake
from amqp_server.cluster.etcd import Etcd, EtcdUnavailable
from amqp_server.cluster.follower import Follower
from amqp_server.cluster.gateway import Gateway
from amqp_server.cluster.lease import LeaseKeeper
from amqp_server.cluster.proxy import Proxy
from amqp_server.cluster.replication import Replicator
from amqp_server.shared.allocator import collect_rarely
from amqp_server.shared.config import BrokerConfig
from amqp_server.shared.errors import ListenError
from storage.data_directory import CLEAN_SHUTDOWN
from amqp_server.shared.figures import member_figures

log = logging.getLogger("hutch.cluster")

POLL_SECONDS = 0.25  # how often a follower looks at the leader key
MEMBERS_SECONDS = 1.0  # how often the leader refreshes what it reports of the others
TRANSFER_SECONDS = 10  # a planned hand-over's etcd key lives this long at most
FIGURES_SECONDS = 5.0  # how often a follower republishes its memory and disk figures


class ClusterError(ValueError):
    """A cluster operation refused; the message is for the operator."""


class ClusterNode:
    def __init__(self, config: BrokerConfig, open_broker: Callable[[BrokerConfig], Any],
                 follower_metrics: Callable[["ClusterNode"], web.Application]) -> None:
        """Built by the composition root (amqp_server.process.cluster), which
        gives it `open_broker` (a leader's broker, opened and not started) and
        `follower_metrics` (the aiohttp app of a follower's own /metrics)."""
        self.config = config
        self.open_broker = open_broker
        self.follower_metrics = follower_metrics
        cluster = config.cluster
        self.name = cluster.node_name or socket.gethostname()
        self.advertise = cluster.advertise or socket.gethostname()
        timeout = max(0.5, cluster.lease_ttl / 4)
        self.etcd = Etcd(cluster.etcd, cluster.etcd_prefix, timeout)
        self.keeper = LeaseKeeper(lambda: Etcd(cluster.etcd, cluster.etcd_prefix, timeout), cluster.lease_ttl,
                                  self.fence)
        self.role = "joining"
        self.leader: str | None = None
        self.server = None  # the leader's broker (amqp_server.process.server.BrokerServer)
        self.replicator: Replicator | None = None
        self.gateway: Gateway | None = None
        self.secret = (cluster.secret or "").encode()
        try:
            self.tls_server, tls_client = handshake.server_context(cluster), handshake.client_context(cluster)
        except (OSError, ssl.SSLError) as exc:
            raise ListenError("cannot load the cluster's TLS certificate, key or CA (cluster.tls_*): %s" % exc) from None
        self.follower = Follower(self.name, config.data_dir, config.storage.durability == "fsync", self.secret,
                                 tls_client, cluster.replication_timeout)
        self._following: asyncio.Task | None = None
        self._followed: str | None = None
        self._leader_info: dict = {}  # nodes/<leader> of the leader followed
        self._posted: dict | None = None  # positions/<name> as last written
        self.proxy = Proxy(self._leader_address, self._dial)
        # The leader's view of the others, refreshed every MEMBERS_SECONDS.
        self.members: dict[str, dict] = {}
        self.running: dict[str, dict] = {}
        self._tasks: list[asyncio.Task] = []
        self._metrics: web.AppRunner | None = None  # a follower's /metrics
        self.started = time.monotonic()
        self._figures_at = 0.0  # time.monotonic() of the last registration with figures

    # -- membership ----------------------------------------------------------

    def describe(self) -> dict:
        """What `nodes/<name>` holds: how the others reach this node."""
        ports = {protocol: port for protocol, _host, port in (self.server.listeners if self.server else ())}
        return {"advertise": self.advertise, "replication_port": self.config.cluster.replication_port,
                "role": self.role, "ports": ports, "pid": os.getpid(),
                # memory, disk, descriptors: the leader's /api/nodes shows them for this member
                "figures": member_figures(self.config, self.uptime_ms())}

    def uptime_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    async def register(self) -> None:
        self._figures_at = time.monotonic()
        await self.etcd.register(self.name, self.describe(), self.keeper.lease_id)

    async def eligible(self, by_position: bool) -> bool:
        """May this node campaign (the theory above); `by_position`: unless
        a planned hand-over names it."""
        names = await self.etcd.in_sync()
        if names is None:
            return True  # a new cluster
        return self.name in names and (not by_position or await self._most_complete(names))

    async def _post_position(self) -> None:
        synced = self.follower.synced
        value = {"term": synced[0], "position": synced[1]} if synced else {"term": None, "position": None}
        if value != self._posted:
            await self.etcd.post_position(self.name, value, self.keeper.lease_id)
            self._posted = value

    async def _withdraw_position(self) -> None:
        if self._posted is not None:
            await self.etcd.withdraw_position(self.name)
            self._posted = None

    async def _most_complete(self, names: list[str]) -> bool:
        """Whether no other running in-sync node holds more of the last
        leader's stream than this one, once each has posted its position."""
        running, posted = await self.etcd.nodes(), await self.etcd.positions()
        term = self._posted["term"]
        mine = (term is not None, self._posted["position"] or 0)
        for name in names:
            if name == self.name or name not in running:
                continue
            theirs = posted.get(name)
            if theirs is None or None not in (term, theirs["term"]) and theirs["term"] != term:
                return False  # not posted for this election yet
            held = (theirs["term"] is not None, theirs["position"] or 0)
            if held > mine or held == mine and name < self.name:
                return False
        return True

    # -- the roles -----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        log.info("cluster node %s: reaching etcd at %s", self.name, self.etcd.urls())
        # Only the node that stopped cleanly may trust its marker; a copy is changed under it.
        # Without it, promotion recovers as after a crash, and so every message it recovers is
        # delivered with redelivered=true: that covers a delivery whose delivered record had not
        # reached this node (deliveries do not wait for the followers; docs/cluster.md).
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
                    await self._unfollow()  # the applier is done: Follower.synced is final
                    await self._post_position()
                    transfer = await self.etcd.transfer_to()
                    if transfer in (None, self.name) and await self.eligible(transfer is None) and \
                            await self.etcd.campaign(self.name, self.keeper.lease_id):
                        if transfer is not None:
                            await self.etcd.clear_transfer()
                        await self._lead()
                        break
                elif self.leader != self.name:
                    await self._withdraw_position()
                    await self._follow(self.leader)
                    if time.monotonic() - self._figures_at >= FIGURES_SECONDS:
                        await self.register()
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
        if config.stream.enabled:  # stream clients are told the leader's address by its metadata
            listeners.append(("stream", config.bind, config.stream.port))
            if config.tls.enabled:
                listeners.append(("stream/ssl", config.bind, config.stream.tls_port))
        if config.management.enabled:
            listeners.append(("http", config.management.bind, config.management.port))
        try:
            for protocol, bind, port in listeners:
                await self.proxy.listen(protocol, bind, port)
            if config.prometheus.enabled:  # a follower's own metrics, not the leader's
                protocol, bind, port = "http/prometheus", config.prometheus.bind, config.prometheus.port
                self._metrics = web.AppRunner(self.follower_metrics(self), access_log=None, handle_signals=False)
                await self._metrics.setup()
                await web.TCPSite(self._metrics, bind, port, reuse_address=True).start()
        except OSError as exc:
            raise ListenError("cannot listen for %s on %s:%d: %s" % (protocol, bind, port,
                                                                    exc.strerror or exc)) from None

    def _leader_address(self, protocol: str) -> tuple[str, int] | None:
        """Where to forward a `protocol` client: the leader's replication
        port, once the leader has registered that listener."""
        info = self._leader_info
        return (info["advertise"], info["replication_port"]) if info.get("ports", {}).get(protocol) else None

    async def _dial(self, host: str, port: int, protocol: str, client: list):
        sock, _term = await handshake.dial(host, port, self.secret, self.name, "forward", protocol, client)
        return sock

    async def _is_member(self, name: str) -> bool:
        """Whether `name` is a running member (its nodes/ key), as the leader
        last saw them or, failing that, as etcd says now."""
        if name in self.running:
            return True
        try:
            self.running = await self.etcd.nodes()
        except EtcdUnavailable as exc:
            log.warning("etcd unreachable: %s; refusing %s meanwhile", exc, name)
            return False
        return name in self.running

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
        await self.follower.idle()

    async def _lead(self) -> None:
        self.role = "leader"
        self.leader = self.name
        log.info("cluster node %s: elected leader", self.name)
        await self.proxy.stop()
        await self._stop_metrics()
        cluster = self.config.cluster
        self.server = self.open_broker(self.config)
        server = self.server
        server.management.node.cluster = self
        server.broker.promising = self.keeper.valid  # also for confirms that wait for no disk
        # writer jobs complete in order, through the replication gate, after the definitions' record
        server.broker.durability_barrier = lambda done: server.writer.run(_nothing, lambda _result: done())
        term = await self._retrying(self.etcd.leader_term)
        if term is None:
            self.fence("the leader key vanished as this node was elected")
        self.replicator = Replicator(
            asyncio.get_running_loop(), self.config.data_dir, server.writer, server.definitions, server.mqtt_store,
            self.keeper.valid, term, cluster.min_in_sync_replicas or 0, cluster.max_lag_bytes,
            cluster.max_lag_seconds, self.record_in_sync, cluster.replication_timeout)
        await self._retrying(lambda: self.etcd.set_in_sync(self.name, [self.name]))
        self.replicator.start()
        self.gateway = Gateway(self.secret, term, self._is_member, self.replicator, server.acceptor, self.tls_server)
        try:
            await self.gateway.start(cluster.replication_bind or self.advertise, cluster.replication_port)
        except OSError as exc:
            raise ListenError("cannot listen for replication on %s:%d: %s" % (
                cluster.replication_bind or self.advertise, cluster.replication_port, exc.strerror or exc)) from None
        self._warn_if_unreachable(self.gateway.sock.getsockname()[0])
        await server.start()
        collect_rarely()
        await self._retrying(self.register)
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_members()))

    def _warn_if_unreachable(self, bound: str) -> None:
        """The replication listener binds the advertised address; a host name
        that resolves to loopback here (Debian's /etc/hosts maps its own to
        127.0.1.1) would hide it from the other machines."""
        remote_etcd = any(not _loopback(host) for host, _port in self.etcd.endpoints)
        if _loopback(bound) and remote_etcd:
            log.warning("the replication listener is bound to %s, a loopback address (cluster.advertise %r resolves "
                        "there): other machines cannot reach it; set cluster.advertise (or cluster.replication_bind) "
                        "to this node's address", bound, self.advertise)

    async def _watch_members(self) -> None:
        while True:
            try:
                self.members = await self.etcd.members()
                self.running = await self.etcd.nodes()
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s", exc)
            await asyncio.sleep(MEMBERS_SECONDS)

    # -- operating (the leader's management API) ------------------------------

    def status(self) -> dict:
        """rabbitmqctl cluster_status's facts: every member, running or not,
        its role and, for a follower, its replication state and lag."""
        links = {f["name"]: f for f in (self.replicator.followers() if self.replicator else ())}
        in_sync = self.replicator.in_sync if self.replicator else []  # this leader's own record, not etcd's copy
        nodes = []
        for name in sorted(set(self.members) | set(self.running) | {self.name}):
            entry = {"name": name, "running": name in self.running or name == self.name,
                     "in_sync": name in in_sync or name == self.name}
            if name == self.name:
                entry.update(role="leader", state="leading", lag_bytes=0, lag_seconds=0.0)
            else:
                link = links.get(name)
                entry.update(role="follower", state=link["state"] if link else
                             ("not connected" if entry["running"] else "stopped"),
                             lag_bytes=link["lag_bytes"] if link else None,
                             lag_seconds=link["lag_seconds"] if link else None)
            nodes.append(entry)
        return {"leader": self.name, "nodes": nodes, "in_sync": [self.name] + in_sync}

    def figures(self, name: str) -> dict:
        """A running member's memory, disk and descriptor figures as it last
        published them (shared.figures; {} when unknown)."""
        return self.running.get(name, {}).get("figures") or {}

    async def forget(self, name: str) -> None:
        try:
            await self._forget(name)
        except EtcdUnavailable as exc:
            raise ClusterError("etcd unreachable: %s" % exc) from None

    async def _forget(self, name: str) -> None:
        if name == self.name:
            raise ClusterError("%s is the leader: transfer the leadership first" % name)
        if name not in self.members:
            raise ClusterError("%s is not a member of the cluster" % name)
        if name in await self.etcd.nodes():
            raise ClusterError("%s is running: stop it before forgetting it" % name)
        await self.etcd.forget(self.name, name)
        self.members.pop(name, None)

    async def transfer(self, name: str) -> None:
        """Hand the leadership to `name` without losing a confirm: it must be
        in sync; the clients are disconnected, every change held until the
        followers have it, then this node resigns and rejoins as a follower."""
        links = {f["name"]: f for f in self.replicator.followers()}
        if name == self.name:
            raise ClusterError("%s already leads" % name)
        if links.get(name, {}).get("state") != "in sync":
            raise ClusterError("%s is not an in-sync follower" % name)
        try:
            await self.etcd.set_transfer(name, TRANSFER_SECONDS)
        except EtcdUnavailable as exc:
            raise ClusterError("etcd unreachable: %s" % exc) from None
        log.info("cluster node %s: handing the leadership to %s", self.name, name)
        asyncio.get_running_loop().create_task(self._hand_over(name))

    async def _hand_over(self, name: str) -> None:
        await asyncio.sleep(0.1)  # the API's reply goes out first
        await self.server.stop()  # clients closed; the writer drains through the followers' acknowledgements
        if not await self.replicator.caught_up(name):
            log.warning("cluster node %s: %s left the in-sync set: the hand-over ends in an election", self.name,
                        name)
        self.gateway.stop()
        self.replicator.stop()
        await self.etcd.resign(self.name)
        self.fence("the leadership was handed over")

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

    async def _stop_metrics(self) -> None:
        runner, self._metrics = self._metrics, None
        if runner is not None:
            await runner.cleanup()

    async def stop(self) -> None:
        await self._stop_metrics()
        for task in self._tasks:
            task.cancel()
        await self._unfollow()
        await self.proxy.stop()
        if self.server is not None:
            # Through the gate still: what the writer drains reaches the followers first.
            await self.server.stop()
        if self.gateway is not None:
            self.gateway.stop()
        if self.replicator is not None:
            self.replicator.stop()
        self.keeper.stop(revoke=True)
        await self.etcd.close()


def _nothing() -> None:
    return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
