"""10,000 messages with TTLs in random order on a real broker: they all
expire (most of them from disk: a queue keeps at most 2,048 messages in RAM)
without a timer each, and the broker's memory stays flat while they do
(generous RSS bounds, no timing assertions). The one timer per queue itself
is shown in-process (test_queue_semantics_unit.py).
"""
from __future__ import annotations

import random

import aio_pika
import pytest

from test_ttl_limits import count, until

N = 10_000  # 5 times what a queue keeps in RAM: most of them (~8,000) expire from disk


def rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


@pytest.mark.timeout(300)
async def test_10k_messages_with_random_ttls_expire_and_memory_comes_back(fresh_broker):
    """Three rounds of 10,000: RSS reaches its high-water mark (allocator
    pools, buffers of what is read back from disk to expire) within two
    rounds, and the third adds nothing: the memory comes back for reuse."""
    pid = fresh_broker.process.pid
    connection = await aio_pika.connect(fresh_broker.url)
    channel = await connection.channel(publisher_confirms=False)
    await channel.declare_queue("ttls")
    rng = random.Random(5)
    # 2,000 distinct TTLs, unordered; the shortest outlives a round's publishing (about a second)
    ttls = [2000 + rng.randrange(2000) for _ in range(N)]
    baseline = rss(pid)
    rounds = []
    for _ in range(3):
        for start in range(0, N, 1000):
            for ttl in ttls[start:start + 1000]:
                await channel.default_exchange.publish(aio_pika.Message(b"m", expiration=ttl / 1000),
                                                       routing_key="ttls")
            await count(channel, "ttls")  # a round trip per thousand: the broker keeps up
        loaded = rss(pid)
        assert await count(channel, "ttls") > 0
        cpu_before = cpu_seconds(pid)
        await until(lambda: _empty(channel), timeout=60)
        rounds.append((loaded, rss(pid), cpu_seconds(pid) - cpu_before))
    for loaded, after, cpu in rounds:
        print("RSS baseline %.1f MB, loaded %.1f MB, after expiry %.1f MB; CPU while expiring %.2f s" % (
            baseline / 2**20, loaded / 2**20, after / 2**20, cpu))
    assert rounds[0][0] - baseline < 200 * 2**20  # ~ a few hundred bytes per message, not a timer each
    # the messages are gone and the third round did not grow on the second
    assert rounds[2][1] <= rounds[1][1] + 6 * 2**20
    await connection.close()


async def _empty(channel) -> bool:
    return await count(channel, "ttls") == 0
