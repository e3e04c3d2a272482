"""The replication connection's framing, shared by the leader's and the
follower's ends: records as in storage.replica (u32 length, u8 kind), the
file records (kinds < 16) and the protocol's own messages as JSON.

A connection starts with the handshake (amqp_server.cluster.handshake:
CHALLENGE, HELLO, WELCOME or REFUSED); a replication connection then
carries LISTING {files} (follower -> leader, its listing), SNAPSHOT_END
{position, term} (leader -> follower: the stream position P the snapshot
stands for; the records after it count from P), ACK {position} (follower ->
leader: applied and synced up to there) and HEARTBEAT {term} (both ways,
so that each end notices a silent one: amqp_server.cluster.replication).
"""
from __future__ import annotations

import json

from storage.replica import HEAD

HELLO, SNAPSHOT_END, ACK, CHALLENGE, WELCOME, REFUSED, LISTING, HEARTBEAT = range(16, 24)
MAX_CONTROL = 64 * 1024 * 1024  # a listing of a large data directory fits


def control(kind: int, value: dict) -> bytes:
    body = json.dumps(value).encode()
    return HEAD.pack(len(body), kind) + body


class Frames:
    """Splits a byte stream into (kind, payload) records."""

    def __init__(self, limit: int) -> None:
        self.buffer = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[tuple[int, memoryview, int]]:
        """Complete records so far: (kind, payload, size of the whole record)."""
        self.buffer += data
        out = []
        start = 0
        view = memoryview(self.buffer)
        while len(self.buffer) - start >= HEAD.size:
            size, kind = HEAD.unpack_from(self.buffer, start)
            if size > self.limit:
                raise ValueError("record of %d bytes: more than %d" % (size, self.limit))
            end = start + HEAD.size + size
            if end > len(self.buffer):
                break
            out.append((kind, bytes(view[start + HEAD.size:end]), end - start))
            start = end
        view.release()
        del self.buffer[:start]
        return out
