"""At-least-once dead-lettering across kill -9 (beyond RabbitMQ 3.10, whose
classic queues dead-letter at most once): a persistent message rejected in a
durable queue leaves it only after the durable dead-letter queue has it on
disk, so killing the broker at any moment may duplicate messages, never lose
one. The kill moment is random; its seed is printed and reused with
HUTCH_CRASH_SEED=N.
"""
from __future__ import annotations

import asyncio
import os
import random

import aio_pika
import pytest

from conftest import launch
from test_ttl_limits import count

N = 3000


def body(i: int) -> bytes:
    # every tenth one is large enough for the message store, the others sit in the queue index
    return b"%d|" % i + (b"x" * (5000 if i % 10 == 0 else 20))


async def reject_until(queue, stop_after: int) -> int:
    """Consume `queue`, nacking every message without requeue, until
    `stop_after` were nacked (more may be in flight); returns how many."""
    nacked = 0
    done = asyncio.Event()

    async def on_message(message) -> None:
        nonlocal nacked
        await message.nack(requeue=False)
        nacked += 1
        if nacked >= stop_after:
            done.set()

    await queue.consume(on_message)
    await asyncio.wait_for(done.wait(), 60)
    return nacked


@pytest.mark.timeout(180)
async def test_kill_9_while_dead_lettering_loses_nothing(tmp_path):
    seed = int(os.environ.get("HUTCH_CRASH_SEED") or random.SystemRandom().randrange(2 ** 32))
    print("dead-letter crash seed", seed)
    rng = random.Random(seed)
    first = launch(tmp_path)
    brokers = [first]
    try:
        connection = await aio_pika.connect(first.url)
        channel = await connection.channel(publisher_confirms=True)
        dead = await channel.declare_queue("dead", durable=True)
        source = await channel.declare_queue("source", durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        for start in range(0, N, 500):
            await asyncio.gather(*(channel.default_exchange.publish(
                aio_pika.Message(body(i), delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key="source")
                for i in range(start, start + 500)))
        consumer = await connection.channel()
        await consumer.set_qos(rng.choice([1, 50, 500]))
        await reject_until(await consumer.get_queue("source", ensure=False), rng.randrange(200, N - 200))
        first.process.kill()  # mid-flight: nacks in transit, dead letters being written
        first.process.wait()

        second = launch(tmp_path, "--data-dir", str(first.data_dir))
        brokers.append(second)
        connection = await aio_pika.connect(second.url)
        channel = await connection.channel()
        source = await channel.get_queue("source", ensure=False)
        # what is left is rejected with basic.get: after the last get-empty, every nack went before
        while (message := await source.get(no_ack=False, fail=False)) is not None:
            await message.nack(requeue=False)
        assert await count(channel, "source") == 0
        got = []
        dead = await channel.get_queue("dead", ensure=False)
        while (message := await dead.get(no_ack=True, fail=False)) is not None:
            got.append(message.body)
            assert message.headers["x-death"][0]["reason"] == "rejected"
        assert set(got) == {body(i) for i in range(N)}, "seed %d" % seed
        assert len(got) >= N
        await connection.close()
    finally:
        for broker in brokers:
            broker.stop()
