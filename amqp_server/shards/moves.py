"""Client connections moving between shards (amqp_server.amqp.hand_over,
docs/scaling.md): `hand_over` passes a connection's socket (its descriptor,
on the moves socket beside the peer's link socket: asyncio's transports
cannot carry one) and its state to the owner, then a ("moved", id) record on
its link, behind every publish the connection sent across; the owner serves
the connection once both halves came (`_arrived`), or drops a half whose
other never comes (`_forget`). Before a move on a node of more than two
shards, `ping_others` makes one round trip on the link to every third shard,
so that each has handled what the connection sent it from here. The state
travels encoded as records are (amqp_server.shards.codec) and is checked
(`_MOVE`) before the connection is served.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import struct

from amqp_server.shards.codec import keeping_byte_arrays, pack, unpack
from amqp_server.shards.records import Kinds

log = logging.getLogger("hutch.shards")

# A moving connection's socket: the suffix of a shard's socket for them, and seconds to pass it.
MOVES = ".moves"
MOVE_TIMEOUT = 2.0
# Seconds one half of a move waits for the other (Moves._arriving): the "moved" record comes
# behind what the link carried before it, which a busy owner may take a while to read.
ARRIVAL_TIMEOUT = 30.0
_LENGTH = struct.Struct(">I")
# What comes with a moving connection's socket (amqp_server.amqp.hand_over.state_of: its state).
_MOVE = Kinds("move", {"move": {"mover": int, "move": tuple, "state": dict, "pending": bytes}})


class Moves:
    """Connections moving here and away (a part of ShardNode: amqp_server.shards.node)."""

    def __init__(self) -> None:
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

    def _listen_for_moves(self) -> None:
        # Client sockets moving here come on a socket of their own: a descriptor travels in a
        # message's ancillary data, which asyncio's transports cannot carry.
        self._moves = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        moves = self.shard.socket(self.here) + MOVES
        try:
            os.unlink(moves)
        except FileNotFoundError:
            pass
        self._moves.bind(moves)
        self._moves.listen(64)
        self._moves.setblocking(False)
        asyncio.get_running_loop().add_reader(self._moves.fileno(), self._moved_here)

    def _stop_moves(self) -> None:
        if self._moves is not None:
            asyncio.get_running_loop().remove_reader(self._moves.fileno())
            self._moves.close()

    def _moves_lost(self, mover: int) -> None:
        """The link to `mover`, which its "moved" records come on, is lost: its
        moves here cannot complete (a record lost with the link never comes)."""
        for move in [move for move in self._arriving if move[0] == mover]:
            self._forget(move)

    def hand_over(self, shard: int, fd: int, state: dict, pending: bytes) -> bool:
        """Send a client's socket and its connection's state to `shard`
        (the socket is duplicated into the message); False if it cannot go."""
        link = self.peers.get(shard)
        if link is None:
            return False
        move_id = (os.getpid(), next(self._move_ids))  # unique also across the mover's restarts
        try:
            # TypeError: a value no shard carries. Its client properties are a field table.
            data = pack(keeping_byte_arrays(("move", self.here, move_id, state, pending)))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as move:
                move.settimeout(MOVE_TIMEOUT)
                move.connect(self.shard.socket(shard) + MOVES)
                socket.send_fds(move, [_LENGTH.pack(len(data))], [fd])
                move.sendall(data)
        except (OSError, TypeError) as exc:
            log.warning("shard %d: a connection could not move to shard %d: %s", self.here, shard, exc)
            return False
        link.send(("moved", move_id))
        return True

    def others_than(self, shard: int) -> list[int]:
        """The shards but this one and `shard`."""
        return [peer for peer in range(self.shard.count) if peer not in (self.here, shard)]

    def ping_others(self, shard: int, done) -> None:
        """done() once every shard but this one and `shard` answered a ping:
        each then handled every record this shard sent it before (a
        connection moving to `shard` sends them more on other links)."""
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
                arrived = unpack(data)
                fault = _MOVE.fault(arrived)
                if fault is not None:
                    raise ValueError(fault)
                _kind, mover, move_id, state, pending = arrived
        except (OSError, ValueError, struct.error) as exc:
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
