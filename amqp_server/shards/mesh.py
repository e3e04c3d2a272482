"""The mesh of a node's shards (docs/scaling.md): every shard listens on its
socket in the node's link directory and opens one link to every other shard
(again after a loss, at once when the peer links here); a shard sends its
requests on the link it opened, and answers a request on the link it came
on, so a request and its answer share one ordered byte stream. In a cluster
the shards are the leaders of their groups, wherever they run (`dial`, given
by amqp_server.cluster.node): a link is a TCP connection to the peer
leader's replication port, and a new leader of a group is that peer ending
and starting again. Here are the hello and bye of a link, its heartbeats
(`_beat`) and the fencing of a stalled peer (`_fence`), the records that wait
for a link to a starting peer (`send_to`), requests and their answers
(`request`, `waiting`), and what a lost link or peer ends (`_lost`,
`_peer_gone`). The records are amqp_server.shards.records': one that does
not fit its kind is logged and skipped (`received`), the link kept.
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
        self.outgoing: dict[int, Link] = {}
        self.links: set[Link] = set()
        self._tickets = itertools.count(1)
        self.waiting: dict[int, object] = {}  # ticket -> callback(record)
        self._server = None
        self._tasks: set[asyncio.Task] = set()
        self._unsent: dict[int, list] = {}  # peer -> records waiting for its link
        self._unsent_timers: dict[int, asyncio.TimerHandle] = {}  # peer -> when its records stop waiting
        self._wake: dict[int, asyncio.Event] = {}  # peer -> set when it linked here (see _connect)
        self._handlers: dict = {}  # record kind -> its handler (amqp_server.shards.records.table)
        # A clean stop is announced ("bye"), so the links it ends are not taken for a
        # failure: on this shard once it stops, and at the peers that heard it.
        self.stopping = False
        self.leaving: set[int] = set()  # peers that said bye and have not linked here since
        # In a cluster: dial(peer, protocol factory) -> (transport, protocol), the link to
        # the current leader of shard `peer`'s group (OSError while it has none); the
        # links then come through the replication port (`link_protocol`), not a Unix socket.
        self.dial = None
        # Seconds without a byte after which a link is taken for lost (`_beat`): on one node
        # the peer has stalled (stopped, a disk or host that hangs) and is killed, so that
        # the supervisor starts it again; in a cluster (the replication stream's
        # `cluster.replication_timeout`, set with `dial`) a peer cut off by a partition, or
        # ended on a node the partition hides, closes no TCP connection this side could see.
        self.heartbeat = heartbeat
        # In a cluster, whether this shard's leader lease holds (set with `dial`): what its
        # links send waits while it does not (amqp_server.shards.link.Link.promising).
        self.promising = None

    def link_protocol(self) -> Link:
        """A link another shard opened to this one."""
        return Link(self.received, self._lost, self._link_full, self.promising)

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
        aborted: it is lost (peer gone, reconnect), as when a peer ends."""
        while True:
            await asyncio.sleep(timeout / 4)
            now = time.monotonic()
            for link in set(self.links) | set(self.outgoing.values()):
                if link.closed or link.peer in self.leaving:
                    continue  # a peer that said bye beats no more while its clean stop ends
                if now - link.heard > timeout:
                    log.warning("shard %d: nothing from shard %s for %.1f s; the link is taken for lost", self.here,
                                link.peer, now - link.heard)
                    if self.dial is None:
                        self._fence(link)
                    link.abort()
                else:
                    link.send(("beat",))

    def _fence(self, link: Link) -> None:
        """The shard at the other end of a silent link on this node has stalled: it
        is killed (a stopped process too), so that what it holds is given back
        as after its crash and the supervisor starts it again, as a cluster fences
        a stalled leader. Its pid is the socket's peer (SO_PEERCRED): the process
        that holds the other end now, so no other process is hit."""
        try:
            sock = link.transport.get_extra_info("socket")
            pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
        except (AttributeError, OSError) as exc:
            log.error("shard %d: cannot tell which process shard %s is: %s", self.here, link.peer, exc)
            return
        if pid <= 0 or pid == os.getpid():
            return
        log.error("shard %d: shard %s (pid %d) has stalled: killing it, the supervisor starts it again", self.here,
                  link.peer, pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wake_links(self) -> None:
        """The lease holds again (a cluster): what the links held leaves."""
        for link in set(self.links) | set(self.outgoing.values()):
            link.wake()

    def _on_beat(self, link) -> None:
        """A heartbeat (`_beat`): hearing it is all it is for."""

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _connect_soon(self, peer: int, delay: float) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(peer, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, peer: int, delay: float) -> None:
        await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self.dial is None:
                    _transport, link = await loop.create_unix_connection(self.link_protocol, self.shard.socket(peer))
                else:
                    _transport, link = await self.dial(peer, self.link_protocol)
                break
            except OSError:
                # Tried again after RECONNECT, or at once when the peer links here (it is up).
                wake = self._wake.setdefault(peer, asyncio.Event())
                try:
                    await asyncio.wait_for(wake.wait(), RECONNECT)
                except TimeoutError:
                    pass
                wake.clear()
        link.peer = peer
        self.outgoing[peer] = link
        self.links.add(link)
        link.send(("hello", self.here))
        self.tallies.linked(link)
        self.flush_unsent(peer)
        log.info("shard %d: linked to shard %d", self.here, peer)
        self.definitions.linked(peer)

    def _lost(self, link: Link) -> None:
        if link in self.links:  # the mover's "moved" records come on it: its moves here cannot complete
            self._moves_lost(link.peer)
        self.links.discard(link)
        self.tallies.lost(link)
        self._give_back(link)
        if link.full:  # its peer's publishers waited for this link, which no longer holds them
            link.full = False
            self._link_full(link)
        peer = link.peer
        if peer is not None and self.outgoing.get(peer) is link:
            del self.outgoing[peer]
            if self.stopping or peer in self.leaving:
                log.info("shard %d: the link to shard %d closed (%s stopping)", self.here, peer,
                         "this shard is" if self.stopping else "it is")
            else:
                log.warning("shard %d: the link to shard %d is lost", self.here, peer)
            self._peer_gone(peer)
            if not self.stopping:
                self._connect_soon(peer, RECONNECT)
        elif peer is not None and self.definitions.synced_on(link):
            # Shard 0 sends its records for `peer` on the link it synced on (`link_to`): a consume
            # sent there after the outgoing link's loss ended the others is cancelled too.
            self._peer_gone(peer)
        # What was asked on this link is answered on it or never: on shard 0 requests take the
        # link the peer synced on (link_to), which may be lost after the one _peer_gone follows,
        # with a request sent on it in between (a commit waiting for it hung).
        for ticket, callback in list(self.waiting.items()):
            if getattr(callback, "link", None) is link:
                del self.waiting[ticket]
                callback(("lost", ticket))
        self.definitions.link_lost(link)

    def _link_full(self, link: Link) -> None:
        """A link filled up, or drained: what sends to its peer waits while any link to it is
        full (the publishers into its queues, the deliveries of its consumers here)."""
        peer = link.peer
        if peer is None:
            return
        full = any(other.full and not other.closed for other in self._links_of(peer))
        log.debug("shard %d: the links to shard %d are %s", self.here, peer, "full" if full else "drained")
        self._peer_full(peer, full)
        self._link_drained(link)

    def _links_of(self, peer: int) -> list[Link]:
        links = [link for link in self.links if link.peer == peer]
        outgoing = self.outgoing.get(peer)
        return links + [outgoing] if outgoing is not None and outgoing not in links else links

    def _peer_gone(self, peer: int) -> None:
        """Shard `peer` ended: what waited on it ends too."""
        self._owner_gone(peer)
        self.reports.pop(peer, None)
        for ticket, callback in list(self.waiting.items()):
            if getattr(callback, "peer", None) == peer:
                del self.waiting[ticket]
                callback(("lost", ticket))

    def request(self, peer: int, record_of, callback, link: Link | None = None) -> None:
        """Send record_of(ticket) to `peer` (on `link`, by default the one
        requests to it take: `link_to`); callback(answer) gets the answer
        (("lost", ticket) if the peer ends first, or that link is lost)."""
        ticket = next(self._tickets)
        callback.peer = peer
        if link is None:
            link = self.link_to(peer)
        if link is not None:
            link.send(record_of(ticket))
        elif not self.send_to(peer, record_of(ticket)):  # it waits for a link
            callback(("lost", ticket))
            return
        callback.link = link  # its answer can come on that link only (None: the one it waits for)
        self.waiting[ticket] = callback

    def link_to(self, peer: int) -> Link | None:
        """The link this shard sends requests to `peer` on: the one it opened,
        but on shard 0 the one `peer` synced on, behind the batches of
        definition changes (sent first), so that a request made right after
        a change (MQTT declares a queue and consumes from it) never overtakes
        the change at the peer."""
        if self.here == 0:
            link = self.definitions.follower_link(peer)
            if link is not None:
                return link
        return self.outgoing.get(peer)

    def flush_unsent(self, peer: int) -> None:
        """What waited for a link to `peer` goes on the link requests to it take (`link_to`)."""
        link = self.link_to(peer)
        if link is not None:
            timer = self._unsent_timers.pop(peer, None)
            if timer is not None:
                timer.cancel()
            for record in self._unsent.pop(peer, ()):
                link.send(record)

    def send_to(self, peer: int, record: tuple) -> bool:
        """Send `record` on this shard's link to `peer`; while there is none
        (the peer starts, or starts again) it waits for the link, at most
        UNSENT_MAX records per peer. False: dropped."""
        link = self.link_to(peer)
        if link is not None:
            link.send(record)
            return True
        unsent = self._unsent.setdefault(peer, [])
        if len(unsent) >= UNSENT_MAX:
            return False
        unsent.append(record)
        if peer not in self._unsent_timers:
            self._unsent_timers[peer] = asyncio.get_running_loop().call_later(self.heartbeat, self._unreachable,
                                                                              peer)
        return True

    def _unreachable(self, peer: int) -> None:
        """Records waited `heartbeat` seconds for a link to `peer` (a shard that cannot
        start, or starts slowly): its queues are down, as a queue's node is to RabbitMQ;
        what waited on it ends (requests answered "lost") rather than hang."""
        self._unsent_timers.pop(peer, None)
        if self.link_to(peer) is not None:  # linked meanwhile
            self.flush_unsent(peer)
            return
        dropped = self._unsent.pop(peer, [])
        if dropped:
            log.warning("shard %d: shard %d unreachable for %.1f s: %d records for it dropped, its queues are down",
                        self.here, peer, self.heartbeat, len(dropped))
            self._peer_gone(peer)

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

    def _on_hello(self, link: Link, index: int) -> None:
        link.peer = index
        self.leaving.discard(index)  # started again
        self.links.add(link)
        wake = self._wake.get(index)
        if wake is not None:
            wake.set()

    def _on_bye(self, link: Link) -> None:
        if link.peer is not None:
            self.leaving.add(link.peer)

    def say_bye(self) -> None:
        """At the start of a clean stop: every peer hears it on every link
        before that link closes, so neither side reports the loss as a failure."""
        self.stopping = True
        for link in list(self.links) + list(self.outgoing.values()):
            link.send(("bye",))

    def _close_links(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self.links) + list(self.outgoing.values()):
            link.close()
