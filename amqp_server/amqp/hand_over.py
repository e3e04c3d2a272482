"""Moving a connection to the shard its traffic is for (docs/scaling.md).

On a node of several shards a connection lands on whichever shard the
kernel chose. When its first consumer is for a queue another shard owns, and
the connection holds nothing else yet, the connection moves there instead of
having every delivery hop: its socket (the descriptor, passed by the node:
amqp_server.shards.moves) and its state travel to the owner, which serves it
from the consume on, and this shard forgets it. Here is what decides a move
(`movable`, `count_bound`), the move (`hand_over`, after `drain_then_move`
for a publisher's confirms), and the state that travels (`state_of`, and
`moved_in` on the owner, whose Connection.adopt serves it).

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

import logging
from typing import TYPE_CHECKING

from amqp_server.shared.client import CLOSED

if TYPE_CHECKING:
    from amqp_server.amqp.channel import Channel
    from amqp_server.amqp.connection import Connection

log = logging.getLogger("hutch.connection")  # its lines are the connection's


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
    """May move now: nothing in flight (`confirms_out`: but its channel's
    unconfirmed publishes, once they are out; it waits for them at most
    DRAINS times, as credit flow may hold it when they are)."""
    if connection.staying or (confirms_out and connection.drains >= DRAINS):
        return False
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
    return _holds_nothing(channel, confirms_out)


def _holds_nothing(channel: "Channel", confirms_out: bool) -> bool:
    """No consumer, delivery, transaction, confirm or publish in flight
    (`confirms_out`: but unconfirmed publishes)."""
    return not (channel.consumers or channel.unacked or channel.reply_consumer is not None or channel._tx is not None
                or channel._publish is not None
                or (not confirms_out and (channel._awaiting or channel.unconfirmed)))


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
        "channel": (number, {"confirm": channel.confirm, "publish_seq": channel._publish_seq,
                             "confirm_from": channel._confirm_from, "prefetch_count": channel.prefetch_count,
                             "global_prefetch": channel.global_prefetch, "next_tag": channel._next_tag,
                             "most_recent_queue": channel.most_recent_queue, "flow_active": channel.flow_active}),
    }


def moved_in(channel: "Channel", state: dict) -> None:
    """Go on where the channel was on the shard it moved from (`state_of`)."""
    channel.confirm = state["confirm"]
    channel._publish_seq = state["publish_seq"]
    channel._confirm_from = state["confirm_from"]
    channel.prefetch_count = state["prefetch_count"]
    channel.global_prefetch = state["global_prefetch"]
    channel._next_tag = state["next_tag"]
    channel.most_recent_queue = state["most_recent_queue"]
    channel.flow_active = state["flow_active"]


def count_bound(channel: "Channel", here: int) -> None:
    """How many publishes in a row went only to queues of one other shard
    (a connection moves there after MOVE_AFTER)."""
    owner = None
    for queue in channel.vhost.last_targets:  # on every publish while the connection may move: stop early
        shard = queue.shard if queue.remote else here
        if shard == here or (owner is not None and shard != owner):
            owner = here
            break
        owner = shard
    if owner is None or owner == here:
        channel._bound_count = 0
    elif owner == channel._bound_for:
        channel._bound_count += 1
    else:
        channel._bound_for, channel._bound_count = owner, 1


def hand_over(connection: "Connection", shard: int, start: int) -> None:
    """Move to `shard` from the frame at `start` of the read buffer on;
    if the socket cannot go now, stay and serve that frame here."""
    io = connection.io
    shards = connection.broker.shards
    # Not one byte more is read here: the event loop may read again in this very turn,
    # and what it read would be lost to the shard that takes over.
    io.pause_reading()
    if not connection.others_pinged and shards.others_than(shard):
        # Publishes it sent a third shard may still be on their way there, and once moved
        # it sends that shard more on another link: one round trip on each such link first,
        # then the deciding frame is parsed again (and moves). The shard it moves to orders
        # its own (ShardNode.hand_over: amqp_server.shards.moves).
        connection.others_pinged = True
        shards.ping_others(shard, lambda: io.call_soon(connection._continue))
        return
    io.flush_now()
    pending = connection.reader.pending(start)
    if io.transport.get_write_buffer_size() or not shards.hand_over(
            shard, io.transport.get_extra_info("socket").fileno(), state_of(connection), pending):
        connection.staying = True
        connection.counts_publishes = False
        log.debug("the connection from %s stays: it cannot move to shard %d now", connection.peer, shard)
        io.call_soon(connection._continue)
        return
    log.debug("the connection from %s moves to shard %d with %d bytes read", connection.peer, shard, len(pending))
    connection.reader.consume(connection.reader.buffered)
    connection.broker.connection_closed(connection)
    connection.channels.clear()  # nothing in them: see movable
    connection.state = CLOSED
    connection._timer.cancel()
    io.forget()


def drain_then_move(connection: "Connection") -> None:
    """Read nothing until the channel's confirms are all out, then parse
    the deciding publish again: it moves the connection then (once)."""
    connection.drains += 1
    connection.io.pause_reading()
    (channel,) = connection.channels.values()
    channel.on_drained = connection._continue
    channel.flush_confirms()
