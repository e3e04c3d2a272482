"""The port's side (docs/scaling.md): what a RemoteQueue asks of the shard
that owns its queue, as the `vhosts.remote_queue.ShardPort` (where a new
queue lives, publishes, consumers and their deliveries, settles and the
credits they give back, gets, purges, counts, direct replies and reply
tokens), and the owners' answers. A client's connection writes nothing after
an ack (or reject) until its record is written (docs/storage.md, "Acks"),
also when the queue is another shard's: the port numbers the ack and reject
settles it sends each owner, asks behind them on the same link ("acks", n),
and the owner answers ("acks_written", n) once its writer has written
everything queued so far (`acks_mark`, `when_acks_written`); if the link
is lost first the wait ends too (`_owner_unlinked`): the acks it had not
answered for may be lost (the owner's end, or a loss before they arrived),
and their deliveries come back redelivered, as after a node's crash.
"""
from __future__ import annotations

import asyncio
import itertools

from amqp_server.shards.link import Link
from storage import Message
from vhosts import reply_to
from vhosts.consumer import Consumer
from vhosts.errors import AMQPError
from vhosts.remote_queue import RemoteEntry, RemoteQueue, owner_down


class PortSide:
    """This shard's way to the queues of the others (a part of ShardNode:
    amqp_server.shards.node)."""

    def __init__(self) -> None:
        self._cids = itertools.count(1)
        self.consumers: dict[int, tuple[RemoteQueue, Consumer]] = {}  # cid -> ours at another shard
        self._credits: dict[tuple[int, int], int] = {}  # (owner shard, cid) -> deliveries to give back
        self._credits_armed = False
        self._last_pub: tuple | None = None  # (message, its "pub" record) sent last without a confirm
        # Acks and rejects sent to each owner shard (settle records), and how many it said are written.
        self._acks_sent: dict[int, int] = {}
        self._acks_written: dict[int, int] = {}
        self._acks_asks: dict[Link, int] = {}  # the "acks" record each link gets at the end of this loop turn
        self._acks_waiters: list[tuple[dict, object]] = []  # (marks, callback) of `when_acks_written`

    def _owner_unlinked(self, peer: int) -> None:
        """The link to shard `peer` is lost, or none came in time: its consumers
        here are cancelled (their stand-ins there ended with the link, or their
        consume was never sent), its queues hold no publisher (the holds were
        the link's), and the acks sent to it are taken for written (one link at
        a time carries them, so the next one counts on from there)."""
        for cid, (queue, consumer) in list(self.consumers.items()):
            if queue.shard == peer:
                del self.consumers[cid]
                queue.owner_cancelled(consumer.tag)
        self._remote_queues_held(peer, False, everything=True)
        if self._acks_written.get(peer, 0) < self._acks_sent.get(peer, 0):
            self._acks_written[peer] = self._acks_sent[peer]  # see the module's docstring
            self._wake_acks_waiters()

    def _peer_full(self, peer: int, full: bool) -> None:
        """The links to shard `peer` are full (or no longer): publishers into its queues wait."""
        self._remote_queues_held(peer, full)

    def _remote_queues_held(self, peer: int, holding: bool, everything: bool = False) -> None:
        for host in self.broker.vhosts.values():
            for queue in host.queues.values():
                if isinstance(queue, RemoteQueue) and queue.shard == peer:
                    if everything:
                        queue.released()
                    else:
                        queue.held(holding, RemoteQueue.LINK_FULL)

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
                link = self.peers.get(queue.shard)
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
        # A starting owner gets it once linked (send_to); a lost link cancels it (_owner_unlinked).
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
            queue.consume_answered(consumer.tag, AMQPError.from_reply(code, text))
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

    def _on_hold(self, link, vhost, name, holding):
        host = self.broker.vhosts.get(vhost)
        queue = host.queues.get(name) if host is not None else None
        if isinstance(queue, RemoteQueue):
            queue.held(holding)

    def fetch(self, queue: RemoteQueue) -> None:
        def answered(record):
            if record[0] == "lost" or record[6] is None:
                queue.fetched(None, 0 if record[0] == "lost" else record[7])
                return
            _kind, _ticket, link, ident, redelivered, deliveries, data, count = record
            queue.fetched(RemoteEntry(ident, Message.from_bytes(data), redelivered, deliveries, None, link), count)

        no_ack = False  # the channel acks a no-ack get itself, at once
        self.request(queue.shard, lambda ticket: ("get", ticket, queue.vhost, queue.name, no_ack), answered)

    def purge(self, queue: RemoteQueue, done) -> None:
        def answered(record):
            done(record[2] if record[0] == "purged" else owner_down(queue))

        self.request(queue.shard, lambda ticket: ("purge", ticket, queue.vhost, queue.name), answered)

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

    def reply(self, vhost: str, token: str, message: Message) -> None:
        link = self.link_to(reply_to.shard_of(token))
        if link is not None:  # else the token's shard ended, and its channel with it: dropped
            link.send(("reply", vhost, token, message.to_bytes()))

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

    def _on_durable(self, link, ticket):
        self._answered(ticket, ("durable", ticket))

    def _on_rejected(self, link, ticket):
        self._answered(ticket, ("rejected", ticket))

    def _on_got(self, link, ticket, *rest):
        self._answered(ticket, ("got", ticket, link) + rest)  # the entry's incarnation (settle)

    def _on_counted(self, link, ticket, *rest):
        self._answered(ticket, ("counted", ticket) + rest)

    def _on_purged(self, link, ticket, count):
        self._answered(ticket, ("purged", ticket, count))

    def _on_live(self, link, ticket, live):
        self._answered(ticket, ("live", ticket, live))
