"""Kill either end of an on-confirm shovel with SIGKILL mid-transfer, restart
it, and count what arrived: every message at least once (duplicates are
allowed by on-confirm, and counted).

Shared by tests/test_shovel_crash.py (a short run in the suite) and
bench/shovel_crash.py (the issue's 100,000 messages).

Two hutch brokers: A holds the source queue and runs the shovel ("amqp://",
this node); B holds the destination queue. `count` persistent messages
(bodies: their index) are published to A with confirms, then the shovel is
set. Once B holds a quarter of them, B is killed and restarted on its port
and data directory (the shovel on A reconnects to it); once B holds half, A
is killed and restarted on its data directory (the shovel restarts with it,
the unacked deliveries are back in A's queue). When A's queue is empty, B's
queue is drained and checked.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiormq

from helpers import wait_for
from http_api import Api

POLL = 0.02  # seconds between two looks at a broker's queues (each look is a connection or a request)


@dataclass
class Outcome:
    count: int
    received: int
    missing: list
    duplicates: int
    seconds: float
    on_b_at_kills: tuple  # what B held when B was killed, and when A was


async def publish(url: str, queue: str, count: int, window: int = 1000, size: int = 0) -> None:
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(queue, durable=True)
    properties = aiormq.spec.Basic.Properties(delivery_mode=2, message_id="m")
    for start in range(0, count, window):
        await asyncio.gather(*(channel.basic_publish(b"%08d" % i + b"." * max(0, size - 8), routing_key=queue,
                                                     properties=properties)
                               for i in range(start, min(count, start + window))))
    await connection.close()


async def ready(url: str, queue: str) -> int:
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        return (await channel.queue_declare(queue, passive=True)).message_count
    finally:
        await connection.close()


async def drain(url: str, queue: str, at_least: int, quiet: float = 1.0) -> list[int]:
    """Every message of `queue` (their indexes), once at least `at_least`
    arrived and then none for `quiet` seconds."""
    got: list[int] = []
    last = [time.monotonic()]
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=1000)

    async def on_message(message) -> None:
        got.append(int(message.body[:8]))
        last[0] = time.monotonic()
        await channel.basic_ack(message.delivery.delivery_tag)

    await channel.basic_consume(queue, on_message)
    while len(got) < at_least or time.monotonic() - last[0] < quiet:
        await asyncio.sleep(0.05)
    await connection.close()
    return got


def run(start, count: int, timeout: float = 60.0, size: int = 0, prefetch: int = 200) -> Outcome:
    """`start(*args)` starts a hutch broker (tests/conftest.py's `launch`
    arguments; "--port", "--data-dir" given when restarting) and returns its
    BrokerProcess."""
    a, b = start(), start()
    began = time.monotonic()
    asyncio.run(publish(a.url, "src", count, size=size))
    api = Api(a.ports["HTTP"])
    value = {"src-uri": "amqp://", "src-queue": "src", "dest-uri": b.url, "dest-queue": "dst",
             "ack-mode": "on-confirm", "reconnect-delay": 0.2, "src-prefetch-count": prefetch}
    assert api.put("/api/parameters/shovel/%2F/crash", {"value": value}).status == 201

    def landed(broker):
        try:
            return asyncio.run(ready(broker.url, "dst"))
        except Exception:  # noqa: BLE001 - the queue appears once the shovel declared it
            return 0

    at_kills = [wait_for(lambda: (lambda n: n if n >= count // 4 else 0)(landed(b)), timeout, POLL, "a quarter on B")]
    b.process.kill()
    b.process.wait()
    b = start("--port", str(b.port), "--data-dir", str(b.data_dir))
    at_kills.append(wait_for(lambda: (lambda n: n if n >= count // 2 else 0)(landed(b)), timeout, POLL,
                             "half on B after its restart"))
    a.process.kill()
    a.process.wait()
    a = start("--data-dir", str(a.data_dir))
    api = Api(a.ports["HTTP"])

    def source_empty():
        reply = api.get("/api/queues/%2F/src")
        return reply.status == 200 and reply.body["messages"] == 0

    wait_for(source_empty, timeout, POLL, "A's queue empty")
    got = asyncio.run(drain(b.url, "dst", count))
    seconds = time.monotonic() - began
    distinct = set(got)
    return Outcome(count, len(got), sorted(set(range(count)) - distinct), len(got) - len(distinct), seconds,
                   tuple(at_kills))
