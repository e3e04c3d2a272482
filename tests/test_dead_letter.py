"""Dead-lettering and delivery counting, seen by aio-pika clients of a real
broker: where dead messages go, the x-death header as RabbitMQ builds it,
cycle detection, and x-delivery-count / x-delivery-limit (beyond RabbitMQ
3.10, which has them on quorum queues only).
"""
from __future__ import annotations

import asyncio
import datetime

import aio_pika
import pytest

from helpers import unique
from test_ttl_limits import _equals, bodies, count, dead_letter_pair, publish, until


@pytest.fixture
async def channel(aconn):
    return await aconn.channel()


def near_now(value: datetime.datetime) -> bool:
    now = datetime.datetime.now(datetime.timezone.utc)
    return abs((now - value).total_seconds()) < 60


async def test_rejected_message_gets_x_death_as_rabbitmq_builds_it(channel):
    dlx = await channel.declare_exchange(unique("dlx"), aio_pika.ExchangeType.FANOUT, auto_delete=True)
    dead = await channel.declare_queue(unique("dead"), exclusive=True)
    await dead.bind(dlx)
    source = await channel.declare_queue(unique("src"), exclusive=True,
                                         arguments={"x-dead-letter-exchange": dlx.name})
    await channel.default_exchange.publish(
        aio_pika.Message(b"body", expiration=60, headers={"CC": ["elsewhere"], "keep": "me"}, content_type="text/x"),
        routing_key=source.name)
    message = await source.get(no_ack=False)
    await message.reject(requeue=False)
    await until(lambda: _equals(count(channel, dead.name), 1))
    got = await dead.get(no_ack=True)
    assert (got.body, got.exchange, got.routing_key) == (b"body", dlx.name, source.name)
    assert got.content_type == "text/x" and got.expiration is None
    headers = dict(got.headers)
    (death,) = headers.pop("x-death")
    assert near_now(death.pop("time"))
    assert death == {"count": 1, "reason": "rejected", "queue": source.name, "exchange": "",
                     "routing-keys": [source.name, "elsewhere"], "original-expiration": "60000"}
    assert headers == {
        "CC": ["elsewhere"], "keep": "me",
        "x-first-death-reason": "rejected", "x-first-death-queue": source.name, "x-first-death-exchange": "",
        "x-last-death-reason": "rejected", "x-last-death-queue": source.name, "x-last-death-exchange": "",
    }


async def test_dead_letter_routing_key_replaces_the_keys_and_drops_cc(channel):
    source, dead = await dead_letter_pair(channel)
    await publish(channel, source.name, b"x", headers={"CC": ["a", "b"]})
    await (await source.get(no_ack=False)).nack(requeue=False)
    await until(lambda: _equals(count(channel, dead.name), 1))
    got = await dead.get(no_ack=True)
    assert got.routing_key == dead.name
    assert "CC" not in got.headers
    assert got.headers["x-death"][0]["routing-keys"] == [source.name, "a", "b"]


async def test_deaths_accumulate_per_queue_and_reason(channel):
    """a --rejected--> b --expired--> a --rejected--> b: x-death keeps one
    entry per (queue, reason), the latest first, and counts repeats."""
    a_name, b_name = unique("a"), unique("b")
    a = await channel.declare_queue(a_name, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": b_name})
    await channel.declare_queue(b_name, exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": a_name, "x-message-ttl": 50})
    await publish(channel, a.name, b"m")
    for _ in range(2):
        await (await a.get(no_ack=False)).reject(requeue=False)
        # via b, where it expires, back into a
        await until(lambda: _equals(count(channel, a.name), 1))
    got = await a.get(no_ack=True)
    deaths = [(d["queue"], d["reason"], d["count"]) for d in got.headers["x-death"]]
    assert deaths == [(b_name, "expired", 2), (a_name, "rejected", 2)]
    assert got.headers["x-first-death-queue"] == a_name
    assert got.headers["x-first-death-reason"] == "rejected"
    assert (got.headers["x-last-death-queue"], got.headers["x-last-death-reason"]) == (b_name, "expired")


async def test_an_automatic_cycle_is_dropped(channel):
    """A queue whose expired messages go back to itself: RabbitMQ drops the
    message for that queue rather than loop forever (other targets get it)."""
    name = unique("loop")
    await channel.declare_queue(name, exclusive=True, arguments={"x-dead-letter-exchange": "", "x-message-ttl": 100})
    witness = await channel.declare_queue(unique("w"), exclusive=True)
    await channel.default_exchange.publish(aio_pika.Message(b"m", headers={"CC": [witness.name]}), routing_key=name)
    # the original copy (CC), then the dead-lettered one (its keys: the loop queue and the witness)
    await until(lambda: _equals(count(channel, witness.name), 2))
    assert await count(channel, name) == 0
    copies = [await witness.get(no_ack=True) for _ in range(2)]
    assert "x-death" not in copies[0].headers
    assert [(d["queue"], d["reason"]) for d in copies[1].headers["x-death"]] == [(name, "expired")]


async def test_a_cycle_with_a_rejection_is_not_dropped(channel):
    name = unique("loop")
    queue = await channel.declare_queue(name, exclusive=True, arguments={"x-dead-letter-exchange": ""})
    await publish(channel, name, b"m")
    counts = []
    for _ in range(3):
        message = await until(lambda: queue.get(no_ack=False, fail=False))
        counts.append([d["count"] for d in (message.headers or {}).get("x-death", [])])
        await message.reject(requeue=False)
    got = await until(lambda: queue.get(no_ack=True, fail=False))
    assert counts + [[d["count"] for d in got.headers["x-death"]]] == [[], [1], [2], [3]]


async def test_a_missing_dead_letter_exchange_drops_the_message(channel):
    queue = await channel.declare_queue(unique("q"), exclusive=True,
                                        arguments={"x-dead-letter-exchange": unique("missing")})
    await publish(channel, queue.name, b"m")
    await (await queue.get(no_ack=False)).reject(requeue=False)
    assert await count(channel, queue.name) == 0


async def test_dead_letters_follow_the_exchange_type(channel):
    dlx = await channel.declare_exchange(unique("dlx"), aio_pika.ExchangeType.TOPIC, auto_delete=True)
    hit = await channel.declare_queue(unique("hit"), exclusive=True)
    miss = await channel.declare_queue(unique("miss"), exclusive=True)
    await hit.bind(dlx, "orders.#")
    await miss.bind(dlx, "payments.#")
    source = await channel.declare_queue(unique("src"), exclusive=True, arguments={
        "x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "orders.dead"})
    await publish(channel, source.name, b"m")
    await (await source.get(no_ack=False)).nack(requeue=False)
    await until(lambda: _equals(count(channel, hit.name), 1))
    assert await count(channel, miss.name) == 0


# -- delivery counting --------------------------------------------------------------


async def test_redeliveries_carry_x_delivery_count(channel):
    queue = await channel.declare_queue(unique("dc"), exclusive=True)
    await publish(channel, queue.name, b"m", headers={"mine": 1})
    first = await queue.get(no_ack=False)
    assert "x-delivery-count" not in (first.headers or {})
    await first.nack(requeue=True)
    second = await queue.get(no_ack=False)
    assert second.redelivered and second.headers == {"mine": 1, "x-delivery-count": 1}
    await second.reject(requeue=True)
    third = await queue.get(no_ack=False)
    assert third.headers["x-delivery-count"] == 2
    await third.ack()


async def test_delivery_limit_dead_letters_after_that_many_returns(aconn):
    channel = await aconn.channel()
    source, dead = await dead_letter_pair(channel, **{"x-delivery-limit": 2})
    await publish(channel, source.name, b"poison")
    counts = []
    for _ in range(3):
        message = await until(lambda: source.get(no_ack=False, fail=False))
        counts.append((message.headers or {}).get("x-delivery-count", 0))
        await message.nack(requeue=True)
    assert counts == [0, 1, 2]
    await until(lambda: _equals(count(channel, dead.name), 1))
    got = await dead.get(no_ack=True)
    assert got.headers["x-death"][0]["reason"] == "delivery_limit"
    assert await count(channel, source.name) == 0


async def test_closing_the_channel_counts_as_a_return(aconn):
    setup = await aconn.channel()
    source, dead = await dead_letter_pair(setup, **{"x-delivery-limit": 0})
    await publish(setup, source.name, b"m")
    consumer = await aconn.channel()
    queue = await consumer.get_queue(source.name, ensure=False)
    await queue.get(no_ack=False)
    await consumer.close()
    await until(lambda: _equals(count(setup, dead.name), 1))


async def test_a_consumer_sees_the_count_grow(aconn):
    channel = await aconn.channel()
    await channel.set_qos(1)
    queue = await channel.declare_queue(unique("dc"), exclusive=True, arguments={"x-delivery-limit": 5})
    seen = asyncio.Queue()

    async def on_message(message):
        await seen.put((message.headers or {}).get("x-delivery-count", 0))
        if seen.qsize() < 4:
            await message.nack(requeue=True)
        else:
            await message.ack()

    await queue.consume(on_message)
    await publish(channel, queue.name, b"m")
    got = [await asyncio.wait_for(seen.get(), 10) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    assert await bodies(queue) == []
