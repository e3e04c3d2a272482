"""Direct reply-to: RabbitMQ's `amq.rabbitmq.reply-to` pseudo-queue, as 3.10 serves it.

Theory of operation:
- A channel subscribes to the pseudo-queue with basic.consume, in no-ack mode
  only. No queue exists: the channel holds one `ReplyConsumer` (its consumer
  tag and a token `amq.rabbitmq.reply-to.<opaque>`), and its vhost's
  `reply_consumers` maps the token to the consumer's `deliver`, a callback,
  so vhosts never import this module.
- Invariant: a token is in `reply_consumers` exactly while its channel holds
  the consumer; basic.cancel and the channel's release (close, connection
  close) remove it, and a later consume gets a new token. A reply to a dead
  token is dropped (RabbitMQ's behaviour: nothing tells the replier).
- A publish whose reply_to is exactly `amq.rabbitmq.reply-to` has it rewritten
  to the channel's token (`rewritten`), or is refused with 406 when the
  channel has no reply consumer. Only that property's bytes change.
- A publish to the default exchange whose routing key (or a CC key) is a live
  token is handed to the token's channel at once (vhosts.VirtualHost.publish).
  As in RabbitMQ 3.10 this does not count as routed: a mandatory reply is
  also returned (312 NO_ROUTE), and a confirm comes at once.
- Deliveries carry the channel's next delivery tag without taking it (RabbitMQ
  gives every reply that same tag; there is nothing to ack), redelivered
  false, exchange "" and the reply's first routing key.
- The consumer tag lives beside the channel's queue consumers, not among them:
  a queue consumer may later take the same tag, and basic.cancel of that tag
  cancels the reply consumer first (RabbitMQ keeps them apart the same way).
"""
from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.amqp import fastpath
from storage.message import reply_to, with_reply_to
from vhosts.errors import NOT_ALLOWED, PRECONDITION_FAILED, AMQPError
from vhosts.reply_to import PSEUDO_QUEUE, TOKEN_PREFIX, no_consumer, shard_mark

if TYPE_CHECKING:
    from amqp_server.amqp.channel import Channel
    from storage import Message

_PSEUDO_QUEUE = PSEUDO_QUEUE.encode("ascii")
# The property as a shortstr on the wire: a header without these bytes
# cannot ask for direct reply-to, so most never have reply_to located.
_ON_THE_WIRE = bytes((len(_PSEUDO_QUEUE),)) + _PSEUDO_QUEUE


class ReplyConsumer:
    __slots__ = ("channel", "tag", "token", "_token_bytes")

    def __init__(self, channel: "Channel", tag: str) -> None:
        self.channel = channel
        self.tag = tag
        # RabbitMQ's shape, <who>.<key> in base64. Both parts are random here:
        # the vhost finds the channel by the whole token, which no one can guess.
        # On a node of several shards the first character names this one (vhosts.reply_to).
        shards = channel.connection.broker.shards
        who = _b64(18)
        if shards is not None:
            who = shard_mark(shards.here) + who[1:]
        self.token = TOKEN_PREFIX + "%s.%s" % (who, _b64(16))
        self._token_bytes = self.token.encode("ascii")

    def deliver(self, message: "Message") -> None:
        """A reply published to our token (called by the vhost)."""
        channel = self.channel
        connection = channel.connection
        connection.send_raw(fastpath.deliver(
            channel.number, self.tag, channel.next_delivery_tag, False, "", message.routing_key,
            message.header, message.body, connection.frame_max,
        ))


def _b64(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode("ascii")


def consume(channel: "Channel", method, tag: str) -> None:
    """basic.consume of the pseudo-queue, RabbitMQ's checks in its order
    (`tag` is the method's, or a generated one when that is empty)."""
    if method.consumer_tag in channel.consumers:
        raise AMQPError(NOT_ALLOWED, "attempt to reuse consumer tag '%s'" % method.consumer_tag)
    if not method.no_ack:
        raise AMQPError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
    if channel.reply_consumer is not None:
        raise AMQPError(PRECONDITION_FAILED, "reply consumer already set")
    consumer = ReplyConsumer(channel, tag)
    channel.reply_consumer = consumer
    channel.vhost.reply_consumers[consumer.token] = consumer.deliver
    if not method.nowait:
        channel.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))


def stop(channel: "Channel") -> None:
    """The channel's reply consumer goes (cancel, close): its token dies."""
    consumer = channel.reply_consumer
    channel.reply_consumer = None
    channel.vhost.reply_consumers.pop(consumer.token, None)


def rewritten(header: bytes, consumer: ReplyConsumer | None) -> bytes:
    """A published content header whose reply_to flag is set: with reply_to
    `amq.rabbitmq.reply-to` replaced by the channel's token; as it is for
    any other reply_to."""
    if _ON_THE_WIRE not in header or reply_to(header) != _PSEUDO_QUEUE:
        return header
    if consumer is None:
        raise no_consumer()
    return with_reply_to(header, consumer._token_bytes)
