"""Moving a connection to the shard its traffic is for (docs/scaling.md).

On a node of several shards a connection lands on whichever shard the
kernel chose. When its first consumer is for a queue another shard owns, and
the connection holds nothing else yet, the connection moves there instead of
having every delivery hop: its socket (the descriptor, passed by the node:
amqp_server.shards.moves) and its state travel to the owner, which serves it
from the consume on, and this shard forgets it.

Invariants:
- Only a plain connection with nothing in flight moves: running, not TLS
  (the TLS session is this process's), one channel, no consumer, no
  unacknowledged delivery, no exclusive queue, no reply consumer, no
  transaction, no confirm or publish waiting, nothing held (credit flow, an
  alarm), and its output written out to the socket. Otherwise it stays and
  is served across shards.
- The client notices nothing: this shard reads no more once it decided, the
  bytes it had read from the frame that decided on are handed over with the
  state, and the owner parses them first, then reads the socket.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amqp_server.amqp.connection import Connection


# Publishes in a row for one other shard's queues after which a publishing connection moves there.
MOVE_AFTER = 64
# Times a publisher in confirm mode stops reading until its confirms are out, to move.
DRAINS = 3


class HandOver(Exception):
    """Raised by a handler: move the connection to `shard`, the method that
    raised included (it is parsed again there). `drain`: not yet, its
    channel's confirms are still out; read nothing more until they are,
    then parse that method again (and move then)."""

    def __init__(self, shard: int, drain: bool = False) -> None:
        super().__init__(shard)
        self.shard = shard
        self.drain = drain


def movable(connection: "Connection", confirms_out: bool = False) -> bool:
    """Nothing in flight (`confirms_out`: but its channel's unconfirmed publishes)."""
    io = connection.io
    if connection.broker.shards is None or not connection.config.shard_moves or connection.state != "running" \
            or len(connection.channels) != 1:
        return False
    if connection.exclusive_queues or connection.blocked_by or connection.acks_handled or io.records_held:
        return False
    transport = io.transport
    if transport is None or transport.get_extra_info("sslcontext") is not None:
        return False
    channel = next(iter(connection.channels.values()))
    return channel.holds_nothing(confirms_out)


def state_of(connection: "Connection") -> dict:
    """What the owner needs to go on serving the connection."""
    (number, channel), = connection.channels.items()
    return {
        "user": connection.user.name,
        "vhost": connection.vhost.name,
        "client_properties": connection.client_properties,
        "auth_mechanism": connection.auth_mechanism,
        "frame_max": connection.frame_max,
        "channel_max": connection.channel_max,
        "heartbeat": connection.heartbeat,
        "connected_at": connection.connected_at,
        "counters": (connection.recv_oct, connection.recv_cnt, connection.send_oct, connection.send_cnt),
        "channel": (number, channel.state_to_move()),
    }
