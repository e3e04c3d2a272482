"""The owner's side (docs/scaling.md): the records a shard handles for the
queues it owns, from the shards whose clients use them (publishes, consumers
and their stand-ins, settles, credits, gets, purges, counts, the "acks" a
client's shard waits for behind its settles), and the direct replies and
reply tokens of its own channels. An entry the owner delivered over a link
stays held for that link (`held`) until it is settled; when the link is lost
the owner gives every held entry back to its queue, redelivered, as when a
channel closes (`_give_back`). A no-ack delivery is settled when it is sent,
and counts against its consumer's window until the client's shard gives
credit back.
"""
from __future__ import annotations

import itertools

from amqp_server.shards.link import Link
from storage import Message
from vhosts.consumer import Consumer
from vhosts.errors import NOT_FOUND, AMQPError
from vhosts.queue import DURABLE_PENDING, REJECTED
from vhosts.remote_queue import RemoteQueue

# Deliveries in flight to another shard's no-ack or unlimited consumer.
WINDOW = 512


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

    def __init__(self, node: "OwnerSide", link: Link, cid: int) -> None:
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
        if self.link.closed or self.link.full:  # a full link: `_link_drained` dispatches again
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


class OwnerSide:
    """The queues a shard owns, as the other shards use them (a part of
    ShardNode: amqp_server.shards.node)."""

    def __init__(self) -> None:
        self.standins: dict[tuple, tuple] = {}  # (link, cid) -> (queue, Consumer)
        self.held: dict[Link, dict[int, tuple]] = {}  # link -> entry id -> (queue, entry, consumer)
        self._entry_ids = itertools.count(1)
        self.flows: dict[Link, dict[str, LinkPublisher]] = {}  # credit flow towards each link's publishers
        self.writer = None  # the disk writer (set by the composition root): "acks" answer once it wrote

    def _link_drained(self, link: Link) -> None:
        """`link` filled up or drained: once drained, the queues of its stand-ins deliver again."""
        if link.full:
            return
        for queue in {queue for (on, _cid), (queue, _consumer) in self.standins.items() if on is link}:
            if not queue.deleted:
                queue.dispatch()

    def _give_back(self, link: Link) -> None:
        """`link` is lost: what its shard held here goes back, its consumers end."""
        self.flows.pop(link, None)
        for ident, (queue, entry, consumer) in self.held.pop(link, {}).items():
            if consumer is not None:
                consumer.unacked -= 1
            queue.requeue((entry,))
        for key in [key for key in self.standins if key[0] is link]:
            queue, consumer = self.standins.pop(key)
            if queue.remove_consumer(consumer) and not queue.deleted:
                queue.host.remove_queue(queue)

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

    def _on_counts(self, link, ticket, vhost, name):
        queue = self._owned(vhost, name)
        if queue is None:
            link.send(("counted", ticket, 0, 0))
        else:  # asked for a declare (passive too), which renews x-expires
            queue.touch()
            link.send(("counted", ticket, queue.message_count, queue.consumer_count))

    def _on_acks(self, link, sent):
        def written() -> None:
            link.send(("acks_written", sent))

        if self.writer.when_written(self.writer.submitted, written):
            written()

    def _on_reply(self, link, vhost, token, data):
        host = self.broker.vhosts.get(vhost)
        deliver = host.reply_consumers.get(token) if host is not None else None
        if deliver is not None:  # else its channel went meanwhile: dropped, as RabbitMQ drops it
            deliver(Message.from_bytes(data))

    def _on_token(self, link, ticket, vhost, token):
        host = self.broker.vhosts.get(vhost)
        link.send(("live", ticket, host is not None and token in host.reply_consumers))
