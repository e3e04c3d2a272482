"""A link between two shards of a node: a Unix socket in the node's private
link directory (amqp_server.process.shards). There is one per pair of
shards, which carries everything between them both ways; who opens it
is amqp_server.shards.mesh's rule.

Framing: a 4-byte big-endian length, then a msgpack list of records. Only
this node's processes reach the directory (mode 0700), yet a frame is read
as data only (amqp_server.shards.codec: no class or function a frame could
name), so the same records may cross nodes (docs/scaling.md). What a shard
sends in one loop turn leaves in one write (`send` queues, the end of the
turn flushes), cut into frames of about FRAME_TARGET bytes each, so a burst
of small publishes costs one encoding, and a burst of large ones (a
consumer's prefetch of 1 MiB messages) never makes a frame the reader must
refuse: only a single record larger than FRAME_TARGET makes a larger frame,
and no record is larger than MAX_FRAME (a message is at most 512 MiB). A
frame that does not decode, or is not a list, closes the link, never the
shard; each record is checked against its kind's fields where it is
handled (Mesh.received, amqp_server.shards.records). A record that cannot
be encoded is logged and dropped, not the others of its frame.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time

from amqp_server.shards.codec import keeping_byte_arrays, pack, unpack
from amqp_server.shards.records import TABLES

log = logging.getLogger("hutch.shards")

_LENGTH = struct.Struct(">I")
# A frame holds records up to about this many bytes of bodies (`_weight`).
FRAME_TARGET = 1024 * 1024
# The reader's bound: above the largest record (max_message_size's upper limit, 512 MiB, and
# its header), below what the 4-byte length can say.
MAX_FRAME = 1024 * 1024 * 1024
# Where the bytes of a record kind that carries a message are (amqp_server.shards.records).
_BODY_AT = {"pub": 6, "deliver": 8, "got": 5, "reply": 3}
# What every record weighs besides its body: so many small records make a frame of their own too.
_RECORD_WEIGHT = 64
# Bytes a link may hold unsent before it is full (`on_full`), and below which it is not again:
# credit flow between shards, so a peer that reads slowly slows what sends to it.
FULL_ABOVE = 8 * 1024 * 1024
FULL_BELOW = 2 * 1024 * 1024


def decode(frame) -> list:
    """The records of one frame (bytes, or a view of them); ValueError when
    it does not decode, or is not a list."""
    records = unpack(frame)
    if type(records) is not list:
        raise ValueError("a frame is not a list of records")
    return records


def encode(records: list) -> bytes:
    """One frame of `records` (tuples: each goes as a list, which is what it decodes to)."""
    lists = [list(keeping_byte_arrays(record)) if record[0] in TABLES else list(record) for record in records]
    try:
        return pack(lists)
    except (TypeError, ValueError):  # a value no link carries: that record alone is dropped
        kept = []
        for record in lists:
            try:
                pack(record)
            except (TypeError, ValueError) as exc:
                log.error("shard link: a %s record cannot be sent: %s", _kind(record), exc)
            else:
                kept.append(record)
        return pack(kept)


def _weight(record: tuple) -> int:
    """About the bytes `record` adds to a frame: its message's, if it carries one."""
    at = _BODY_AT.get(record[0])
    body = record[at] if at is not None else None
    return _RECORD_WEIGHT + (len(body) if body is not None else 0)


def _kind(record) -> str:
    """A record's name for a log line, whatever the record is."""
    return repr(record[0] if type(record) in (list, tuple) and record else record)[:80]


class Link(asyncio.Protocol):
    """One end of a link; `handler(link, record)` gets every record, and
    `on_full(link)` hears when `full` changes: more than FULL_ABOVE bytes
    wait to leave (the peer reads slowly, or not at all), until they are
    below FULL_BELOW."""

    def __init__(self, handler, on_lost, on_full, promising=None) -> None:
        self.handler = handler
        self.on_lost = on_lost
        self.on_full = on_full
        # In a cluster, whether this shard's leader lease holds (amqp_server.cluster.lease): past
        # it nothing leaves, heartbeats included, as nothing leaves for clients
        # (amqp_server.shared.client's fencing), so the peers take the link for lost and link to
        # the group's new leader instead of hearing two (`wake` once the lease holds again).
        self.promising = promising
        self.full = False
        self.peer: int | None = None  # the other shard's index, once it said HELLO
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: list = []
        self._flush_armed = False
        self.closed = False
        self.heard = 0.0  # time.monotonic() of the last bytes read (a cluster's heartbeats: ShardNode._beat)

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.heard = time.monotonic()
        transport.set_write_buffer_limits(high=FULL_ABOVE, low=FULL_BELOW)

    def pause_writing(self) -> None:
        self.full = True
        self.on_full(self)

    def resume_writing(self) -> None:
        self.full = False
        self.on_full(self)

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

    def wake(self) -> None:
        """The lease holds again: what waited leaves."""
        if self._pending and not self._flush_armed:
            self._flush_armed = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_armed = False
        if self.promising is not None and not self.promising():
            return  # held (see __init__)
        records, self._pending = self._pending, []
        if not records or self.closed:
            return
        frames = []
        start = weight = 0
        for end, record in enumerate(records, 1):
            weight += _weight(record)
            if weight >= FRAME_TARGET:
                frames.append(records[start:end])
                start, weight = end, 0
        if start < len(records):
            frames.append(records[start:] if start else records)
        out = []
        for frame in frames:
            data = encode(frame)
            out.append(_LENGTH.pack(len(data)))
            out.append(data)
        self.transport.writelines(out)

    def data_received(self, data: bytes) -> None:
        self.heard = time.monotonic()
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
                with memoryview(buffer)[4:4 + length] as frame:  # released before the buffer is cut
                    records = decode(frame)
            except Exception:
                log.exception("shard link from %s: an undecodable frame; closing the link", self.peer)
                self.close()
                return
            del buffer[:4 + length]
            for record in records:
                try:
                    self.handler(self, record)
                except Exception:
                    log.exception("shard link from %s: failed to handle %s", self.peer, _kind(record))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is unsent: the peer is gone (no flush could finish)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
