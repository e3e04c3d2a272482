"""This shard's side of its node (docs/scaling.md): the links to the other
shards, the queues it owns for them, and its RemoteQueues' way to theirs
(it is the `vhosts.remote_queue.ShardPort`).

Links: every shard listens on its socket in the node's link directory and
opens one link to every other shard (again after a loss); a shard sends its
requests on the link it opened, and answers a request on the link it came
on, so a request and its answer share one ordered byte stream. In a
cluster the shards are the leaders of their groups, wherever they run
(`dial`, given by amqp_server.cluster.node): a link is a TCP connection to
the peer leader's replication port, and a new leader of a group is that
peer ending and starting again.

Records (tuples, amqp_server.shards.link), by the requester:
  ("hello", index)                        first on every link
  ("bye",)                                 last on every link of a shard that stops cleanly
  ("pub", vhost, [queues], exchange, routing key, header, body, ticket)
                                           ticket 0: no confirm wanted, and then one record carries a
                                           message to every queue of that shard it was routed to;
                                           with a ticket, one queue (its answer is that queue's)
  ("consume", cid, vhost, queue, tag, no_ack, exclusive, prefetch, global prefetch, arguments)
                                           answered ("consumed", cid, code, text) before any delivery
  ("cancel", cid)                          answered ("cancelled", cid) behind every delivery to it
  ("qos", cid, global prefetch)            the consumer's channel's basic.qos global changed
  ("settle", cid, outcome, [entry ids])    ack, reject or requeue; cid 0: a get
  ("credit", cid, n)                       no-ack deliveries handed to the client
  ("acks", n)                              after settles: answer once their records are written
  ("get", ticket, vhost, queue, no_ack)
  ("reply", vhost, token, data)            a direct reply to a channel of that shard (no answer)
  ("token", ticket, vhost, token)          does that shard's channel of this reply token live?
  ("hold", vhost, queue, holding)         credit flow: that shard's publishers into the queue wait, or go on
  ("counts", ticket, vhost, queue)
  ("purge", ticket, vhost, queue)
  ("define", ticket, op)                   to shard 0 (amqp_server.shards.definitions)
  ("sync", ticket)                         to shard 0: all its definitions, please
  ("apply", ticket, batch, changes)        from shard 0 to every other shard
  ("report", index, report)               to shard 0, every REPORT_INTERVAL (no answer)
  ("ask", ticket, service, args)          a management service of another shard
  ("dead", ticket, vhost, record)          to shard 0: a dead letter for the vhost's log (answer: durable)
  ("moved", (pid, n))                      a connection this shard sent there (hand_over) after every
                                           record it sent before leaving
  ("ping", ticket)                         answered ("pong", ticket) once the records before it are handled
  ("beat",)                                 on every link every heartbeat/4 (no answer)
  ("tallies", counts) ("tally", kind, name, count) ("login", failed, host, username)
                                           to every other shard (amqp_server.shards.tallies)
and by the owner, on the same link:
  ("durable", ticket) ("rejected", ticket) ("acks_written", n)
  ("deliver", cid, entry id, redelivered, deliveries, exchange, routing key, header, body, message id)
                                           the owner's message id (None for a no-ack delivery): a redelivery
                                           is the same message to the client's shard (MQTT QoS 2 reuses
                                           its packet id by it, amqp_server.mqtt.exactly_once)
  ("consumed", cid, code, text)            code 0: the consumer is the owner's; else refused (ACCESS_REFUSED: in
                                           exclusive use), with the owner's code and text
  ("cancelled", cid) ("got", ticket, entry id, redelivered, deliveries, data, count)
  ("live", ticket, bool) ("counted", ticket, messages, consumers) ("purged", ticket, count) ("defined", ticket, result)
  ("refused", ticket, code, text) ("applied", ticket) ("synced", ticket, changes, batch)
  ("answer", ticket, answer) ("failed", ticket, code, text)

Invariants: an entry the owner delivered over a link stays held for that
link (`held`) until it is settled; when the link is lost the owner gives
every held entry back to its queue (redelivered), as when a channel closes.
A no-ack delivery is settled when it is sent, and counts against its
consumer's window until the client's shard gives credit back.
A client's connection writes nothing after an ack (or reject) until its
record is written (docs/storage.md, "Acks"), also when the queue is another
shard's: the requester numbers the ack and reject settles it sends each
owner, asks behind them on the same link ("acks", n), and the owner answers
("acks_written", n) once its writer has written everything queued so far.
If the owner ends first the wait ends too: its unwritten acks are lost with
it, and the deliveries come back redelivered, as after a node's crash.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import signal
import socket
import struct
import time

from amqp_server.shards import dead_letters
from amqp_server.shards.definitions import Definitions, _refusal
from amqp_server.shards.link import Link
from amqp_server.shards.tallies import Tallies
from storage import Message
from vhosts import reply_to
from vhosts.consumer import Consumer
from vhosts.errors import NOT_FOUND, AMQPError
from vhosts.queue import DURABLE_PENDING, REJECTED
from vhosts.remote_queue import RemoteEntry, RemoteQueue, owner_down

log = logging.getLogger("hutch.shards")

# Deliveries in flight to another shard's no-ack or unlimited consumer.
WINDOW = 512
RECONNECT = 0.1
# Seconds between a shard's reports to shard 0 (what the management API shows of it).
REPORT_INTERVAL = 1.0
# A moving connection's socket: the suffix of a shard's socket for them, and seconds to pass it.
MOVES = ".moves"
MOVE_TIMEOUT = 2.0
# Seconds one half of a move waits for the other (ShardNode._arriving): the "moved" record comes
# behind what the link carried before it, which a busy owner may take a while to read.
ARRIVAL_TIMEOUT = 30.0
_LENGTH = struct.Struct(">I")
# Records that wait for a link to a shard that is starting (a publish, a get).
UNSENT_MAX = 100_000


class ShardGone(Exception):
    """The shard asked ended before it answered."""


class LinkPublisher:
    """Credit flow (vhosts.queue) for the publishers of another shard into one
    queue: the queue's `throttle` and `release_waiters` tell that shard."""

    __slots__ = ("link", "vhost", "name")

    def __init__(self, link: Link, vhost: str, name: str) -> None:
        self.link = link
        self.vhost = vhost
        self.name = name

    def throttled_by(self, _source) -> None:
        self.link.send(("hold", self.vhost, self.name, True))

    def unblocked(self, _source) -> None:
        self.link.send(("hold", self.vhost, self.name, False))


class StandIn:
    """The owner's side of a consumer on another shard: the ConsumerChannel
    its Consumer belongs to."""

    def __init__(self, node: "ShardNode", link: Link, cid: int) -> None:
        self.node = node
        self.link = link
        self.cid = cid
        self.in_flight = 0  # no-ack or unlimited deliveries not credited back
        # The client's channel's basic.qos global (its consumer's own prefetch is fixed at consume,
        # as on one process): it changes with the channel's ("qos" records).
        self.global_prefetch = 0

    @property
    def output_blocked(self) -> bool:
        """Held back only by the link's window (the queue's credit flow counts it)."""
        return self.in_flight >= WINDOW

    def can_deliver(self, consumer: Consumer) -> bool:
        """Both limits of the client's channel hold here: the consumer's own
        prefetch and its channel's global one (which the client's shard also
        counts over the channel's other consumers), so the owner sends no
        more ahead than one process would hand that channel."""
        if self.link.closed:
            return False
        if consumer.no_ack:
            return self.in_flight < WINDOW
        if self.global_prefetch and consumer.unacked >= self.global_prefetch:
            return False
        if consumer.prefetch_count:
            return consumer.unacked < consumer.prefetch_count
        return self.in_flight < WINDOW

    def deliver(self, consumer: Consumer, queue, entry) -> None:
        if consumer.no_ack:
            queue.ack((entry,))
            ident = 0
            queue.stats.deliver_no_ack += 1
        else:
            ident = self.node.hold(self.link, queue, entry, consumer)
            consumer.unacked += 1
            queue.stats.deliver += 1
        if not consumer.prefetch_count or consumer.no_ack:
            self.in_flight += 1
        message = entry.message
        self.link.send(("deliver", self.cid, ident, entry.redelivered, entry.deliveries, message.exchange,
                        message.routing_key, message.header, message.body, message.msg_id if ident else None))

    def deliver_fresh(self, consumer: Consumer, queue, message) -> None:
        queue.stats.deliver_no_ack += 1
        self.in_flight += 1
        self.link.send(("deliver", self.cid, 0, False, 0, message.exchange, message.routing_key, message.header,
                        message.body, None))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        self.node.standins.pop((self.link, self.cid), None)
        self.link.send(("cancelled", self.cid))


class ShardNode:
    def __init__(self, shard, heartbeat: float) -> None:
        self.shard = shard
        self.here = shard.index
        self.broker = None  # set once the broker is built (it needs this node first)
        self.outgoing: dict[int, Link] = {}
        self.links: set[Link] = set()
        self._tickets = itertools.count(1)
        self.waiting: dict[int, object] = {}  # ticket -> callback(record)
        self.standins: dict[tuple, tuple] = {}  # (link, cid) -> (queue, Consumer)
        self.held: dict[Link, dict[int, tuple]] = {}  # link -> entry id -> (queue, entry, consumer)
        self._entry_ids = itertools.count(1)
        self._cids = itertools.count(1)
        self.consumers: dict[int, tuple[RemoteQueue, Consumer]] = {}  # cid -> ours at another shard
        self.definitions = Definitions(self)
        self.tallies = Tallies(self)
        self._server = None
        self._moves: socket.socket | None = None
        # adopt(socket, state, pending): serve a client connection moved here (the composition root's)
        self.adopt = None
        # A move has two halves, the socket (on the moves socket) and the mover's "moved" record (on
        # its link, after every publish the connection sent across before it left); the connection
        # is served here once both came, so those publishes are enqueued before any it sends here
        # (a channel's publishes reach a queue in order). (mover, move id) -> ((socket, state,
        # pending), or None while only the record came; the timer that drops it: _forget).
        self._arriving: dict[tuple[int, tuple], tuple] = {}
        self._move_ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        # What this shard tells shard 0 of itself (its connections, its queues'
        # figures: the management face's rows, given by the composition root),
        # and shard 0's latest report of every other shard: shard -> (monotonic time, report).
        self.report_source = None
        self.reports: dict[int, tuple[float, object]] = {}
        # name -> handler(*args) -> answer (or an awaitable of it): requests another
        # shard's management may make of this one ("ask" records).
        self.services: dict[str, object] = {}
        self._credits: dict[tuple[int, int], int] = {}  # (owner shard, cid) -> deliveries to give back
        self._unsent: dict[int, list] = {}  # peer -> records waiting for its link
        self._unsent_timers: dict[int, asyncio.TimerHandle] = {}  # peer -> when its records stop waiting
        self._last_pub: tuple | None = None  # (message, its "pub" record) sent last without a confirm
        self._wake: dict[int, asyncio.Event] = {}  # peer -> set when it linked here (see _connect)
        # record kind -> its handler, the methods named _on_<kind>
        self._handlers = {name[4:]: getattr(self, name) for name in dir(type(self)) if name.startswith("_on_")}
        self.flows: dict[Link, dict[str, LinkPublisher]] = {}  # credit flow towards each link's publishers
        self.writer = None  # the disk writer (set by the composition root): "acks" answer once it wrote
        # Acks and rejects sent to each owner shard (settle records), and how many it said are written.
        self._acks_sent: dict[int, int] = {}
        self._acks_written: dict[int, int] = {}
        self._acks_asks: dict[Link, int] = {}  # the "acks" record each link gets at the end of this loop turn
        self._acks_waiters: list[tuple[dict, object]] = []  # (marks, callback) of `when_acks_written`
        self._credits_armed = False
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

    def link_protocol(self) -> Link:
        """A link another shard opened to this one."""
        return Link(self.received, self._lost)

    # -- links ------------------------------------------------------------------

    async def start(self) -> None:
        if self.dial is None:
            await self._listen()
        self._spawn(self._beat(self.heartbeat))
        for peer in range(self.shard.count):
            if peer != self.here:
                self._connect_soon(peer, 0)
        if self.here == 0:
            self.definitions.synced.set()
        else:  # serve only with shard 0's definitions, and its counts (amqp_server.shards.tallies)
            await self.definitions.synced.wait()
            await self.tallies.heard_from_0.wait()
            self._spawn(self._report())
            self._spawn(dead_letters.hand_over(self))

    async def _listen(self) -> None:
        path = self.shard.socket(self.here)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: Link(self.received, self._lost), path)
        # Client sockets moving here (amqp_server.amqp.hand_over) come on a socket of their own:
        # a descriptor travels in a message's ancillary data, which asyncio's transports cannot carry.
        self._moves = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        moves = path + MOVES
        try:
            os.unlink(moves)
        except FileNotFoundError:
            pass
        self._moves.bind(moves)
        self._moves.listen(64)
        self._moves.setblocking(False)
        loop.add_reader(self._moves.fileno(), self._moved_here)

    async def _beat(self, timeout: float) -> None:
        """Every timeout/4 a ("beat",) on every link, so each end hears the
        other at least that often; a link nothing came on for `timeout` is
        aborted: it is lost (peer gone, reconnect), as when a peer ends."""
        while True:
            await asyncio.sleep(timeout / 4)
            now = time.monotonic()
            for link in set(self.links) | set(self.outgoing.values()):
                if link.closed:
                    continue
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

    def _on_beat(self, link) -> None:
        """A heartbeat (`_beat`): hearing it is all it is for."""

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self) -> None:
        while True:
            link = self.outgoing.get(0)
            if link is not None and self.report_source is not None:
                try:
                    link.send(("report", self.here, self.report_source()))
                except Exception:
                    log.exception("shard %d: cannot make its report", self.here)
            await asyncio.sleep(REPORT_INTERVAL)

    def _on_report(self, link, index, report):
        self.reports[index] = (asyncio.get_running_loop().time(), report)

    async def ask(self, peer: int, service: str, *args):
        """The answer of `service` on shard `peer` (ShardGone if it ends first)."""
        future = asyncio.get_running_loop().create_future()

        def answered(record):
            if not future.done():
                if record[0] == "answer":
                    future.set_result(record[2])
                elif record[0] == "failed":
                    future.set_exception(AMQPError(record[2], record[3]) if record[2] else RuntimeError(record[3]))
                else:
                    future.set_exception(ShardGone("shard %d ended before it answered" % peer))

        self.request(peer, lambda ticket: ("ask", ticket, service, args), answered)
        return await future

    def _on_ask(self, link, ticket, service, args):
        async def serve():
            try:
                answer = self.services[service](*args)
                if asyncio.iscoroutine(answer):
                    answer = await answer
            except AMQPError as exc:
                link.send(("failed", ticket, exc.reply_code, exc.reply_text))
                return
            except Exception as exc:
                log.exception("shard %d: %s failed", self.here, service)
                link.send(("failed", ticket, 0, str(exc)))
                return
            link.send(("answer", ticket, answer))

        self._spawn(serve())

    def _on_answer(self, link, ticket, answer):
        self._answered(ticket, ("answer", ticket, answer))

    def _on_failed(self, link, ticket, code, text):
        self._answered(ticket, ("failed", ticket, code, text))

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
            for move in [move for move in self._arriving if move[0] == link.peer]:
                self._forget(move)
        self.links.discard(link)
        self.tallies.lost(link)
        self.flows.pop(link, None)
        for ident, (queue, entry, consumer) in self.held.pop(link, {}).items():
            if consumer is not None:
                consumer.unacked -= 1
            queue.requeue((entry,))
        for key in [key for key in self.standins if key[0] is link]:
            queue, consumer = self.standins.pop(key)
            if queue.remove_consumer(consumer) and not queue.deleted:
                queue.host.remove_queue(queue)
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

    def _peer_gone(self, peer: int) -> None:
        """Shard `peer` ended: what waited on it ends too."""
        for cid, (queue, consumer) in list(self.consumers.items()):
            if queue.shard == peer:
                del self.consumers[cid]
                queue.owner_cancelled(consumer.tag)
        for host in self.broker.vhosts.values():
            for queue in host.queues.values():
                if isinstance(queue, RemoteQueue) and queue.shard == peer and queue.backed_up:
                    queue.held(False)
        self.reports.pop(peer, None)
        if self._acks_written.get(peer, 0) < self._acks_sent.get(peer, 0):
            self._acks_written[peer] = self._acks_sent[peer]  # see the opening comment
            self._wake_acks_waiters()
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

    # -- records ------------------------------------------------------------------

    def received(self, link: Link, record: tuple) -> None:
        handler = self._handlers.get(record[0])
        if handler is None:
            log.error("shard %d: unknown record %r from shard %s", self.here, record[0], link.peer)
            return
        handler(link, *record[1:])

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

    def _on_tallies(self, link, counts):
        self.tallies.all_of(link, counts)

    def _on_tally(self, link, kind, name, count):
        self.tallies.one_of(link, kind, name, count)

    def _on_login(self, link, failed, host, username):
        self.tallies.login(failed, host, username)

    def _on_durable(self, link, ticket):
        self._answered(ticket, ("durable", ticket))

    def _on_rejected(self, link, ticket):
        self._answered(ticket, ("rejected", ticket))

    def _on_got(self, link, ticket, *rest):
        self._answered(ticket, ("got", ticket, link) + rest)  # the entry's incarnation (settle)

    def _on_counted(self, link, ticket, *rest):
        self._answered(ticket, ("counted", ticket) + rest)

    def _on_defined(self, link, ticket, result):
        self._answered(ticket, ("defined", ticket, result))

    def _on_refused(self, link, ticket, code, text):
        self._answered(ticket, ("refused", ticket, code, text))

    def _on_applied(self, link, ticket):
        self._answered(ticket, ("applied", ticket))

    def _on_sync(self, link, ticket):
        changes, upto = self.definitions.synced_peer(link)
        link.send(("synced", ticket, changes, upto))
        self.flush_unsent(link.peer)  # behind the definitions they may depend on

    def _on_synced(self, link, ticket, changes, upto):
        self._answered(ticket, ("synced", ticket, changes, upto))

    def _on_define(self, link, ticket, op):
        self.definitions.ordered(link, ticket, op)

    def _on_apply(self, link, ticket, batch, changes):
        self.definitions.batch(link, ticket, batch, changes)

    # -- the owner's side -----------------------------------------------------------

    def _owned(self, vhost: str, name: str):
        host = self.broker.vhosts.get(vhost)
        queue = host.queues.get(name) if host is not None else None
        return None if queue is None or isinstance(queue, RemoteQueue) else queue

    def hold(self, link: Link, queue, entry, consumer=None) -> int:
        ident = next(self._entry_ids)
        self.held.setdefault(link, {})[ident] = (queue, entry, consumer)
        return ident

    def _on_pub(self, link, vhost, names, exchange, routing_key, header, body, ticket):
        message = Message(exchange, routing_key, header, body)  # one for all its queues here, as a local fanout
        if not ticket:
            host = self.broker.vhosts.get(vhost)
            queues = host.queues if host is not None else {}
            for name in names:
                queue = queues.get(name)
                # else deleted meanwhile: as a publish into a queue deleted under it
                if queue is not None and not queue.remote:
                    queue.publish(message)
                    if queue.backed_up:
                        self._throttle(link, queue)
            return
        (name,) = names
        queue = self._owned(vhost, name)
        if queue is None:
            link.send(("durable", ticket))
            return
        answered = []

        def durable():
            if not answered:
                answered.append(True)
                link.send(("durable", ticket))

        outcome = queue.publish(message, durable)
        if queue.backed_up:
            self._throttle(link, queue)
        if outcome == REJECTED:  # reject-publish: the publisher gets a nack
            link.send(("rejected", ticket))
        elif outcome != DURABLE_PENDING:  # nothing will call back
            durable()

    def _throttle(self, link: Link, queue) -> None:
        """The publishers of the shard at the other end of `link` wait for `queue`."""
        flows = self.flows.setdefault(link, {})
        flow = flows.get(queue.name)
        if flow is None:
            flow = flows[queue.name] = LinkPublisher(link, queue.vhost, queue.name)
        if flow not in queue.flow_waiters:
            queue.throttle(flow)

    def _on_hold(self, link, vhost, name, holding):
        host = self.broker.vhosts.get(vhost)
        queue = host.queues.get(name) if host is not None else None
        if isinstance(queue, RemoteQueue):
            queue.held(holding)

    def _on_consume(self, link, cid, vhost, name, tag, no_ack, exclusive, prefetch, global_prefetch, arguments):
        """Accepted or refused as a consumer of this shard is (exclusivity both ways), and
        answered before the queue's first delivery to it: the client's channel answers its
        client then (consume-ok, or the channel closed with this code and text)."""
        queue = self._owned(vhost, name)
        if queue is None:  # deleted meanwhile
            error = AMQPError(NOT_FOUND, "no queue '%s' in vhost '%s'" % (name, vhost))
            link.send(("consumed", cid, error.reply_code, error.reply_text))
            return
        try:
            priority = queue.accept_consumer(no_ack, prefetch, exclusive, arguments)
        except AMQPError as exc:
            link.send(("consumed", cid, exc.reply_code, exc.reply_text))
            return
        standin = StandIn(self, link, cid)
        standin.global_prefetch = global_prefetch
        consumer = Consumer(tag, queue, standin, no_ack, exclusive, prefetch, arguments, priority)
        self.standins[(link, cid)] = (queue, consumer)
        link.send(("consumed", cid, 0, ""))
        queue.add_consumer(consumer)

    def _on_cancel(self, link, cid):
        found = self.standins.pop((link, cid), None)
        if found is not None:
            queue, consumer = found
            if queue.remove_consumer(consumer) and not queue.deleted:
                queue.host.remove_queue(queue)
        # Also when this shard had ended it first (its "cancelled" crossed this cancel): a client
        # waiting for its cancel-ok hears this, behind every delivery sent to the consumer.
        link.send(("cancelled", cid))

    def _on_qos(self, link, cid, global_prefetch):
        found = self.standins.get((link, cid))
        if found is not None:
            queue, consumer = found
            consumer.channel.global_prefetch = global_prefetch
            queue.dispatch()

    def _on_settle(self, link, cid, outcome, idents):
        held = self.held.get(link, {})
        by_queue: dict = {}
        for ident in idents:
            found = held.pop(ident, None)
            if found is None:
                continue
            queue, entry, consumer = found
            if consumer is not None:
                consumer.unacked -= 1
            by_queue.setdefault(queue, []).append(entry)
        for queue, entries in by_queue.items():
            if outcome == "ack":
                queue.stats.ack += len(entries)
                queue.ack(entries)
            elif outcome == "requeue":
                queue.requeue(entries)
            else:
                queue.reject(entries)
            if not queue.deleted:
                queue.dispatch()

    def _on_credit(self, link, cid, count):
        found = self.standins.get((link, cid))
        if found is not None:
            queue, consumer = found
            consumer.channel.in_flight -= count
            queue.dispatch()

    def _on_get(self, link, ticket, vhost, name, no_ack):
        queue = self._owned(vhost, name)
        if queue is None:
            link.send(("got", ticket, 0, False, 0, None, 0))
            return
        self._get(link, ticket, queue, no_ack)

    def _get(self, link, ticket, queue, no_ack) -> None:
        entry = queue.get()
        if entry is None:
            if queue.message_count and not queue.deleted:
                queue.when_available(lambda: self._get(link, ticket, queue, no_ack))
                return
            link.send(("got", ticket, 0, False, 0, None, 0))
            return
        if no_ack:
            queue.ack((entry,))
            ident = 0
        else:
            ident = self.hold(link, queue, entry)
        link.send(("got", ticket, ident, entry.redelivered, entry.deliveries, entry.message.to_bytes(),
                   queue.message_count))

    def _on_purge(self, link, ticket, vhost, name):
        queue = self._owned(vhost, name)
        link.send(("purged", ticket, queue.purge() if queue is not None else 0))

    def _on_purged(self, link, ticket, count):
        self._answered(ticket, ("purged", ticket, count))

    def purge(self, queue: RemoteQueue, done) -> None:
        def answered(record):
            done(record[2] if record[0] == "purged" else owner_down(queue))

        self.request(queue.shard, lambda ticket: ("purge", ticket, queue.vhost, queue.name), answered)

    def _on_counts(self, link, ticket, vhost, name):
        queue = self._owned(vhost, name)
        if queue is None:
            link.send(("counted", ticket, 0, 0))
        else:  # asked for a declare (passive too), which renews x-expires
            queue.touch()
            link.send(("counted", ticket, queue.message_count, queue.consumer_count))

    # -- the client's side (vhosts.remote_queue.ShardPort) ------------------------------

    def place(self, vhost: str, name: str, local: bool, stream: bool) -> int:
        """Where a new queue lives: a stream on shard 0 (its stream-protocol
        readers are there); an exclusive or auto-delete one with its
        declaring connection (`definitions.origin`); any other on the shard
        that holds the fewest queues of the vhost, among the shards that are
        up (a starting one gets queues once it is)."""
        if stream:
            return 0
        if local:
            return self.definitions.origin
        host = self.broker.vhosts.get(vhost)
        counts = [0] * self.shard.count
        if host is not None:
            for queue in host.queues.values():
                counts[getattr(queue, "shard", self.here)] += 1
        up = [self.here] + self.definitions.up()
        return min(up, key=lambda index: (counts[index], (index - self.here) % self.shard.count))

    def publish(self, queue: RemoteQueue, message: Message, on_durable) -> None:
        if on_durable is None:
            # A message routed to several queues of one shard (a fanout) crosses
            # once: while its record is the last one queued on the link, the
            # next of its queues there joins it.
            last = self._last_pub
            if last is not None and last[0] is message:
                link = self.link_to(queue.shard)
                if link is not None and link.queued_last() is last[1] and last[1][1] == queue.vhost:
                    last[1][2].append(queue.name)
                    return
            record = ("pub", queue.vhost, [queue.name], message.exchange, message.routing_key, message.header,
                      message.body, 0)
            self._last_pub = (message, record)
            self.send_to(queue.shard, record)
            return

        def answered(record):
            if record[0] == "durable":
                on_durable()
            else:  # the owner ended first: it may not have the message
                refused = getattr(on_durable, "refused", None)
                if refused is not None:
                    refused()

        self.request(queue.shard, lambda ticket: ("pub", queue.vhost, [queue.name], message.exchange,
                                                  message.routing_key, message.header, message.body, ticket),
                     answered)

    def consume(self, queue: RemoteQueue, consumer: Consumer) -> None:
        """The owner answers ("consumed": `_on_consumed`) before its first delivery."""
        cid = next(self._cids)
        self.consumers[cid] = (queue, consumer)
        consumer.remote_id = cid
        # A starting owner gets it once linked (send_to); one that ends cancels it (_peer_gone).
        # The channel's global prefetch travels apart from the consumer's own: only it changes later.
        if not self.send_to(queue.shard, ("consume", cid, queue.vhost, queue.name, consumer.tag, consumer.no_ack,
                                          consumer.exclusive, consumer.prefetch_count,
                                          getattr(consumer.channel, "global_prefetch", 0), consumer.arguments)):
            self.consumers.pop(cid)
            asyncio.get_running_loop().call_soon(queue.owner_cancelled, consumer.tag)

    def _on_consumed(self, link, cid, code, text):
        found = self.consumers.get(cid)
        if found is None:  # its channel closed meanwhile (its cancel follows this answer to the owner)
            return
        queue, consumer = found
        if code:
            del self.consumers[cid]
            queue.consume_answered(consumer.tag, _refusal(code, text))
        else:
            queue.consume_answered(consumer.tag, None)

    def cancel(self, queue: RemoteQueue, consumer: Consumer, answered: bool = False) -> None:
        """Stop `consumer` at the owner. `answered` (a client's basic.cancel): it stays
        known here until the owner's ("cancelled", cid), so what the owner sent it before
        still reaches it (RemoteQueue.cancel_consumer); else (its channel closed) it is
        forgotten at once, and what still comes for it goes back (`_on_deliver`)."""
        cid = consumer.remote_id
        if not answered:
            if self.consumers.pop(cid, None) is not None:
                self.send_to(queue.shard, ("cancel", cid))  # behind its consume, also while the owner starts
            return
        if cid not in self.consumers or not self.send_to(queue.shard, ("cancel", cid)):
            self.consumers.pop(cid, None)  # no answer will come: the cancel ends here
            asyncio.get_running_loop().call_soon(queue.owner_cancelled, consumer.tag)

    def qos(self, queue: RemoteQueue, consumer: Consumer, global_prefetch: int) -> None:
        """The channel of `consumer` changed its global prefetch: the owner's stand-in follows."""
        if consumer.remote_id in self.consumers:
            self.send_to(queue.shard, ("qos", consumer.remote_id, global_prefetch))

    def settle(self, queue: RemoteQueue, entries: list, outcome: str) -> None:
        # An entry is settled on the link it came on (its incarnation), the one the owner
        # holds it for; once that link closed the owner gave it back to its queue, and
        # its number may name another delivery of a later link: dropped.
        by_link: dict[Link, list[int]] = {}
        for entry in entries:
            if entry.seq and not entry.incarnation.closed:
                by_link.setdefault(entry.incarnation, []).append(entry.seq)
        for link, idents in by_link.items():
            link.send(("settle", 0, outcome, idents))
            if outcome != "requeue":
                peer = queue.shard
                sent = self._acks_sent[peer] = self._acks_sent.get(peer, 0) + 1
                if not self._acks_asks:
                    asyncio.get_running_loop().call_soon(self._ask_acks_written)
                self._acks_asks[link] = sent
        for entry in entries:
            consumer = entry.consumer
            if consumer is not None and (not entry.seq or not consumer.prefetch_count):
                self._credit(queue.shard, consumer.remote_id)

    def _ask_acks_written(self) -> None:
        """One "acks" record per link per loop turn, behind its settles."""
        asks, self._acks_asks = self._acks_asks, {}
        for link, sent in asks.items():
            link.send(("acks", sent))

    def _on_acks(self, link, sent):
        def written() -> None:
            link.send(("acks_written", sent))

        if self.writer.when_written(self.writer.submitted, written):
            written()

    def _on_acks_written(self, link, sent):
        peer = link.peer
        if sent > self._acks_written.get(peer, 0):
            self._acks_written[peer] = sent
            self._wake_acks_waiters()

    def acks_mark(self) -> dict | None:
        """The acks and rejects sent to each owner so far that it has not
        said are written (None: none): what `when_acks_written` waits for."""
        written = self._acks_written
        marks = {peer: sent for peer, sent in self._acks_sent.items() if sent > written.get(peer, 0)}
        return marks or None

    def when_acks_written(self, marks: dict, callback) -> bool:
        """True when every owner in `marks` has written that many of this
        shard's acks; else False, and `callback()` runs once they have."""
        written = self._acks_written
        if all(written.get(peer, 0) >= sent for peer, sent in marks.items()):
            return True
        self._acks_waiters.append((marks, callback))
        return False

    def _wake_acks_waiters(self) -> None:
        written = self._acks_written
        waiting, self._acks_waiters = self._acks_waiters, []
        for marks, callback in waiting:
            if all(written.get(peer, 0) >= sent for peer, sent in marks.items()):
                callback()
            else:
                self._acks_waiters.append((marks, callback))

    def _credit(self, shard: int, cid: int) -> None:
        """One delivery of consumer `cid` handed on: its owner may send another."""
        key = (shard, cid)
        credits = self._credits
        credits[key] = credits.get(key, 0) + 1
        if not self._credits_armed:
            self._credits_armed = True
            asyncio.get_running_loop().call_soon(self._send_credits)

    def _send_credits(self) -> None:
        """One credit record per consumer per loop turn, however many it got."""
        self._credits_armed = False
        credits, self._credits = self._credits, {}
        for (shard, cid), count in credits.items():
            link = self.link_to(shard)
            if link is not None:
                link.send(("credit", cid, count))

    def reply(self, vhost: str, token: str, message: Message) -> None:
        link = self.link_to(reply_to.shard_of(token))
        if link is not None:  # else the token's shard ended, and its channel with it: dropped
            link.send(("reply", vhost, token, message.to_bytes()))

    def _on_reply(self, link, vhost, token, data):
        host = self.broker.vhosts.get(vhost)
        deliver = host.reply_consumers.get(token) if host is not None else None
        if deliver is not None:  # else its channel went meanwhile: dropped, as RabbitMQ drops it
            deliver(Message.from_bytes(data))

    def reply_token(self, vhost: str, token: str, done) -> None:
        """done(whether the channel of `token`, a token of another shard, still lives there):
        a queue.declare of a token (vhosts.reply_to.declared) asks its shard. False if that
        shard ended (its channels with it); at once for a name whose mark is no shard of
        this node (`amq.rabbitmq.reply-to.not-a-token`), which no link would ever answer."""
        shard = reply_to.shard_of(token)
        if not 0 <= shard < self.shard.count:
            done(False)
            return
        self.request(shard, lambda ticket: ("token", ticket, vhost, token),
                     lambda record: done(record[0] == "live" and record[2]))

    def _on_token(self, link, ticket, vhost, token):
        host = self.broker.vhosts.get(vhost)
        link.send(("live", ticket, host is not None and token in host.reply_consumers))

    def _on_live(self, link, ticket, live):
        self._answered(ticket, ("live", ticket, live))

    def changed(self, change: tuple) -> None:
        self.definitions.changed(change)

    def nested(self):
        return self.definitions.nested()

    def fetch(self, queue: RemoteQueue) -> None:
        def answered(record):
            if record[0] == "lost" or record[6] is None:
                queue.fetched(None, 0 if record[0] == "lost" else record[7])
                return
            _kind, _ticket, link, ident, redelivered, deliveries, data, count = record
            queue.fetched(RemoteEntry(ident, Message.from_bytes(data), redelivered, deliveries, None, link), count)

        no_ack = False  # the channel acks a no-ack get itself, at once
        self.request(queue.shard, lambda ticket: ("get", ticket, queue.vhost, queue.name, no_ack), answered)

    def _on_deliver(self, link, cid, ident, redelivered, deliveries, exchange, routing_key, header, body, msg_id):
        found = self.consumers.get(cid)
        if found is None:
            if ident:
                link.send(("settle", 0, "requeue", [ident]))
            return
        queue, consumer = found
        # A no-ack delivery too goes out as an entry: the channel's settling of it gives the
        # credit back, whatever face the consumer is (MQTT hands fresh messages over differently).
        message = Message(exchange, routing_key, header, body, msg_id)
        queue.received(consumer.tag, RemoteEntry(ident, message, redelivered, deliveries, consumer, link))

    def _on_cancelled(self, link, cid):
        found = self.consumers.pop(cid, None)
        if found is not None:
            queue, consumer = found
            queue.owner_cancelled(consumer.tag)

    # -- the node's dead-letter log, kept by shard 0 (amqp_server.shards.dead_letters) -------

    def dead_letter(self, vhost: str, record, on_durable) -> None:
        def answered(answer):
            # Not "durable": shard 0 ended, and the node restarts with it; the message
            # stays in its queue, as a message never leaves one before its record is on disk.
            if answer[0] == "durable":
                on_durable()

        self.request(0, lambda ticket: ("dead", ticket, vhost, record), answered)

    def _on_dead(self, link, ticket, vhost, record):
        host = self.broker.vhosts.get(vhost)
        storage = host.message_storage if host is not None else None
        log = storage.dead_letters if storage is not None else None
        if log is None:  # the vhost was deleted meanwhile, and its log with it
            link.send(("durable", ticket))
            return
        log.append(record, lambda: link.send(("durable", ticket)))

    # -- node-wide limits (amqp_server.shards.tallies) ----------------------------------

    def tallied(self, kind: str, name: str, count: int) -> None:
        self.tallies.tallied(kind, name, count)

    def elsewhere(self, kind: str, name: str) -> int:
        return self.tallies.elsewhere(kind, name)

    def counts(self, queue, done) -> None:
        """A queue.declare (passive too) was ordered at shard 0: refresh a
        RemoteQueue's counts from its owner, then done(None), or done(error)
        when the owner ended or is unreachable (`down`). The declare renews
        an x-expires lease where the queue lives: the owner's `counts`
        renews it there, and a queue of this shard is renewed here (shard
        0's declare touched only its RemoteQueue of it)."""
        if not isinstance(queue, RemoteQueue):
            queue.touch()
            done(None)
            return

        def answered(record):
            if record[0] == "counted":
                queue.message_count, queue.consumer_count = record[2], record[3]
                done(None)
            else:
                done(owner_down(queue))

        self.request(queue.shard, lambda ticket: ("counts", ticket, queue.vhost, queue.name), answered)

    # -- connections moving between shards (amqp_server.amqp.hand_over) --------------------

    def hand_over(self, shard: int, fd: int, state: dict, pending: bytes) -> bool:
        """Send a client's socket and its connection's state to `shard`
        (the socket is duplicated into the message); False if it cannot go."""
        link = self.outgoing.get(shard)
        if link is None:
            return False
        move_id = (os.getpid(), next(self._move_ids))  # unique also across the mover's restarts
        data = pickle.dumps((self.here, move_id, state, pending), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as move:
                move.settimeout(MOVE_TIMEOUT)
                move.connect(self.shard.socket(shard) + MOVES)
                socket.send_fds(move, [_LENGTH.pack(len(data))], [fd])
                move.sendall(data)
        except OSError as exc:
            log.warning("shard %d: a connection could not move to shard %d: %s", self.here, shard, exc)
            return False
        link.send(("moved", move_id))
        return True

    def others_than(self, shard: int) -> list[int]:
        """The shards but this one and `shard`."""
        return [peer for peer in range(self.shard.count) if peer not in (self.here, shard)]

    def fence(self, shard: int, done) -> None:
        """done() once every shard but this one and `shard` answered a ping:
        each then handled every record this shard sent it before."""
        peers = self.others_than(shard)
        waiting = [len(peers)]

        def answered():  # a pong, or the peer lost (what it had not handled is gone with it)
            waiting[0] -= 1
            if not waiting[0]:
                done()

        for peer in peers:  # a callback each: `request` marks it with its peer
            self.request(peer, lambda ticket: ("ping", ticket), lambda _record: answered())

    def _on_ping(self, link, ticket):
        link.send(("pong", ticket))

    def _on_pong(self, link, ticket):
        self._answered(ticket, ("pong", ticket))

    def _moved_here(self) -> None:
        try:
            move, _address = self._moves.accept()
        except (BlockingIOError, InterruptedError):
            return
        fds = []
        try:
            with move:
                move.settimeout(MOVE_TIMEOUT)
                head, fds, _flags, _address = socket.recv_fds(move, _LENGTH.size, 1)
                (length,) = _LENGTH.unpack(head)
                data = bytearray()
                while len(data) < length:
                    chunk = move.recv(length - len(data))
                    if not chunk:
                        raise ConnectionError("the moving shard closed early")
                    data += chunk
                mover, move_id, state, pending = pickle.loads(data)
        except (OSError, ValueError, struct.error, pickle.UnpicklingError) as exc:
            log.error("shard %d: a connection moving here was lost: %s", self.here, exc)
            for fd in fds:
                os.close(fd)
            return
        self._arrived((mover, move_id), (socket.socket(fileno=fds[0]), state, pending))

    def _on_moved(self, link, move_id):
        self._arrived((link.peer, move_id), None)

    def _arrived(self, move: tuple[int, tuple], connection: tuple | None) -> None:
        """One half of a move came (see _arriving): the connection is served once both did;
        a half whose other half has not come within ARRIVAL_TIMEOUT is dropped (`_forget`)."""
        if move not in self._arriving:
            timer = asyncio.get_running_loop().call_later(ARRIVAL_TIMEOUT, self._forget, move)
            self._arriving[move] = (connection, timer)
            return
        other, timer = self._arriving.pop(move)
        timer.cancel()
        self.adopt(*(connection or other))

    def _forget(self, move: tuple[int, tuple]) -> None:
        """A move's other half never came (its mover ended between the two, or a socket
        failed on its way here): a socket waiting here closes, as on the mover's failure."""
        connection, timer = self._arriving.pop(move)
        timer.cancel()
        if connection is not None:
            log.warning("shard %d: a connection moving here from shard %d was dropped: its mover's "
                        "record did not come", self.here, move[0])
            connection[0].close()

    def say_bye(self) -> None:
        """At the start of a clean stop: every peer hears it on every link
        before that link closes, so neither side reports the loss as a failure."""
        self.stopping = True
        for link in list(self.links) + list(self.outgoing.values()):
            link.send(("bye",))

    async def stop(self) -> None:
        self.stopping = True
        if self._moves is not None:
            asyncio.get_running_loop().remove_reader(self._moves.fileno())
            self._moves.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        for link in list(self.links) + list(self.outgoing.values()):
            link.close()
