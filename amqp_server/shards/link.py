"""A link between two shards of a node: a Unix socket in the node's private
link directory (amqp_server.process.shards). Every shard opens one to every
other (so two per pair, one each way); which one carries what is
amqp_server.shards.node's rule.

Framing: a 4-byte big-endian length, then a pickled list of records. What a
shard sends in one loop turn leaves as one frame (`send` queues, the end of
the turn flushes), so a burst of publishes to another shard costs one
write and one pickle, not one per message. Pickle is safe here because only
this node's own processes can reach the directory (mode 0700, same user);
a frame that does not decode closes the link, never the shard.

Records are tuples whose first item names them (amqp_server.shards.node).
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import struct

log = logging.getLogger("hutch.shards")

_LENGTH = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024


class Link(asyncio.Protocol):
    """One end of a link; `handler(link, record)` gets every record."""

    def __init__(self, handler, on_lost) -> None:
        self.handler = handler
        self.on_lost = on_lost
        self.peer: int | None = None  # the other shard's index, once it said HELLO
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: list = []
        self._flush_armed = False
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.on_lost(self)

    def send(self, record: tuple) -> None:
        if self.closed:
            return
        self._pending.append(record)
        if not self._flush_armed:
            self._flush_armed = True
            asyncio.get_running_loop().call_soon(self._flush)

    def queued_last(self) -> tuple | None:
        """The record `send` queued last, while it has not left (it leaves
        at the end of the loop turn); else None."""
        return self._pending[-1] if self._pending else None

    def _flush(self) -> None:
        self._flush_armed = False
        records, self._pending = self._pending, []
        if records and not self.closed:
            data = pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
            self.transport.write(_LENGTH.pack(len(data)) + data)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            (length,) = _LENGTH.unpack_from(buffer)
            if length > MAX_FRAME:
                log.error("shard link from %s: a frame of %d bytes; closing the link", self.peer, length)
                self.close()
                return
            if len(buffer) < 4 + length:
                return
            try:
                records = pickle.loads(buffer[4:4 + length])
            except Exception:
                log.exception("shard link from %s: an undecodable frame; closing the link", self.peer)
                self.close()
                return
            del buffer[:4 + length]
            for record in records:
                try:
                    self.handler(self, record)
                except Exception:
                    log.exception("shard link from %s: failed to handle %r", self.peer, record[0])

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
