"""The consuming half of a channel: consumers, deliveries, acks, qos, get.

Invariants:
- `unacked` maps delivery tag -> (queue, entry, consumer or None for
  basic.get), in ascending tag order (dict insertion order; tags only grow).
- `consumer.unacked` and `global_unacked` count the unacked deliveries made
  to consumers (basic.get is not subject to prefetch, as in RabbitMQ).
- A consumer may receive a message only when `can_deliver` says so: channel
  flow is on, the connection's output is not paused, and neither the
  consumer's nor the channel's (global) prefetch is reached.
- Releasing the channel requeues every unacked message (redelivered=true)
  and cancels every consumer (auto-delete queues go when their last one goes).
- The direct reply-to consumer (amqp_server.amqp.direct_reply_to) is
  `reply_consumer`, not one of `consumers`: it has no queue.
- Counting (RabbitMQ's message_stats): each delivery, get and ack is counted
  on its queue and on this channel (`stats`), not on the vhost, which sums
  its channels' counters when read (vhosts.stats.VhostStats).
"""
from __future__ import annotations

import base64
import os

from pamqp import commands

from amqp_server.amqp import direct_reply_to, fastpath
from vhosts import firehose
from amqp_server.amqp.declarations import held
from amqp_server.amqp.framing import named_method
from amqp_server.amqp.hand_over import HandOver, movable
from storage.message import encode_value
from vhosts import Consumer
from vhosts.stats import MessageStats
from vhosts.queue_types import QUORUM
from vhosts.errors import (
    AMQPError,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)

ACK, REQUEUE, DISCARD = "ack", "requeue", "discard"


def _counted(entry) -> bytes:
    """The content header of a message given back at least once: as
    published, plus x-delivery-count (how many times)."""
    return entry.message.header_with({"x-delivery-count": encode_value(entry.deliveries)})


def new_consumer_tag() -> str:
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


class Deliveries:
    def __init__(self) -> None:
        self.consumers: dict[str, Consumer] = {}
        self.reply_consumer: direct_reply_to.ReplyConsumer | None = None
        self.unacked: dict[int, tuple] = {}
        self.stats = MessageStats()
        self._next_tag = 1
        self.prefetch_count = 0
        self.global_prefetch = 0
        self.global_unacked = 0
        self.flow_active = True

    def delivery_handlers(self) -> dict:
        return {
            commands.Basic.Qos: self._qos,
            commands.Basic.Consume: self._consume,
            commands.Basic.Cancel: self._cancel,
            commands.Basic.Get: self._get,
            commands.Basic.Ack: lambda m: self.basic_ack(m.delivery_tag, m.multiple),
            commands.Basic.Nack: lambda m: self._reject(m.delivery_tag, m.multiple, m.requeue),
            commands.Basic.Reject: lambda m: self._reject(m.delivery_tag, False, m.requeue),
            commands.Basic.Recover: self._recover,
            commands.Basic.RecoverAsync: self._recover,
        }

    def queue_name(self, name: str) -> str:
        """An empty queue name means the channel's most recently declared queue."""
        if name:
            return name
        if not self.most_recent_queue:
            raise AMQPError(NOT_FOUND, "no previously declared queue")
        return self.most_recent_queue

    @property
    def next_delivery_tag(self) -> int:
        return self._next_tag

    # -- the ConsumerChannel port (called by vhosts.Queue) ---------------------

    @property
    def output_blocked(self) -> bool:
        return self.flow_active and self.connection.output_paused

    def can_deliver(self, consumer: Consumer) -> bool:
        if not self.flow_active or self.connection.output_paused:
            return False
        if consumer.no_ack:
            return True
        if consumer.prefetch_count and consumer.unacked >= consumer.prefetch_count:
            return False
        return not (self.global_prefetch and self.global_unacked >= self.global_prefetch)

    def deliver(self, consumer: Consumer, queue, entry) -> None:
        tag = self._next_tag
        self._next_tag = tag + 1
        queue_stats, channel_stats = queue.stats, self.stats
        if consumer.no_ack:
            queue.ack((entry,))
            queue_stats.deliver_no_ack += 1
            channel_stats.deliver_no_ack += 1
        else:
            self.unacked[tag] = (queue, entry, consumer)
            consumer.unacked += 1
            self.global_unacked += 1
            queue_stats.deliver += 1
            channel_stats.deliver += 1
        if entry.redelivered:
            queue_stats.redeliver += 1
            channel_stats.redeliver += 1
        message = entry.message
        if self.vhost.tracing:
            firehose.delivered(self.vhost, firehose.channel_origin(self), queue, message, entry.redelivered)
        connection = self.connection
        connection.send_raw(fastpath.deliver(
            self.number,
            consumer.tag,
            tag,
            entry.redelivered,
            message.exchange,
            message.routing_key,
            message.header if not entry.deliveries else _counted(entry),
            message.body,
            connection.frame_max,
        ))

    def deliver_fresh(self, consumer: Consumer, queue, message) -> None:
        """`message`, just published, handed straight to a no-ack consumer (vhosts.Queue's hand-off):
        no queue entry (nothing to release, never redelivered, never given back). `deliver`'s
        no-ack case without the entry, written out because it is the commonest delivery of all."""
        tag = self._next_tag
        self._next_tag = tag + 1
        queue.stats.deliver_no_ack += 1
        self.stats.deliver_no_ack += 1
        vhost = self.vhost
        if vhost.tracing:
            firehose.delivered(vhost, firehose.channel_origin(self), queue, message, False)
        connection = self.connection
        connection.send_raw(fastpath.deliver(
            self.number, consumer.tag, tag, False, message.exchange, message.routing_key, message.header,
            message.body, connection.frame_max,
        ))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The queue went away (deleted); tell the client if it can hear it."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.connection.client_has("consumer_cancel_notify"):
            self.send_method(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    def dispatch_consumers(self) -> None:
        for queue in {c.queue for c in self.consumers.values()}:
            queue.dispatch()

    # -- basic.qos / consume / cancel / get ----------------------------------

    def _qos(self, method) -> None:
        if method.prefetch_size:
            raise AMQPError(NOT_IMPLEMENTED, "prefetch_size!=0 (%d)" % method.prefetch_size)
        if method.global_:
            self.global_prefetch = method.prefetch_count
            # The owner of another shard's queue sends no more ahead than this limit allows.
            for consumer in self.consumers.values():
                if consumer.queue.remote:
                    consumer.queue.qos(consumer, method.prefetch_count)
        else:  # as in RabbitMQ, for consumers made from now on
            self.prefetch_count = method.prefetch_count
        self.send_method(commands.Basic.QosOk())
        self.dispatch_consumers()

    def _consume(self, method) -> None:
        if method.queue == direct_reply_to.PSEUDO_QUEUE:
            direct_reply_to.consume(self, method, method.consumer_tag or new_consumer_tag())
            return
        # RabbitMQ's order: a reused tag, read permission, then the queue.
        if method.consumer_tag in self.consumers:
            raise AMQPError(NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % method.consumer_tag)
        limit = self.connection.config.consumer_max_per_channel
        if limit is not None and len(self.consumers) >= limit:
            raise AMQPError(NOT_ALLOWED, "reached maximum (%d) of consumers per channel" % limit)
        name = self.queue_name(method.queue)
        self.access.check("queue", name, "read")
        queue = self.vhost.queue(name, self.connection)
        tag = method.consumer_tag or new_consumer_tag()
        arguments = method.arguments or {}
        if self.global_prefetch and queue.kind == QUORUM:
            raise AMQPError(NOT_IMPLEMENTED, "queue '%s' in vhost '%s' does not support global qos" % (
                queue.name, queue.vhost))
        if getattr(queue, "remote", False) and movable(self.connection):
            raise HandOver(queue.shard)  # served where its queue is (amqp_server.amqp.hand_over)
        priority = queue.accept_consumer(method.no_ack, self.prefetch_count, method.exclusive, arguments)
        consumer = Consumer(
            tag, queue, self, method.no_ack, method.exclusive, self.prefetch_count, arguments, priority
        )
        self.consumers[tag] = consumer
        if queue.remote:
            # Another shard's queue: its owner judges exclusivity (both ways), and the answer
            # waits for it; the connection reads nothing meanwhile, so what the client sends
            # next on this channel (a publish into the queue) comes after the consumer exists.
            def answered(_result) -> None:
                if not method.nowait and self.consumers.get(tag) is consumer:  # else its channel closed
                    self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))

            held(self, method, lambda done: queue.add_consumer(consumer, done), answered)
            return
        if not method.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _cancel(self, method) -> None:
        tag = method.consumer_tag
        reply_consumer = self.reply_consumer
        if reply_consumer is not None and reply_consumer.tag == tag:
            direct_reply_to.stop(self)
            consumer = None
        else:
            consumer = self.consumers.get(tag)
        if consumer is not None and consumer.queue.remote:
            # Answered once the owner stopped it, after the no-ack deliveries it sent before
            # (RemoteQueue.cancel_consumer); the consumer is the channel's until then.
            def answered(_result) -> None:
                if self.consumers.get(tag) is consumer:  # else its channel closed meanwhile
                    del self.consumers[tag]
                    if not method.nowait:
                        self.send_method(commands.Basic.CancelOk(consumer_tag=tag))

            held(self, method, lambda done: consumer.queue.cancel_consumer(consumer, done), answered)
            return
        if consumer is not None:
            del self.consumers[tag]
            self._remove_consumer(consumer)
        if not method.nowait:
            self.send_method(commands.Basic.CancelOk(consumer_tag=tag))

    def _remove_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        if queue.remove_consumer(consumer):
            self.vhost.remove_queue(queue)

    def _get(self, method) -> None:
        name = self.queue_name(method.queue)
        self.access.check("queue", name, "read")
        queue = self.vhost.queue(name, self.connection)
        entry = queue.get()
        if entry is None:
            if queue.message_count and not queue.deleted:
                queue.when_available(lambda: self._get_again(method, queue))
                return
            queue.stats.get_empty += 1
            self.stats.get_empty += 1
            self.send_method(commands.Basic.GetEmpty())
            return
        tag = self._next_tag
        self._next_tag = tag + 1
        if method.no_ack:
            queue.ack((entry,))
            queue.stats.get_no_ack += 1
            self.stats.get_no_ack += 1
        else:
            self.unacked[tag] = (queue, entry, None)
            queue.stats.get += 1
            self.stats.get += 1
        if entry.redelivered:
            queue.stats.redeliver += 1
            self.stats.redeliver += 1
        if self.vhost.tracing:
            firehose.delivered(self.vhost, firehose.channel_origin(self), queue, entry.message, entry.redelivered)
        message = entry.message
        self.connection.send_content(
            self.number,
            named_method(commands.Basic.GetOk,
                delivery_tag=tag,
                redelivered=entry.redelivered,
                exchange=message.exchange,
                routing_key=message.routing_key,
                message_count=queue.message_count,
            ),
            message,
            # A quorum queue counts deliveries on basic.get from the first one, as RabbitMQ 3.10.
            _counted(entry) if entry.deliveries or queue.kind == QUORUM else message.header,
        )

    def _get_again(self, method, queue) -> None:
        """A basic.get that waited for messages read back from disk, or for
        another shard's answer (which a closed channel gives back). A channel
        the client closed keeps its state but is no longer its connection's."""
        if self.state == "open" and self.connection.channels.get(self.number) is self:
            try:
                self._get(method)
            except AMQPError as exc:
                self.close_with(exc.at(60, 70))
        elif queue.remote:
            queue.not_wanted()

    # -- settlement ----------------------------------------------------------

    def _take(self, tag: int, multiple: bool) -> list[tuple]:
        """Remove and return, as (tag, queue, entry, consumer), the deliveries a
        (tag, multiple) pair names. RabbitMQ's rules: the tag itself must be
        outstanding, except that multiple with tag 0 means all of them."""
        unacked = self.unacked
        if multiple and tag == 0:
            taken = [(t, *item) for t, item in unacked.items()]
            unacked.clear()
            return taken
        if tag not in unacked:
            raise AMQPError(PRECONDITION_FAILED, "unknown delivery tag %d" % tag)
        if not multiple:
            return [(tag, *unacked.pop(tag))]
        tags = []
        for t in unacked:
            if t > tag:
                break
            tags.append(t)
        return [(t, *unacked.pop(t)) for t in tags]

    def basic_ack(self, tag: int, multiple: bool) -> None:
        settled = self._take(tag, multiple)
        if not self.defer_settlement(settled, ACK):
            self.settle(settled, ACK)

    def _reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        settled = self._take(tag, multiple)
        for queue in {item[1] for item in settled}:
            queue.check_return()  # a stream refuses (and the connection closes)
        outcome = REQUEUE if requeue else DISCARD
        if not self.defer_settlement(settled, outcome):
            self.settle(settled, outcome)

    def settle(self, settled: list[tuple], outcome: str) -> None:
        if outcome is not REQUEUE:
            # What the client sees next must not precede these acks' records.
            self.connection.acks_handled = True
        by_queue: dict = {}
        freed = False
        for _tag, queue, entry, consumer in settled:
            by_queue.setdefault(queue, []).append(entry)
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
                freed = True
        for queue, entries in by_queue.items():
            if outcome is REQUEUE:
                queue.requeue(entries)
            elif outcome is DISCARD:
                queue.reject(entries)
            else:
                if outcome is ACK:
                    queue.stats.ack += len(entries)
                    self.stats.ack += len(entries)
                queue.ack(entries)
        if freed:
            self.dispatch_consumers()

    def restore_unacked(self, deferred: list[tuple]) -> None:
        """tx.rollback: settlements not committed become outstanding again."""
        if not deferred:
            return
        restored = dict(self.unacked)
        for _kind, settled, _outcome in deferred:
            for tag, queue, entry, consumer in settled:
                restored[tag] = (queue, entry, consumer)
        self.unacked = dict(sorted(restored.items()))

    def _recover(self, method) -> None:
        if not method.requeue:
            raise AMQPError(NOT_IMPLEMENTED, "requeue=false")
        self.settle(self._take(0, True), REQUEUE)
        if isinstance(method, commands.Basic.Recover):
            self.send_method(commands.Basic.RecoverOk())

    def release(self) -> None:
        """Channel closing: cancel every consumer, requeue everything unacked,
        then dispatch (as RabbitMQ: a single active consumer's successor gets
        the requeued messages first, in their order)."""
        self.flow_active = False
        if self.reply_consumer is not None:
            direct_reply_to.stop(self)
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self._remove_consumer(consumer)
        if self.unacked:
            self.settle(self._take(0, True), REQUEUE)
        for queue in {c.queue for c in consumers}:
            queue.dispatch()
