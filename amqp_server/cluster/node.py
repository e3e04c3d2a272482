"""A cluster node's life: join, follow or lead, and stop.

Theory of operation:
- At start the node reads what its data directory knows of its cluster
  (amqp_server.cluster.state: the cluster identity, the term and position
  it holds, the lineage of its stream, the in-sync set last seen), reaches
  etcd (retrying and saying so while it cannot), takes its lease
  (`LeaseKeeper`) and registers under `nodes/<name>`.
- Data is never thrown away to follow someone else. A node follows only a
  leader of its own cluster identity; a node with no identity adopts the
  leader's only when its data directory holds nothing. A node holding data
  of another cluster, or of its own (it ran alone), refuses, says why and
  waits (`hutchctl force_boot` makes its data the cluster's; docs/cluster.md).
  When following would remove changes this directory holds and the leader
  never had (its position runs past where, in the leader's lineage, its
  term ended), the files the snapshot replaces or removes are moved to a
  dated directory beside the data directory first.
- Elections. With no leader, every node posts `positions/<name>`: its
  identity, the (term, position) its directory holds (persisted: a
  restarted node knows it) and whether it holds data. The terms count
  elections, so (term, position) orders the copies: the most complete one
  is the one to lead. Three cases, by etcd's `cluster` record:
  - the record is this node's cluster: it campaigns when it is eligible
    (named in `in_sync`) and no other in-sync node has posted more (every
    running one must have posted, and a follower of the set that is not
    running is given 2 x lease_ttl to come back and post; ties: the lowest
    name). A planned
    hand-over names its node (`transfer`), which campaigns alone once it
    has everything;
  - no record and no identity here (a new cluster): a node with data
    campaigns first (the lowest-named one, if several); nodes with nothing
    wait 2 x lease_ttl from their start before one of them founds an empty
    cluster, so a node with data started with them or shortly after leads
    and keeps its data;
  - no record, or an older one, while this node has an identity (etcd's keys
    were lost, restored from an old backup, or the prefix changed): the
    cluster is re-established from its most complete member, once every
    node of the in-sync set this directory last saw has posted; until then
    the node waits and says so, and `hutchctl force_boot` names the node to
    lead when some are lost for good.
  The winner's transaction creates `leader` (on its lease) only if absent
  and the `cluster` record is unchanged, writing the record with the new
  term: exactly one node wins.
- A follower keeps its data directory a copy of the leader's
  (follower.Follower), reconnecting whenever the leader changes, and
  persists the position it holds after every applied change.
- The leader opens the data directory exactly as a restart after a crash
  does (`BrokerServer`), records itself alone in `in_sync`, starts the
  replication stream (replication.Replicator: the storage writer's gate, so
  no durability reply leaves before the in-sync followers hold it or while
  its lease may have run out) and its replication port (gateway.Gateway:
  only running members holding the cluster secret pass), and serves;
  followers join `in_sync` once they hold everything confirmed. Its term
  (the one its campaign wrote) names its stream: a follower never follows
  a lower one (follower.Follower, which starts from the highest term its
  directory has seen). It checks every second that etcd still names it
  leader of its cluster and term: if not (keys lost or replaced), it stops
  at once and rejoins.
- etcd unreachable: nothing changes while it is out; the leader confirms
  nothing once its lease may have run out and goes on when etcd answers
  that the lease is alive (lease.LeaseKeeper); a node whose lease etcd
  ended takes a new one and registers again, except the leader, which
  re-executes itself: every socket closes at once, nothing more is
  promised, and the fresh process rejoins.
- A clean stop (SIGTERM) revokes the lease, so a successor need not wait
  for it to run out.
- A node of several shards (docs/scaling.md) runs all of this once per
  shard, in the shard's process, on the shard's directory: shard K is
  replication group K, with its keys under `prefix/shards/K/` and its
  replication port `replication_port + K` (the composition root sets both;
  shard 0 keeps the node's). Each group elects its own leader, so the
  groups' leaders spread over the nodes: where copies tie, group K prefers
  the node K places after the lowest name, in name order (`_preference`).
  A group's leader links to the other groups' leaders through their
  replication ports (handshake purpose "link"); a follower forwards an
  AMQP client to a shard its node leads, else to its own group's leader
  (either reaches every queue over those links), and MQTT, stream and
  HTTP clients to group 0's. A shard that must stop at once ends its
  process (the supervisor starts it again) rather than re-executing the
  node.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
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
from amqp_server.cluster.state import LEADING, ClusterState, DataDirectory, diverged, new_identity, rank
from amqp_server.shared.allocator import collect_rarely
from amqp_server.shared.config import BrokerConfig
from amqp_server.shared.errors import ListenError
from storage.data_directory import CLEAN_SHUTDOWN
from amqp_server.shared.figures import member_figures

log = logging.getLogger("hutch.cluster")

POLL_SECONDS = 0.25  # how often a follower looks at the leader key
RETRY_SECONDS_MAX = 8.0  # the longest wait between failed replication connections
MEMBERS_SECONDS = 1.0  # how often the leader refreshes what it reports of the others
TRANSFER_SECONDS = 10  # a planned hand-over's etcd key lives this long at most
FOUNDING_LEASES = 2  # an empty node founds a new cluster after this many lease_ttl from its start
SAY_SECONDS = 10.0  # a node that waits says why this often
RESTART_LEASES = 2  # an election waits this many lease_ttl for an in-sync follower that is not running
FIGURES_SECONDS = 5.0  # how often a follower republishes its memory and disk figures
FENCED = 75  # a shard's exit status when it stops at once (`fence`): its supervisor starts it again


class ClusterError(ValueError):
    """A cluster operation refused; the message is for the operator."""


def _posted_rank(posted: dict | None) -> tuple[int, int]:
    if not posted or posted.get("term") is None or posted.get("position") is None:
        return rank(None)
    return rank((int(posted["term"]), int(posted["position"])))


class StateNotSaved(OSError):
    """The cluster state file could not be written (a full disk)."""


class ClusterNode:
    def __init__(self, config: BrokerConfig, open_broker: Callable[[BrokerConfig], Any],
                 follower_metrics: Callable[["ClusterNode"], web.Application], shard=None) -> None:
        """Built by the composition root (amqp_server.process.cluster), which
        gives it `open_broker` (a leader's broker, opened and not started),
        `follower_metrics` (the aiohttp app of a follower's own /metrics)
        and, on a node of several shards, this process's `shard` (its
        `index` and `count`; `config` is then the shard's group's)."""
        self.base = config.cluster  # the node's settings; this process's group's are config's
        self.shard = shard
        self.group = shard.index if shard is not None else 0
        config = dataclasses.replace(config, cluster=group_settings(config.cluster, self.group))
        self.config = config
        self._groups: dict[int, Etcd] = {}  # the other groups' keys (`_dial_link`)
        self.shards: list[dict] = []  # group 0's leader: every group's status, as last gathered
        self._local_leader: dict | None = None  # a follower: a shard this node leads (`_leader_here`)
        self.open_broker = open_broker
        self.follower_metrics = follower_metrics
        cluster = config.cluster
        self.name = cluster.node_name or socket.gethostname()
        self.advertise = cluster.advertise or socket.gethostname()
        timeout = max(0.5, cluster.lease_ttl / 4)
        self.etcd = Etcd.configured(cluster, timeout)
        self.keeper = LeaseKeeper(lambda: Etcd.configured(cluster, timeout), cluster.lease_ttl,
                                  self.fence, self._renewed, self._revived, lambda: self.role == "leader")
        self.role = "joining"
        self.leader: str | None = None
        self.server = None  # the leader's broker (amqp_server.process.server.BrokerServer)
        self.replicator: Replicator | None = None
        self.gateway: Gateway | None = None
        self.directory = DataDirectory(config.data_dir)
        self.state = ClusterState()
        self.has_data = False
        self.secret = (cluster.secret or "").encode()
        try:
            self.tls_server, tls_client = handshake.server_context(cluster), handshake.client_context(cluster)
        except (OSError, ssl.SSLError) as exc:
            raise ListenError("cannot load the cluster's TLS certificate, key or CA (cluster.tls_*): %s" % exc) from None
        fsync = config.storage.durability == "fsync"
        self.follower = Follower(self.name, config.data_dir, fsync, self.secret, tls_client,
                                 cluster.replication_timeout)
        self.follower.record = lambda mark: self.directory.record_position(mark, fsync)
        self._following: asyncio.Task | None = None
        self._retry_seconds = POLL_SECONDS  # before the next replication connection after a failure
        self._followed: str | None = None
        self._leader_info: dict = {}  # nodes/<leader> of the leader followed
        self._posted: dict | None = None  # positions/<name> as last written
        self._began = time.monotonic()
        self._leaderless_since = time.monotonic()  # since when no leader was seen
        self._said: dict[str, float] = {}  # what a waiting node said, and when
        # A client of a node with no leader yet waits as long as a lone first node takes to
        # found the cluster (it would otherwise be closed before the protocol header).
        self.proxy = Proxy(self._leader_address, self._dial, FOUNDING_LEASES * cluster.lease_ttl + 1.0)
        # The leader's view of the others, refreshed every MEMBERS_SECONDS.
        self.members: dict[str, dict] = {}
        self.running: dict[str, dict] = {}
        self._tasks: list[asyncio.Task] = []
        self._metrics: web.AppRunner | None = None  # a follower's /metrics
        self._loop: asyncio.AbstractEventLoop | None = None
        self.in_sync_alarm = False  # _check_in_sync_alarm
        self._led_at = 0.0
        self.started = time.monotonic()
        self._figures_at = 0.0  # time.monotonic() of the last registration with figures

    # -- membership ----------------------------------------------------------

    def describe(self) -> dict:
        """What `nodes/<name>` holds: how the others reach this node, and
        (for followers to check) its cluster, term and lineage."""
        ports = {protocol: port for protocol, _host, port in (self.server.listeners if self.server else ())}
        return {"advertise": self.advertise, "replication_port": self.config.cluster.replication_port,
                "role": self.role, "ports": ports, "stream": self.stream_address(), "pid": os.getpid(),
                "cluster": self.state.cluster,
                "term": self.state.term, "lineage": self.state.lineage,
                # memory, disk, descriptors: the leader's /api/nodes shows them for this member
                "figures": member_figures(self.config, self.uptime_ms())}

    def stream_address(self) -> dict | None:
        """Where stream clients reach this node, leader or follower (its
        stream listeners, or the proxy's that forward them): the leader's
        stream metadata names the in-sync followers by it as replicas."""
        settings = self.config.stream
        if not settings.enabled:
            return None
        listening = {protocol: port for protocol, _host, port in self.server.listeners} if self.server \
            else self.proxy.listening
        port, tls_port = listening.get("stream"), listening.get("stream/ssl")
        if settings.advertised_port:
            port = settings.advertised_port
            tls_port = tls_port and settings.advertised_port
        return {"host": settings.advertised_host or self.advertise, "port": port, "tls_port": tls_port}

    def stream_replicas(self, tls: bool) -> list[tuple[str, int]]:
        """The in-sync followers' stream addresses (host, port), for this
        leader's metadata: the members that hold every confirmed record, as
        a RabbitMQ stream's replicas do. A follower serves a client through
        the leader (it forwards the connection), which stream clients that
        read from replicas accept: the leader is among their candidates."""
        found = []
        for name in self.replicator.in_sync if self.replicator else ():
            address = (self.running.get(name) or {}).get("stream") or {}
            port = address.get("tls_port" if tls else "port")
            if port:
                found.append((address["host"], port))
        return found

    def uptime_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    async def register(self) -> None:
        self._figures_at = time.monotonic()
        await self.etcd.register(self.name, self.describe(), self.keeper.lease_id)

    def _say(self, message: str) -> None:
        """Log a reason to wait, once every SAY_SECONDS."""
        now = time.monotonic()
        if now - self._said.get(message, -SAY_SECONDS) >= SAY_SECONDS:
            self._said[message] = now
            log.error("cluster node %s: %s", self.name, message)

    def _save(self, state: ClusterState) -> None:
        """Write the state, then act on it: a state that could not be written
        (StateNotSaved) is not this node's."""
        try:
            self.directory.save(state)
        except OSError as exc:
            raise StateNotSaved("cannot write the cluster state in %s: %s" % (self.directory.root, exc)) from exc
        self.state = state

    async def eligible(self, by_position: bool) -> bool:
        """May this node campaign in its own cluster (the theory above);
        `by_position`: unless a planned hand-over names it."""
        names = await self.etcd.in_sync()
        if names is None:
            return True  # its founder stopped before writing one: only it has the identity yet
        return self.name in names and (not by_position or await self._most_complete(names))

    async def _post_position(self) -> None:
        held = self.directory.position()
        value = {"cluster": self.state.cluster, "term": held[0] if held else None,
                 "position": held[1] if held else None, "data": self.has_data}
        if value != self._posted:
            await self.etcd.post_position(self.name, value, self.keeper.lease_id)
            self._posted = value

    async def _withdraw_position(self) -> None:
        if self._posted is not None:
            await self.etcd.withdraw_position(self.name)
            self._posted = None

    def _outranked(self, name: str, posted: dict | None, names) -> bool:
        """Whether `name`, having posted `posted`, holds more than this node
        (ties: the one this group prefers among `names`, `_preference`)."""
        theirs, mine = _posted_rank(posted), _posted_rank(self._posted)
        return theirs > mine or theirs == mine and self._preference(name, names) < self._preference(self.name, names)

    def _preference(self, name: str, names, group: int | None = None) -> tuple[int, str]:
        """Group K's order of `name` among `names` (and this node): the
        names in order, rotated by K, so where copies tie the groups' leaders
        spread over the nodes (group 0's first choice is the lowest name)."""
        ordered = sorted(set(names) | {self.name, name})
        return (ordered.index(name) - (self.group if group is None else group)) % len(ordered), name

    async def _most_complete(self, names: list[str]) -> bool:
        """Whether no other in-sync node holds more than this one, once each
        running one has posted its position, and each follower of the set
        (names[1:]: the leader records itself first) that is not running
        yet has had RESTART_LEASES x lease_ttl to come back: a follower
        restarting with everything may be slower to start than one with less."""
        running, posted = await self.etcd.nodes(), await self.etcd.positions()
        patience = time.monotonic() - self._leaderless_since < RESTART_LEASES * self.config.cluster.lease_ttl
        for name in names:
            if name == self.name:
                continue
            if name not in posted:
                if name in running or patience and name != names[0]:
                    return False  # not posted yet
                continue
            if self._outranked(name, posted[name], set(running) | set(names)):
                return False
        return True

    async def _founding(self) -> bool:
        """No cluster record and no identity here: may this node found one?"""
        running, posted = await self.etcd.nodes(), await self.etcd.positions()
        others = {name: value for name, value in posted.items() if name != self.name and name in running}
        if any(value.get("cluster") for value in others.values()):
            return False  # members of a cluster re-establishing it: not for this node to found another
        with_data = sorted(name for name, value in others.items() if value.get("data"))
        if self.has_data:
            return not with_data or self.name < with_data[0]
        if with_data or time.monotonic() - self._began < FOUNDING_LEASES * self.config.cluster.lease_ttl:
            return False  # a node with data leads; or one may still be on its way
        return all(self._preference(self.name, others) < self._preference(name, others) for name in others)

    async def _recovering(self, record: dict | None) -> bool:
        """etcd has no record of this node's cluster, or an older one: may
        this node re-establish it? Once every node of the in-sync set it
        last saw has posted, the most complete one does."""
        running, posted = await self.etcd.nodes(), await self.etcd.positions()
        peers = {name: value for name, value in posted.items()
                 if name != self.name and name in running and value.get("cluster") == self.state.cluster}
        missing = [name for name in self.state.in_sync if name != self.name and name not in peers]
        if missing:
            what = "has no record of" if record is None else "holds an older record (term %d, this node has seen " \
                "term %d) of" % (record["term"], self.state.term)
            self._say("etcd %s cluster %s (its keys were lost, restored from an older backup, or the prefix "
                      "changed): waiting for %s (in sync when last seen) to re-establish it from the most complete "
                      "copy; if they are lost for good, run `hutchctl force_boot --data-dir DIR` on the node whose "
                      "data is to lead" % (what, self.state.cluster, ", ".join(missing)))
            return False
        return not any(self._outranked(name, value, peers) for name, value in peers.items())

    async def _may_campaign(self, record: dict | None, behind: bool) -> bool:
        if self.directory.force_boot():
            log.warning("cluster node %s: force_boot: campaigning with this node's data (%s)", self.name,
                        self.config.data_dir)
            return True
        if record is None or behind:
            return await (self._recovering(record) if self.state.cluster else self._founding())
        if record["id"] != self.state.cluster:
            if self.state.cluster is not None or self.has_data:
                self._refuse("cluster %s has no leader" % record["id"], record["id"])
            return False  # an empty node: it waits to follow a leader
        transfer = await self.etcd.transfer_to()
        return transfer in (None, self.name) and await self.eligible(transfer is None)

    def _refuse(self, situation: str, cluster: str | None) -> None:
        mine = ("data of cluster %s" % self.state.cluster if self.state.cluster
                else "data of its own (it never was in a cluster)")
        self._say("the data directory %s holds %s and %s: not following it, which would replace this node's data. "
                  "To make this node's data the cluster's, stop the other nodes, then run `hutchctl force_boot "
                  "--data-dir %s` here (their differing files are set aside, not erased); to join cluster %s "
                  "instead, stop this node and move its data directory away (docs/cluster.md)"
                  % (self.config.data_dir, mine, situation, self.config.data_dir, cluster))

    def _behind(self, record: dict | None) -> bool:
        """etcd's record is missing or older than this node's directory knows."""
        if self.state.cluster is None:
            return False
        return record is None or record["id"] == self.state.cluster and record["term"] < self.state.term

    # -- the roles -----------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        log.info("cluster node %s: reaching etcd at %s", self.name, self.etcd.urls())
        self._loop = asyncio.get_running_loop()
        # Only the node that stopped cleanly may trust its marker; a copy is changed under it.
        # Without it, promotion recovers as after a crash, and so every message it recovers is
        # delivered with redelivered=true: that covers a delivery whose delivered record had not
        # reached this node (deliveries do not wait for the followers; docs/cluster.md).
        marker = os.path.join(self.config.data_dir, CLEAN_SHUTDOWN)
        if os.path.exists(marker):
            os.remove(marker)
        os.makedirs(self.config.data_dir, exist_ok=True)
        self.state = self.directory.load()
        self.follower.term = self.state.term  # never a stream of a lower term than this directory has seen
        self.has_data = self.directory.holds_data()
        held = self.directory.position()
        log.info("cluster node %s: data directory %s: %s", self.name, self.config.data_dir,
                 "cluster %s, term %d, holding %s" % (self.state.cluster, held[0] if held else self.state.term,
                                                      "an unknown position" if held is None else
                                                      "its whole stream" if held[1] == LEADING else
                                                      "position %d" % held[1])
                 if self.state.cluster else "holds data of its own" if self.has_data else "empty")
        await self.etcd.connect()
        count = self.shard.count if self.shard is not None else 1
        agreed = await self._retrying(lambda: self._group_etcd(0).agree_shards(count))
        if agreed != count:
            raise ListenError("this node runs %d shard%s and cluster nodes under etcd prefix %r run %d: every node "
                              "of a cluster runs the same number of shards (set shards: %d)" % (
                                  count, "" if count == 1 else "s", self.base.etcd_prefix, agreed, agreed))
        await self.keeper.start()
        self._began = time.monotonic()
        self.role = "follower"
        await self._forward()
        await self._retrying(self.register)
        polls = 0
        while not stop.is_set():
            try:
                if await self._step(polls):
                    break
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s", exc)
            polls += 1
            try:
                await asyncio.wait_for(stop.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass
        await stop.wait()

    async def _step(self, polls: int) -> bool:
        """One look at etcd; True once this node leads."""
        self.leader = await self.etcd.leader()
        record, seen = await self.etcd.cluster()
        behind = self._behind(record)
        await self._keep_in_sync(record, behind)
        if polls % int(MEMBERS_SECONDS / POLL_SECONDS) == 0 and not await self.etcd.registered(self.name):
            await self.register()  # etcd lost nodes/<name>
        if self.leader is not None:
            self._leaderless_since = time.monotonic()
        if self.leader is None or behind:
            await self._unfollow()  # the applier is done: the position on disk is final
            await self._post_position()
            if self.leader is None and await self._may_campaign(record, behind):
                return await self._win(record, seen)
        elif self.leader != self.name:
            await self._withdraw_position()
            await self._follow(self.leader, record)
            if time.monotonic() - self._figures_at >= FIGURES_SECONDS:
                await self.register()
            if self.shard is not None and polls % int(MEMBERS_SECONDS / POLL_SECONDS) == 0:
                self._local_leader = await self._leader_here()
        return False

    async def _leader_here(self) -> dict | None:
        """A follower on a node of several shards: the registration of a
        shard this node leads, if any (its AMQP clients are forwarded there,
        within the node, rather than to another node: `_leader_address`)."""
        for index in range(self.shard.count):
            if index != self.group:
                etcd = self._group_etcd(index)
                if await etcd.leader() == self.name:
                    info = (await etcd.nodes()).get(self.name)
                    if info is not None and info.get("role") == "leader":
                        return info
        return None

    async def _keep_in_sync(self, record: dict | None, behind: bool) -> None:
        """The in-sync set of this node's cluster, kept on disk: a recovery
        from lost etcd keys waits for its members."""
        if record is not None and not behind and record["id"] == self.state.cluster:
            names = await self.etcd.in_sync()
            if names is not None and names != self.state.in_sync:
                try:
                    self._save(ClusterState(self.state.cluster, max(self.state.term, record["term"]),
                                            self.state.lineage, names))
                except StateNotSaved as exc:  # a full disk: the next poll tries again
                    self._say(str(exc))

    async def _win(self, record: dict | None, seen: bytes | None) -> bool:
        """Campaign; when won, lead. The new term is one more than any seen."""
        term = max(record["term"] if record else 0, self.state.term) + 1
        identity = (record or {}).get("id") or self.state.cluster or new_identity()
        if not await self.etcd.campaign(self.name, self.keeper.lease_id, seen, {"id": identity, "term": term}):
            return False
        # Forwarding to no one: a client connecting now is refused, and retries; one already
        # waiting for a leader is forwarded to this node's broker once it listens.
        await self.proxy.stop_listening()
        transfer = await self.etcd.transfer_to()
        if transfer is not None:
            await self.etcd.clear_transfer()
        held = self.directory.position()
        lineage = self.state.lineage if self.state.cluster == identity else []
        entry = [term, held[0], held[1]] if held else [term, -1, -1]
        how = "founded" if record is None and self.state.cluster is None else \
            "re-established in etcd" if record is None or record["term"] < self.state.term else "elected"
        self._save(ClusterState(identity, term, lineage + [entry], [self.name]))
        self.directory.record_position((term, LEADING))  # this node holds its whole stream
        self.directory.clear_force_boot()
        log.info("cluster node %s: cluster %s %s, term %d, leading from %s", self.name, identity, how, term,
                 "term %d position %d" % tuple(held) if held else "an empty or unknown position")
        await self._lead(term)
        return True

    async def _follow(self, leader: str, record: dict | None) -> None:
        """Make sure a replication connection to `leader` runs, and know
        where its listeners are (it registers them once they are open), if
        it leads this node's cluster. A follower that cannot write its
        cluster state (a full disk) does not follow: the next poll tries again."""
        try:
            await self._follow_once(leader, record)
        except StateNotSaved as exc:
            self._say(str(exc))

    async def _follow_once(self, leader: str, record: dict | None) -> None:
        info = (await self.etcd.nodes()).get(leader)
        if self._followed == leader and self._following is not None and not self._following.done():
            self._leader_info = info or self._leader_info
            return
        if self._followed != leader:  # not a retry: no wait carried over from another leader
            self._retry_seconds = POLL_SECONDS
        await self._unfollow()
        if info is None or info.get("cluster") is None:
            return  # not registered yet
        if record is not None and record["id"] == info["cluster"] and int(info.get("term") or 0) < record["term"]:
            return  # registered before its election: its term and lineage are not yet the ones it leads with
        if self.directory.force_boot():
            self._say("force_boot waits for no node to lead: %s leads now; stop it and the other nodes" % leader)
            return
        if info["cluster"] != self.state.cluster:
            if self.state.cluster is not None or self.has_data:
                self._refuse("%s leads cluster %s" % (leader, info["cluster"]), info["cluster"])
                return
            log.info("cluster node %s: joining cluster %s (the data directory is empty)", self.name, info["cluster"])
            self._save(ClusterState(info["cluster"], int(info["term"]), list(info["lineage"]), []))
            self.has_data = True  # from now on it holds this cluster's data
        aside = None
        held = self.directory.position()
        if diverged(held, int(info["term"]), info["lineage"]):
            aside = self.directory.aside_directory()
            log.warning("cluster node %s: this copy holds changes %s never had (term %d up to position %s); the "
                        "files that following it replaces or removes are moved to %s", self.name, leader, held[0],
                        "its end" if held[1] == LEADING else held[1], aside)
        if info["term"] > self.state.term or info["lineage"] != self.state.lineage:
            self._save(ClusterState(self.state.cluster, max(self.state.term, int(info["term"])),
                                    list(info["lineage"]), self.state.in_sync))
        self._followed = leader
        self._leader_info = info
        self._following = asyncio.get_running_loop().create_task(
            self._replicate(leader, info["advertise"], info["replication_port"], aside))

    async def _replicate(self, leader: str, host: str, port: int, aside: str | None) -> None:
        """One replication connection. After a failure the next waits
        longer, up to RETRY_SECONDS_MAX, while the same leader is followed
        (`_follow` starts again from POLL_SECONDS for another one): a
        follower that cannot apply (a full disk) would otherwise be sent a
        new snapshot four times a second. A connection that applied its
        snapshot resets the wait."""
        follower = self.follower
        try:
            log.info("following %s at %s:%d", leader, host, port)
            await follower.follow(host, port, aside)
            log.info("replication connection to %s ended", leader)
        except (OSError, ValueError) as exc:
            if follower.reached_live:
                self._retry_seconds = POLL_SECONDS
            if getattr(exc, "errno", None) == errno.ENOSPC:
                log.error("replication from %s: this node's disk is full (%s); retrying in %.1f s",
                          leader, exc, self._retry_seconds)
            else:
                log.warning("replication from %s: %s", leader, exc)
            await asyncio.sleep(self._retry_seconds)
            self._retry_seconds = min(self._retry_seconds * 2, RETRY_SECONDS_MAX)
        else:
            self._retry_seconds = POLL_SECONDS

    async def _forward(self) -> None:
        """Listen where the broker would, forwarding to the leader."""
        config = self.config
        listeners = [("amqp", config.bind, config.port)]
        if config.tls.enabled:
            listeners.append(("amqp/ssl", config.bind, config.tls.port))
        if self.group != 0:  # the others are shard 0's (amqp_server.process.shards)
            for protocol, bind, port in listeners:
                await self._proxy_listen(protocol, bind, port)
            return
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
                await self._proxy_listen(protocol, bind, port)
            if config.prometheus.enabled:  # a follower's own metrics, not the leader's
                protocol, bind, port = "http/prometheus", config.prometheus.bind, config.prometheus.port
                self._metrics = web.AppRunner(self.follower_metrics(self), access_log=None, handle_signals=False)
                await self._metrics.setup()
                await web.TCPSite(self._metrics, bind, port, reuse_address=True).start()
        except OSError as exc:
            raise ListenError("cannot listen for %s on %s:%d: %s" % (protocol, bind, port,
                                                                    exc.strerror or exc)) from None

    async def _proxy_listen(self, protocol: str, bind: str, port: int) -> None:
        shared = self.shard is not None and protocol.split("/")[0] in ("amqp", "mqtt", "stream")
        try:
            await self.proxy.listen(protocol, bind, port, reuse_port=shared)
        except OSError as exc:
            raise ListenError("cannot listen for %s on %s:%d: %s" % (protocol, bind, port,
                                                                    exc.strerror or exc)) from None

    def _leader_address(self, protocol: str) -> tuple[str, int] | None:
        """Where to forward a `protocol` client: the leader's replication
        port, once the leader has registered that listener; on a node of
        several shards an AMQP client goes to a shard this node leads, if
        any (any shard's leader serves every queue: a client stays on the
        node it reached, and `client-local` queues are placed there)."""
        for info in (self._local_leader, self._leader_info):
            if info and info.get("ports", {}).get(protocol):
                return info["advertise"], info["replication_port"]
        if self.role == "leader" and self.server is not None and \
                any(served == protocol for served, _host, _port in self.server.listeners):
            return self.advertise, self.config.cluster.replication_port  # a client held while this node won
        return None

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
        self.proxy.close_forwarded()  # their leader is gone or changed: the clients reconnect
        self._leader_info = {}
        task, self._following, self._followed = self._following, None, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self.follower.idle()

    async def _lead(self, term: int) -> None:
        self.role = "leader"
        self._led_at = time.monotonic()
        self.leader = self.name
        log.info("cluster node %s: elected leader", self.name)
        # the term and lineage followers check come first (`_follow_once`), the listeners once open
        await self._retrying(self.register)
        await self.proxy.stop_listening()  # its ports are the broker's now (see _win)
        await self._stop_metrics()
        cluster = self.config.cluster
        self.server = self.open_broker(self.config)
        server = self.server
        server.management.node.cluster = self
        server.stream_node.replicas = self.stream_replicas
        server.broker.promising = self.keeper.valid  # also for confirms that wait for no disk
        # writer jobs complete in order, through the replication gate, after the definitions' record;
        # on a node of several shards, after every running shard made the change first
        shards = server.shards
        made = shards.definitions.barrier if shards is not None and self.group == 0 else _at_once
        server.broker.durability_barrier = lambda done: made(
            lambda: server.writer.run(_nothing, lambda _result: done()))
        if shards is not None:
            shards.dial = self._dial_link
            shards.heartbeat = cluster.replication_timeout
            shards.tallies.node_name = self.name  # connection_max counts this node's shards only
            shards.promising = self.keeper.valid  # its links, as its clients, hear nothing past the lease
            # what group 0's leader asks of the others' (`shard_statuses`, `rebalance`)
            shards.services["cluster.status"] = self.status
            shards.services["cluster.transfer"] = self.transfer
        self.replicator = Replicator(
            asyncio.get_running_loop(), self.config.data_dir, server.writer, server.definitions, server.mqtt_store,
            self.keeper.valid, term, cluster.min_in_sync_replicas or 0, cluster.max_lag_bytes,
            cluster.max_lag_seconds, self.record_in_sync, cluster.replication_timeout)
        await self._retrying(lambda: self.etcd.set_in_sync(self.name, [self.name]))
        self.replicator.start()
        self.gateway = Gateway(self.secret, term, self._is_member, self.replicator, server.acceptor, self.tls_server,
                               shards.link_protocol if shards is not None else None)
        try:
            await self.gateway.start(cluster.replication_bind or self.advertise, cluster.replication_port)
        except OSError as exc:
            raise ListenError("cannot listen for replication on %s:%d: %s" % (
                cluster.replication_bind or self.advertise, cluster.replication_port, exc.strerror or exc)) from None
        self._warn_if_unreachable(self.gateway.sock.getsockname()[0])
        await server.start()
        collect_rarely()
        await self._retrying(self.register)
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch_members(term)))

    def _group_etcd(self, index: int) -> Etcd:
        """The keys of shard `index`'s replication group (this process's own: self.etcd)."""
        if index == self.group:
            return self.etcd
        etcd = self._groups.get(index)
        if etcd is None:
            etcd = self._groups[index] = Etcd.configured(group_settings(self.base, index), self.etcd.timeout)
        return etcd

    async def _dial_link(self, peer: int, protocol):
        """The link to the leader of shard `peer`'s group, wherever it runs
        (amqp_server.shards.mesh's `dial`); OSError while it has none."""
        etcd = self._group_etcd(peer)
        try:
            leader = await etcd.leader()
            info = (await etcd.nodes()).get(leader) if leader is not None else None
        except EtcdUnavailable as exc:
            raise ConnectionError("etcd unreachable: %s" % exc) from None
        if info is None:
            await asyncio.sleep(POLL_SECONDS)  # elected, or registered, soon
            raise ConnectionError("shard %d has no leader" % peer)
        host, port = info["advertise"], info["replication_port"]
        sock, _term = await handshake.dial(host, port, self.secret, self.name, "link", str(self.group))
        tls = self.follower.tls
        try:
            return await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                protocol, sock=sock, ssl=tls, server_hostname=host if tls else None), handshake.HANDSHAKE_SECONDS)
        except BaseException:
            sock.close()
            raise

    def _warn_if_unreachable(self, bound: str) -> None:
        """The replication listener binds the advertised address; a host name
        that resolves to loopback here (Debian's /etc/hosts maps its own to
        127.0.1.1) would hide it from the other machines."""
        remote_etcd = any(not _loopback(host) for host, _port in self.etcd.endpoints)
        if _loopback(bound) and remote_etcd:
            log.warning("the replication listener is bound to %s, a loopback address (cluster.advertise %r resolves "
                        "there): other machines cannot reach it; set cluster.advertise (or cluster.replication_bind) "
                        "to this node's address", bound, self.advertise)

    async def _watch_members(self, term: int) -> None:
        while True:
            self._check_in_sync_alarm()
            try:
                self.members = await self.etcd.members()
                self.running = await self.etcd.nodes()
                leader = await self.etcd.leader()
                record, _seen = await self.etcd.cluster()
                if leader != self.name or record is None or record["id"] != self.state.cluster or \
                        record["term"] != term:
                    # Keys deleted, etcd rebuilt or restored from a backup: another node may be elected
                    # by them; this one must not go on as if it led.
                    self.fence("etcd no longer names this node leader of cluster %s in term %d (leader %s, record "
                               "%s): its keys were lost or replaced" % (self.state.cluster, term, leader, record))
                if self.name not in self.running:
                    await self.register()
                if self.shard is not None and self.group == 0:
                    self.shards = await self.shard_statuses()
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s", exc)
            await asyncio.sleep(MEMBERS_SECONDS)

    async def shard_statuses(self) -> list[dict]:
        """Group 0's leader: every group's `status`, each asked of its
        leader over their link (the leader etcd names, and no more, while
        that link is down); views show them (`status`'s "shards")."""
        async def of(index: int) -> dict:
            if index == 0:
                return self.status(with_shards=False)
            if index in self.server.shards.peers:
                try:
                    return await asyncio.wait_for(self.server.shards.ask(index, "cluster.status"), MEMBERS_SECONDS)
                except Exception as exc:  # noqa: BLE001 - ended, or slow: said below as unreachable
                    log.info("shard %d's leader did not give its status: %s", index, exc)
            leader = await self._group_etcd(index).leader()
            return {"leader": leader, "nodes": [], "in_sync": [], "in_sync_alarm": False, "reachable": False}

        found = await asyncio.gather(*(of(index) for index in range(self.shard.count)))
        return [dict(status, shard=index) for index, status in enumerate(found)]

    async def rebalance(self) -> list[dict]:
        """Group 0's leader: hand each group's leadership to the node that
        group prefers (`_preference`, over the running members) among its
        in-sync ones, as RabbitMQ's `rabbitmq-queues rebalance` moves
        quorum-queue leaders; group 0's own last (its hand-over ends this
        process's leadership). The moves asked: [{"shard", "from", "to"}]."""
        if self.shard is None:
            raise ClusterError("this node runs one shard: there is nothing to rebalance")
        try:
            statuses = await self.shard_statuses()
            running = set(await self.etcd.nodes())
        except EtcdUnavailable as exc:
            raise ClusterError("etcd unreachable: %s" % exc) from None
        moves = []
        for status in sorted(statuses, key=lambda status: status["shard"] == 0):
            index, leader = status["shard"], status["leader"]
            ready = [n["name"] for n in status["nodes"] if n["in_sync"] and n["running"] and
                     (n["role"] == "leader" or n["state"] == "in sync")]
            if leader is None or not ready:
                continue
            wanted = min(ready, key=lambda name: self._preference(name, running, index))
            if wanted == leader:
                continue
            try:
                if index == 0:
                    await self.transfer(wanted)
                else:
                    await self.server.shards.ask(index, "cluster.transfer", wanted)
            except Exception as exc:  # noqa: BLE001 - that group stays where it is; said
                log.warning("rebalance: shard %d stays on %s: %s", index, leader, exc)
                continue
            moves.append({"shard": index, "from": leader, "to": wanted})
        log.info("rebalance: %s", ", ".join("shard %(shard)d from %(from)s to %(to)s" % m for m in moves) or
                 "every shard already leads where it should")
        return moves

    def _renewed(self) -> None:
        """From the lease thread: etcd ended this (non-leading) node's lease
        and it has a new one; register on it again."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._retrying(self._reregister)))

    async def _reregister(self) -> None:
        self._posted = None  # positions/<name> went with the old lease
        await self.register()

    def _revived(self) -> None:
        """From the lease thread: the lease is valid again after a time in
        which it might have run out. Replies held meanwhile go out now."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._flush_held)

    def _flush_held(self) -> None:
        server = self.server
        if server is None:
            return
        for connection in list(server.connections):
            connection.io.wake()  # output held by amqp_server.shared.client's fencing
        if server.shards is not None:
            server.shards.wake_links()  # and by its links' (amqp_server.shards.link)
        if self.replicator is not None:
            self.replicator.lease_revived()

    # -- operating (the leader's management API) ------------------------------

    def status(self, with_shards: bool = True) -> dict:
        """rabbitmqctl cluster_status's facts: every member, running or not,
        its role and, for a follower, its replication state and lag; on
        group 0's leader of nodes of several shards also every group's, as
        last gathered ("shards": `shard_statuses`)."""
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
        status = {"leader": self.name, "nodes": nodes, "in_sync": [self.name] + in_sync,
                  "in_sync_alarm": self.in_sync_alarm}
        if with_shards and self.shard is not None and self.group == 0:
            status["shards"] = [status_of if status_of["shard"] else dict(status, shard=0)
                                for status_of in self.shards] or [dict(status, shard=0)]
        return status

    def _check_in_sync_alarm(self) -> None:
        """The durability alarm: raised while the in-sync set is this leader
        alone although other members exist (a confirm then rests on one
        disk), except in the first max_lag_seconds after an election, while
        the followers catch up; cleared when a follower is in sync again."""
        others = (set(self.members) | set(self.running)) - {self.name}
        alone = bool(others) and self.replicator is not None and not self.replicator.in_sync and \
            time.monotonic() - self._led_at > self.config.cluster.max_lag_seconds
        if alone and not self.in_sync_alarm:
            log.warning("cluster node %s: in-sync alarm: the in-sync set is this leader alone (%s not in sync): "
                        "confirmed messages are on one node's disk only", self.name, ", ".join(sorted(others)))
        elif self.in_sync_alarm and not alone:
            log.info("cluster node %s: in-sync alarm cleared: %s in sync", self.name,
                     ", ".join(self.replicator.in_sync) if self.replicator else "")
        self.in_sync_alarm = alone

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
        if await self.replicator.caught_up(name):
            self._record_end()
        else:
            log.warning("cluster node %s: %s left the in-sync set: the hand-over ends in an election", self.name,
                        name)
        self.gateway.stop()
        self.replicator.stop()
        await self.etcd.resign(self.name)
        self.fence("the leadership was handed over")

    async def record_in_sync(self, followers: list[str]) -> None:
        """etcd's in-sync set: this leader and `followers` (retried until it is
        written or the lease, and with it this process, ends)."""
        names = [self.name] + followers
        if not await self._retrying(lambda: self.etcd.set_in_sync(self.name, names)):
            self.fence("another node holds the leader key")
        self._save(ClusterState(self.state.cluster, self.state.term, self.state.lineage, names))
        self._check_in_sync_alarm()

    async def _retrying(self, call) -> object:
        while True:
            try:
                return await call()
            except EtcdUnavailable as exc:
                log.warning("etcd unreachable: %s; retrying", exc)
                await asyncio.sleep(0.5)

    # -- stopping ------------------------------------------------------------

    def _record_end(self) -> None:
        """The writer drained: where this leader's stream ends is known, so a
        follower that got all of it is not taken for one that lacks changes."""
        self.directory.record_position((self.replicator.term, self.replicator.position))

    def fence(self, why: str) -> None:
        """Stop serving at once and rejoin (called from the lease thread)."""
        log.error("cluster node %s: %s; stopping at once and rejoining as a follower", self.name, why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if self.shard is not None:
            os._exit(FENCED)  # its supervisor starts the shard again (amqp_server.process.shards)
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
            self._record_end()
            self.replicator.stop()
        self.keeper.stop(revoke=True)
        self.directory.close()
        await self.etcd.close()
        for etcd in self._groups.values():
            await etcd.close()


def _nothing() -> None:
    return None


def _at_once(done) -> None:
    done()


def group_settings(cluster, index: int):
    """The cluster settings of shard `index`'s replication group: its etcd
    keys under `prefix/shards/K/` and its replication port K after the
    node's (shard 0's are the node's own)."""
    if index == 0:
        return cluster
    return dataclasses.replace(cluster, etcd_prefix="%s/shards/%d" % (cluster.etcd_prefix.strip("/"), index),
                               replication_port=cluster.replication_port + index)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
