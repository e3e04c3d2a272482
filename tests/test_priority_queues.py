"""Priority queues (`x-max-priority`) through aio-pika and pika.

RabbitMQ's rules: a ready message of higher priority is delivered before any
of lower priority, FIFO within a priority; no priority property means 0 and a
priority above the queue's maximum counts as the maximum; a requeued message
goes back to its place in its priority; a durable priority queue keeps its
persistent messages, by priority, across restarts (clean or SIGKILL), also
when they were paged out to disk. Texts are RabbitMQ 3.10's, as observed.
"""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pika
import pytest

from helpers import confirm_channel, connect, drain, inequivalent, restarted, unique


async def publish(channel, queue: str, messages) -> None:
    """(body, priority or None) pairs, in order."""
    for body, priority in messages:
        await channel.default_exchange.publish(aio_pika.Message(body, priority=priority), routing_key=queue)


async def get_all(queue) -> list[bytes]:
    bodies = []
    while True:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            return bodies
        bodies.append(message.body)


MIXED = [(b"a0", 0), (b"b5", 5), (b"c1", 1), (b"d5", 5), (b"e", None), (b"f9", 9), (b"g1", 1), (b"h200", 200)]


async def test_higher_priorities_first_fifo_within_a_priority(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("prio"), exclusive=True, arguments={"x-max-priority": 10})
    await publish(channel, queue.name, MIXED)
    # 200 is above the maximum (10): it counts as 10
    assert await get_all(queue) == [b"h200", b"f9", b"b5", b"d5", b"c1", b"g1", b"a0", b"e"]


async def test_priorities_above_the_maximum_share_the_top_level(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("prio"), exclusive=True, arguments={"x-max-priority": 2})
    await publish(channel, queue.name, [(b"x3", 3), (b"y1", 1), (b"z2", 2), (b"w9", 9)])
    assert await get_all(queue) == [b"x3", b"z2", b"w9", b"y1"]


async def test_a_plain_queue_ignores_priorities(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("plain"), exclusive=True)
    await publish(channel, queue.name, MIXED)
    assert await get_all(queue) == [body for body, _ in MIXED]


async def test_consumer_with_prefetch_gets_the_highest_waiting_message(aconn):
    """A consumer at its prefetch holds one message; what arrives meanwhile
    waits, and the next delivery is the highest priority of those."""
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("prio"), exclusive=True, arguments={"x-max-priority": 5})
    consuming = await aconn.channel()
    await consuming.set_qos(prefetch_count=1)
    got: asyncio.Queue = asyncio.Queue()

    async def on_message(message) -> None:
        await got.put(message)

    await (await consuming.get_queue(queue.name, ensure=False)).consume(on_message)
    await publish(channel, queue.name, [(b"first", 0)])
    first = await asyncio.wait_for(got.get(), 5)
    await publish(channel, queue.name, [(b"low", 1), (b"high", 4), (b"mid", 2), (b"high2", 4)])
    order = [first.body]
    message = first
    for _ in range(4):
        await message.ack()
        message = await asyncio.wait_for(got.get(), 5)
        order.append(message.body)
    await message.ack()
    assert order == [b"first", b"high", b"high2", b"mid", b"low"]


async def test_requeued_messages_go_back_to_their_place_in_their_priority(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("prio"), exclusive=True, arguments={"x-max-priority": 3})
    await publish(channel, queue.name, [(b"p3a", 3), (b"p1a", 1), (b"p3b", 3), (b"p1b", 1)])
    taken = [await queue.get() for _ in range(3)]  # p3a, p3b, p1a
    assert [m.body for m in taken] == [b"p3a", b"p3b", b"p1a"]
    for message in reversed(taken):
        await message.nack(requeue=True)
    await publish(channel, queue.name, [(b"p2", 2)])
    redelivered = []
    while True:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            break
        redelivered.append((message.body, message.redelivered))
    assert redelivered == [(b"p3a", True), (b"p3b", True), (b"p2", False), (b"p1a", True), (b"p1b", False)]


async def test_message_count_and_purge_cover_every_priority(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("prio"), exclusive=True, arguments={"x-max-priority": 4})
    await publish(channel, queue.name, MIXED)
    declared = await channel.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == len(MIXED)
    assert (await queue.purge()).message_count == len(MIXED)
    assert await get_all(queue) == []


@pytest.mark.parametrize("value, detail", [
    (256, "{max_value_exceeded,256}"),
    (-1, "{value_negative,-1}"),
    ("10", '"expected integer, got longstr"'),
    (True, '"expected integer, got bool"'),
])
async def test_invalid_max_priority_is_406(aconn, value, detail):
    channel = await aconn.channel()
    name = unique("prio")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_queue(name, exclusive=True, arguments={"x-max-priority": value})
    assert info.value.args[0] == (
        "PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '%s' in vhost '/': %s" % (name, detail))


def test_redeclare_with_another_max_priority_is_406(conn):
    channel = conn.channel()
    name = unique("prio")
    channel.queue_declare(name, exclusive=True, arguments={"x-max-priority": 5})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare(name, exclusive=True, arguments={"x-max-priority": 6})
    assert (info.value.reply_code, info.value.reply_text) == (
        406, inequivalent("queue", name, "x-max-priority", "received '6' but current is '5'"))


# -- durability and paging ---------------------------------------------------------


def publish_sync(port: int, queue: str, messages, declare: bool = True) -> None:
    connection = connect(port)
    channel = confirm_channel(connection)
    if declare:
        channel.queue_declare(queue, durable=True, arguments={"x-max-priority": 9})
    for body, priority in messages:
        channel.basic_publish("", queue, body, pika.BasicProperties(priority=priority, delivery_mode=2))
    connection.close()


def drained(port: int, queue: str) -> list[bytes]:
    connection = connect(port)
    try:
        return [body for _m, _p, body in drain(connection.channel(), queue)]
    finally:
        connection.close()


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_durable_priority_queue_keeps_its_order_across_restarts(start_broker, kill):
    first = start_broker()
    queue = unique("prio-durable")
    publish_sync(first.port, queue, [(b"%d-%d" % (p, i), p) for i in range(20) for p in (0, 3, 9, 5)])
    second = restarted(start_broker, first, kill)
    expected = [b"%d-%d" % (p, i) for p in (9, 5, 3, 0) for i in range(20)]
    assert drained(second.port, queue) == expected
    assert "Traceback" not in second.log


def test_paged_out_priority_levels_keep_their_order(start_broker):
    """More messages per level than a queue keeps in RAM (2048): each level
    pages its tail to disk and reads it back in order."""
    broker = start_broker("--storage-vm-memory-high-watermark-absolute", "4000000000",
                          "--storage-paging-ratio", "0.0005",
                          "--storage-segment-entries", "1024")
    queue = unique("prio-paged")
    count = 3000
    messages = [(b"%d-%05d" % (p, i) + b"." * 200, p) for i in range(count) for p in (1, 7)]
    publish_sync(broker.port, queue, messages)
    bodies = drained(broker.port, queue)
    assert [b.split(b".")[0] for b in bodies] == [b"%d-%05d" % (p, i) for p in (7, 1) for i in range(count)]
    assert "Traceback" not in broker.log
