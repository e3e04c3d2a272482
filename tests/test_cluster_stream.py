"""The stream protocol in a cluster (tests/cluster_kit.py): a follower
forwards its stream port to the leader, whose metadata names the leader's
own address and the in-sync followers' as replicas, so a stream client that
reached a follower publishes and reads on the leader; what was confirmed, and a stored offset, survive the
leader's SIGKILL and are read from the new leader."""
from __future__ import annotations

import asyncio
import struct

import pytest

from cluster_kit import leader_of, new_leader, running, until
from helpers import unique
from stream_raw import StreamRaw
from stream_scenarios import FIRST_SPEC, consumer, create, publish, read

pytestmark = pytest.mark.timeout(150)


def metadata(port: int, stream: str) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    """The (host, port) a node's metadata names for `stream`'s leader, and
    those of its replicas."""
    with StreamRaw(port) as client:
        assert client.open() == 1
        client.request(0x0F, struct.pack(">i", 1), struct.pack(">H", len(stream)) + stream.encode())
        rest = client.read_key(0x800F)
    brokers = {}
    (count,), pos = struct.unpack_from(">i", rest, 4), 8  # after the correlation id
    for _ in range(count):
        reference, length = struct.unpack_from(">HH", rest, pos)
        host = rest[pos + 4:pos + 4 + length].decode()
        brokers[reference] = (host, struct.unpack_from(">I", rest, pos + 4 + length)[0])
        pos += 8 + length
    (length,) = struct.unpack_from(">H", rest, pos + 4)  # one entry: its name, code, leader, replicas
    code, leader, replicas = struct.unpack_from(">HHi", rest, pos + 6 + length)
    assert code == 1
    references = struct.unpack_from(">%dH" % replicas, rest, pos + 14 + length)
    return brokers[leader], [brokers[r] for r in references]


def test_a_follower_forwards_and_a_failover_keeps_what_was_confirmed(tmp_path):
    with running(tmp_path, 2) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        (follower,) = [n for n in nodes if n is not leader]
        stream = unique("cs")
        port = follower.ports["stream"]
        assert asyncio.run(create(port, stream)) == "ok"
        # Through the follower, metadata names the leader itself, and the follower as a replica once
        # it is in sync (rstream then reads from it below: the follower forwards to the leader).
        until(lambda: metadata(port, stream) == (("127.0.0.1", leader.ports["stream"]),
                                                 [("127.0.0.1", follower.ports["stream"])]),
              60, "metadata naming the leader and the in-sync follower")
        bodies = [b"c%d" % i for i in range(50)]
        assert asyncio.run(publish(port, stream, bodies)) == list(range(1, 51))
        assert [b for _o, b in asyncio.run(read(port, stream, FIRST_SPEC, 50))] == bodies
        # A stored offset reaches the follower with the stream's tracking snapshot (within a second).
        asyncio.run(store_offset(port, stream, "reader-1", 41))
        until(lambda: any("reader-1" in p.read_text() for p in follower.data_dir.rglob("tracking.json")), 30,
              "the tracking snapshot on the follower")
        leader.kill()
        elected = new_leader(etcd, nodes, leader)
        got = asyncio.run(read(elected.ports["stream"], stream, FIRST_SPEC, 50))
        assert [b for _o, b in got] == bodies
        assert asyncio.run(query_offset(elected.ports["stream"], stream, "reader-1")) == 41


async def store_offset(port: int, stream: str, reference: str, offset: int) -> None:
    c = consumer(port)
    await c.start()
    try:
        await c.store_offset(stream, reference, offset)
    finally:
        await c.close()


async def query_offset(port: int, stream: str, reference: str) -> int:
    c = consumer(port)
    await c.start()
    try:
        return await c.query_offset(stream, reference)
    finally:
        await c.close()
