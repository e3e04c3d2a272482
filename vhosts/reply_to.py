"""Direct reply-to's names and rules that every face knows (the AMQP
channel serves the pseudo-queue: amqp_server.amqp.direct_reply_to; the
management API's publish refuses to ask for it)."""
from __future__ import annotations

from vhosts.errors import PRECONDITION_FAILED, AMQPError

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
TOKEN_PREFIX = PSEUDO_QUEUE + "."


# On a node of several shards a token's first character after the prefix
# names the shard of its channel (this alphabet's index: up to 64 shards), so
# a reply published on any shard finds it.
_SHARD_MARKS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def shard_mark(shard: int) -> str:
    return _SHARD_MARKS[shard]


def shard_of(token: str) -> int | None:
    """The shard whose channel holds `token`, or None for no token."""
    if not token.startswith(TOKEN_PREFIX) or len(token) == len(TOKEN_PREFIX):
        return None
    return _SHARD_MARKS.find(token[len(TOKEN_PREFIX)])


def no_consumer() -> AMQPError:
    """A publish asking for a direct reply on a channel without a reply
    consumer (the management API's publish never has one)."""
    return AMQPError(PRECONDITION_FAILED, "fast reply consumer does not exist")


def declared(vhost, name: str) -> bool:
    """queue.declare of a name starting `amq.rabbitmq.reply-to` (passive or
    not, as RabbitMQ): the pseudo-queue and live tokens of this shard exist
    (`elsewhere` says whether a token is another shard's to answer)."""
    return name == PSEUDO_QUEUE or name in vhost.reply_consumers


def elsewhere(vhost, name: str) -> bool:
    """On a node of several shards: `name` is a token of a channel on another shard."""
    if vhost.shards is None:
        return False
    shard = shard_of(name)
    return shard is not None and shard >= 0 and shard != vhost.shards.here
