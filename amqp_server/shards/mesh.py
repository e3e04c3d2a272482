"""The mesh of a node's shards (docs/scaling.md). The rule: one link per
pair of shards, which the higher index dials (the lower listens on its
socket in the node's link directory, or in a cluster on its leader's
replication port: `dial`, given by amqp_server.cluster.node) and dials
again after a loss; everything one shard sends another, requests and their
answers alike, travels on it, so it arrives in the order sent, and a peer
has one link at a time (`peers`: a newer one replaces it). A link starts
with each side's hello, which names its shard's *incarnation* (a random id
made at its start). A lost link fails what was in flight on it and nothing
more (`_link_down`: requests answered "lost", deliveries given back,
consumers cancelled); what was the peer's alone (its transient and
exclusive queues, its counts: `_peer_ended`) ends only once the peer is
known to have ended: its bye, a hello with another incarnation, or on one
node its process's exit (`_exited`, told by a pidfd), which its fencing
(`_fence`) brings about after `heartbeat` seconds silent or without a
link. Here too are the heartbeats (`_beat`), the records that wait for a
link (`send_to`) and requests (`request`, `waiting`); the records are
amqp_server.shards.records': one that does not fit its kind is logged and
skipped (`received`), the link kept.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import struct
import time

from amqp_server.shards.link import Link
from amqp_server.shards.records import RECORDS

log = logging.getLogger("hutch.shards")

RECONNECT = 0.1
# Records that wait for a link to a shard that is starting (a publish, a get).
UNSENT_MAX = 100_000


class ShardGone(Exception):
    """The shard asked ended before it answered."""


class Mesh:
    """The links of a shard (a part of ShardNode: amqp_server.shards.node)."""

    def __init__(self, heartbeat: float) -> None:
        self.incarnation = os.urandom(8).hex()  # this process's run of its shard, in its hellos
        self.peers: dict[int, Link] = {}  # peer -> its one link, once both hellos crossed on it
        self.links: set[Link] = set()  # every link open here that said hello, or that this shard dialed
        self._incarnations: dict[int, str] = {}  # peer -> the incarnation its last link said, until it ended
        self._processes: dict[int, tuple[int, int]] = {}  # one node: peer -> (pid, pidfd) of its process
        self._tickets = itertools.count(1)
        self.waiting: dict[int, object] = {}  # ticket -> callback(record)
        self._server = None
        self._tasks: set[asyncio.Task] = set()
        self._unsent: dict[int, list] = {}  # peer -> records waiting for its link
        self._down: dict[int, asyncio.TimerHandle] = {}  # peer -> when it is taken for unreachable
        self._handlers: dict = {}  # record kind -> its handler (amqp_server.shards.records.table)
        # A clean stop is announced ("bye"), so the links it ends are not taken for a
        # failure: on this shard once it stops, and at the peers that heard it.
        self.stopping = False
        self.leaving: set[int] = set()  # peers that said bye and have not linked here since
        # In a cluster: dial(peer, protocol factory) -> (transport, protocol), the link to
        # the current leader of shard `peer`'s group (OSError while it has none); the
        # links then come through the replication port (`link_protocol`), not a Unix socket.
        self.dial = None
        # Seconds without a byte after which a link is taken for lost (`_beat`), and without a
        # link after which a peer is unreachable (`_unreachable`): on one node the peer has
        # stalled (stopped, a disk or host that hangs) and is killed, so that the supervisor
        # starts it again; in a cluster (the replication stream's `cluster.replication_timeout`,
        # set with `dial`) a peer cut off by a partition, or ended on a node the partition hides,
        # closes no TCP connection this side could see.
        self.heartbeat = heartbeat
        # In a cluster, whether this shard's leader lease holds (set with `dial`): what its
        # links send waits while it does not (amqp_server.shards.link.Link.promising).
        self.promising = None

    def link_protocol(self) -> Link:
        """A link a higher shard dials to this one."""
        return Link(self.received, self._lost, self._link_full, self.promising)

    def _dialed(self, peer: int) -> Link:
        link = Link(self.received, self._lost, self._link_full, self.promising)
        link.peer = peer  # before its hello: a loss, however early, dials again (`_lost`)
        return link

    async def _listen(self) -> None:
        path = self.shard.socket(self.here)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self.link_protocol, path)

    async def _beat(self, timeout: float) -> None:
        """Every timeout/4 a ("beat",) on every link, so each end hears the
        other at least that often; a link nothing came on for `timeout` is
        aborted: it is lost, and on one node its peer has stalled: fenced."""
        while True:
            await asyncio.sleep(timeout / 4)
            now = time.monotonic()
            for link in list(self.links):
                if link.closed or link.peer in self.leaving:
                    continue  # a peer that said bye beats no more while its clean stop ends
                if now - link.heard <= timeout:
                    link.send(("beat",))
                    continue
                log.warning("shard %d: nothing from shard %s for %.1f s; the link is taken for lost", self.here,
                            link.peer, now - link.heard)
                if self.peers.get(link.peer) is link:
                    self._fence(link.peer, "has stalled")
                link.abort()

    def _watch(self, peer: int, link: Link) -> None:
        """One node: watch the process at the other end of `link` (the socket's
        peer, SO_PEERCRED, whatever its hello said) through a pidfd, which
        names that process and never a later one given its pid: it becomes
        readable when the process ends (`_exited`), and `_fence` kills by it."""
        self._unwatch(peer)
        try:
            sock = link.transport.get_extra_info("socket")
            pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError) as exc:
            log.error("shard %d: cannot tell which process shard %d is: %s", self.here, peer, exc)
            return
        self._processes[peer] = (pid, pidfd)
        asyncio.get_running_loop().add_reader(pidfd, self._exited, peer)

    def _unwatch(self, peer: int) -> None:
        process = self._processes.pop(peer, None)
        if process is not None:
            asyncio.get_running_loop().remove_reader(process[1])
            os.close(process[1])

    def _exited(self, peer: int) -> None:
        """One node: shard `peer`'s process ended (a crash, a SIGKILL, its
        fencing, the end of a clean stop), which is its end whatever its link
        says yet."""
        clean = self.stopping or peer in self.leaving
        (log.info if clean else log.warning)("shard %d: shard %d (pid %d) ended", self.here, peer,
                                             self._processes[peer][0])
        link = self.peers.get(peer)
        if link is not None:  # lost, but not read so yet: its loss first
            self._link_down(link)
            link.abort()
        self._peer_ended(peer)

    def _fence(self, peer: int, why: str) -> None:
        """On one node, shard `peer` `why` (stalled, or not linked again): it is
        killed (a stopped process too), so that what it holds is given back as
        after its crash and the supervisor starts it again, as a cluster fences
        a stalled leader; its end follows from its exit (`_exited`)."""
        if peer not in self._processes:  # a cluster's, or ended already
            return
        pid, pidfd = self._processes[peer]
        log.error("shard %d: shard %d (pid %d) %s: killing it, the supervisor starts it again", self.here, peer,
                  pid, why)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError as exc:
            log.error("shard %d: cannot kill shard %d: %s", self.here, peer, exc)

    def wake_links(self) -> None:
        """The lease holds again (a cluster): what the links held leaves."""
        for link in self.links:
            link.wake()

    def _on_beat(self, link) -> None:
        """A heartbeat (`_beat`): hearing it is all it is for."""

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _connect_soon(self, peer: int, delay: float) -> None:
        self._spawn(self._connect(peer, delay))

    async def _connect(self, peer: int, delay: float) -> None:
        """Dial shard `peer` (a lower index) until it answers, then say hello."""
        await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self.dial is None:
                    _transport, link = await loop.create_unix_connection(lambda: self._dialed(peer),
                                                                         self.shard.socket(peer))
                else:
                    _transport, link = await self.dial(peer, lambda: self._dialed(peer))
                break
            except OSError:
                await asyncio.sleep(RECONNECT)
        if not link.closed:  # else lost already, and dialed again (`_lost`)
            self.links.add(link)
            link.send(("hello", self.here, self.incarnation))

    def _on_hello(self, link: Link, index: int, incarnation: str) -> None:
        """The other side's hello: on a link this shard dialed, its answer; on
        one it accepted, the dialer's (from a higher index only), answered.
        The link is then `index`'s, replacing the one before (whose loss this
        end may not have seen: a TCP connection's); another incarnation than
        that link's means the shard ended and started again."""
        dialed = link.peer is not None
        if not (index == link.peer if dialed else self.here < index < self.shard.count):
            log.error("shard %d: a hello from shard %r on a link it may not come on; closing it", self.here, index)
            link.close()
            return
        if not dialed:
            link.peer = index
            self.links.add(link)
            link.send(("hello", self.here, self.incarnation))
        old = self.peers.get(index)
        if old is not None and old is not link:
            self._link_down(old)
            old.abort()
        if self._incarnations.get(index, incarnation) != incarnation:
            log.warning("shard %d: shard %d started again", self.here, index)
            self._peer_ended(index)
        first = index not in self._incarnations  # the first link to this incarnation of it
        self._incarnations[index] = incarnation
        self.peers[index] = link
        self.leaving.discard(index)  # started again
        if self.dial is None:
            self._watch(index, link)
        timer = self._down.pop(index, None)
        if timer is not None:
            timer.cancel()
        log.info("shard %d: linked to shard %d", self.here, index)
        self.tallies.linked(link)
        self._flush_unsent(index)  # before anything sent from now on: in the order it was sent
        self.definitions.linked(index, first)

    def _lost(self, link: Link) -> None:
        self.links.discard(link)
        peer = link.peer
        if peer is not None and self.peers.get(peer) is link:
            self._link_down(link)
        if peer is not None and peer < self.here and not self.stopping:
            self._connect_soon(peer, RECONNECT)

    def _link_down(self, link: Link) -> None:
        """`link`, its peer's, is gone (lost, or replaced): what was in flight
        on it ends, and nothing else; the peer may well live, and link again."""
        peer = link.peer
        del self.peers[peer]
        if self.stopping or peer in self.leaving:
            log.info("shard %d: the link to shard %d closed (%s stopping)", self.here, peer,
                     "this shard is" if self.stopping else "it is")
        else:
            log.warning("shard %d: the link to shard %d is lost", self.here, peer)
        # What was asked on this link is answered on it or never.
        for ticket, callback in list(self.waiting.items()):
            if callback.link is link:
                del self.waiting[ticket]
                callback(("lost", ticket))
        self._give_back(link)
        self._owner_unlinked(peer)
        self._moves_lost(peer)
        self.definitions.link_lost(peer)
        if peer in self.leaving:
            self._peer_ended(peer)
        elif not self.stopping:
            self._arm_down(peer)

    def _peer_ended(self, peer: int) -> None:
        """Shard `peer` is known to have ended (it said bye, came back as another
        incarnation, or its process exited): what was its alone ends with it."""
        self._incarnations.pop(peer, None)
        self._unwatch(peer)
        self.reports.pop(peer, None)
        self.tallies.ended(peer)
        self.definitions.peer_ended(peer)

    def _link_full(self, link: Link) -> None:
        """A link filled up, or drained: what sends to its peer waits while it is
        full (the publishers into its queues, the deliveries of its consumers here)."""
        if link.peer is not None and self.peers.get(link.peer) is link:
            log.debug("shard %d: the link to shard %d is %s", self.here, link.peer, "full" if link.full else "drained")
            self._peer_full(link.peer, link.full)
        self._link_drained(link)

    def request(self, peer: int, record_of, callback) -> None:
        """Send record_of(ticket) to `peer`; callback(answer) gets the answer
        (("lost", ticket) if the link it went on is lost first, or no link
        came within `heartbeat`)."""
        ticket = next(self._tickets)
        callback.peer = peer
        link = self.link_to(peer)
        if link is not None:
            link.send(record_of(ticket))
        elif not self.send_to(peer, record_of(ticket)):
            callback(("lost", ticket))
            return
        callback.link = link  # its answer can come on that link only (None: the one it waits for)
        self.waiting[ticket] = callback

    def link_to(self, peer: int) -> Link | None:
        """The link to `peer` (None while there is none); on shard 0 with the
        definition changes made so far queued on it first, so that a record
        sent right after a change (MQTT declares a queue and consumes from
        it) never overtakes the change at the peer."""
        link = self.peers.get(peer)
        if link is not None and self.here == 0:
            self.definitions.send_pending()
        return link

    def _flush_unsent(self, peer: int) -> None:
        """What waited for a link to `peer` goes on the one it has now, first."""
        link = self.peers[peer]
        for record in self._unsent.pop(peer, ()):
            link.send(record)
        for callback in self.waiting.values():
            if callback.peer == peer and callback.link is None:
                callback.link = link

    def send_to(self, peer: int, record: tuple) -> bool:
        """Send `record` on the link to `peer`; while there is none (the peer
        starts, or links again) it waits for the link, at most UNSENT_MAX
        records per peer and `heartbeat` seconds. False: dropped."""
        link = self.link_to(peer)
        if link is not None:
            link.send(record)
            return True
        unsent = self._unsent.setdefault(peer, [])
        if len(unsent) >= UNSENT_MAX:
            return False
        unsent.append(record)
        self._arm_down(peer)
        return True

    def _arm_down(self, peer: int) -> None:
        if peer not in self._down:
            self._down[peer] = asyncio.get_running_loop().call_later(self.heartbeat, self._unreachable, peer)

    def _unreachable(self, peer: int) -> None:
        """No link to `peer` for `heartbeat` seconds, since its link was lost or
        records began to wait for one (a shard that cannot start, or starts
        slowly): its queues are down, as a queue's node is to RabbitMQ, and what
        waited on it ends (requests answered "lost") rather than hang. On one
        node a shard that was linked here is fenced."""
        self._down.pop(peer, None)
        if peer in self.peers or self.stopping:
            return
        dropped = self._unsent.pop(peer, [])
        if dropped:
            log.warning("shard %d: shard %d unreachable for %.1f s: %d records for it dropped, its queues are down",
                        self.here, peer, self.heartbeat, len(dropped))
        for ticket, callback in list(self.waiting.items()):
            if callback.peer == peer and callback.link is None:
                del self.waiting[ticket]
                callback(("lost", ticket))
        self._owner_unlinked(peer)
        self._fence(peer, "has not linked again for %.1f s" % self.heartbeat)

    def received(self, link: Link, record: list) -> None:
        fault = RECORDS.fault(record)
        if fault is not None:
            log.error("shard %d: a record from shard %s skipped: %s", self.here, link.peer, fault)
            return
        self._handlers[record[0]](link, *record[1:])

    def _answered(self, ticket: int, record: tuple) -> None:
        callback = self.waiting.pop(ticket, None)
        if callback is not None:
            callback(record)

    def _on_bye(self, link: Link) -> None:
        if link.peer is not None and self.peers.get(link.peer) is link:
            self.leaving.add(link.peer)

    def say_bye(self) -> None:
        """At the start of a clean stop: every peer hears it before its link
        closes, so neither side reports the loss as a failure, and the peers
        know this shard ended."""
        self.stopping = True
        for link in self.peers.values():
            link.send(("bye",))

    def _close_links(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link.close()
        for peer in list(self._processes):
            self._unwatch(peer)
