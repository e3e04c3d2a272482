"""Consumer priorities (`x-priority`) and single active consumer
(`x-single-active-consumer`) through aio-pika against the session broker.

RabbitMQ's rules: a message goes to the highest-priority consumer that can
take it (round-robin among equals); a lower one gets messages only while all
higher ones are blocked (prefetch). A single-active-consumer queue delivers
to one consumer only, and when it goes the next one takes over, unacked
messages included. Texts are RabbitMQ 3.10's, as observed.
"""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pytest

from helpers import unique


class Sink:
    """A consumer callback recording (tag name, body); acks when told to."""

    def __init__(self, name: str, got: asyncio.Queue, ack: bool = False) -> None:
        self.name = name
        self.got = got
        self.ack = ack
        self.messages: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def __call__(self, message) -> None:
        self.messages.append(message)
        if self.ack:
            await message.ack()
        await self.got.put((self.name, message.body))


async def collect(got: asyncio.Queue, n: int) -> list:
    return [await asyncio.wait_for(got.get(), 5) for _ in range(n)]


async def publish(channel, queue: str, *bodies: bytes) -> None:
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)


async def consumer_channel(connection, prefetch: int = 0):
    channel = await connection.channel()
    if prefetch:
        await channel.set_qos(prefetch_count=prefetch)
    return channel


async def queue_on(channel, name: str):
    return await channel.get_queue(name, ensure=False)


# -- consumer priorities -----------------------------------------------------------


async def test_highest_priority_consumer_takes_everything_it_can(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("cprio"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()
    for name, priority in (("low", 1), ("high", 10), ("none", None)):
        channel = await consumer_channel(aconn)
        arguments = {"x-priority": priority} if priority is not None else None
        await (await queue_on(channel, queue.name)).consume(Sink(name, got, ack=True), arguments=arguments)
    await publish(publisher, queue.name, *[b"%d" % i for i in range(6)])
    assert await collect(got, 6) == [("high", b"%d" % i) for i in range(6)]


async def test_lower_priority_consumer_gets_messages_only_while_higher_ones_are_blocked(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("cprio"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()
    high = Sink("high", got)
    low = Sink("low", got)
    await (await queue_on(await consumer_channel(aconn, prefetch=2), queue.name)).consume(
        high, arguments={"x-priority": 5})
    await (await queue_on(await consumer_channel(aconn, prefetch=100), queue.name)).consume(
        low, arguments={"x-priority": -5})
    await publish(publisher, queue.name, *[b"%d" % i for i in range(5)])
    assert await collect(got, 5) == [("high", b"0"), ("high", b"1"), ("low", b"2"), ("low", b"3"), ("low", b"4")]
    # high is free again: the next messages are its own, up to its prefetch
    await high.messages[0].ack()
    await high.messages[1].ack()
    await publish(publisher, queue.name, b"5", b"6", b"7")
    assert await collect(got, 3) == [("high", b"5"), ("high", b"6"), ("low", b"7")]


async def test_equal_priorities_share_round_robin_above_lower_ones(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("cprio"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()
    for name, priority in (("a", 3), ("low", 0), ("b", 3)):
        channel = await consumer_channel(aconn)
        await (await queue_on(channel, queue.name)).consume(
            Sink(name, got, ack=True), arguments={"x-priority": priority})
    await publish(publisher, queue.name, *[b"%d" % i for i in range(6)])
    received = await collect(got, 6)
    assert {name for name, _ in received} == {"a", "b"}
    assert sorted(name for name, _ in received) == ["a", "a", "a", "b", "b", "b"]


async def test_cancelling_the_high_priority_consumer_hands_over_to_the_next(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("cprio"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()
    high_queue = await queue_on(await consumer_channel(aconn), queue.name)
    tag = await high_queue.consume(Sink("high", got, ack=True), arguments={"x-priority": 2})
    await (await queue_on(await consumer_channel(aconn), queue.name)).consume(
        Sink("low", got, ack=True), arguments={"x-priority": 1})
    await publish(publisher, queue.name, b"0")
    assert await collect(got, 1) == [("high", b"0")]
    await high_queue.cancel(tag)
    await publish(publisher, queue.name, b"1")
    assert await collect(got, 1) == [("low", b"1")]


@pytest.mark.parametrize("value, wire_type", [("high", "longstr"), (True, "bool")])
async def test_a_non_integer_consumer_priority_is_406(aconn, value, wire_type):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("cprio"), exclusive=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await queue.consume(Sink("x", asyncio.Queue()), arguments={"x-priority": value})
    assert info.value.args[0] == (
        "PRECONDITION_FAILED - invalid arg 'x-priority' for queue '%s' in vhost '/': \"expected integer, got %s\""
        % (queue.name, wire_type))


async def test_any_integer_is_a_consumer_priority(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("cprio"), exclusive=True)
    for value in (-7, 0, 2**40):
        await queue.consume(Sink("x", asyncio.Queue()), arguments={"x-priority": value})
    assert (await channel.declare_queue(queue.name, passive=True)).declaration_result.consumer_count == 3


# -- single active consumer -------------------------------------------------------


async def sac_queue(channel):
    return await channel.declare_queue(unique("sac"), exclusive=True, arguments={"x-single-active-consumer": True})


async def test_only_the_first_consumer_receives(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await sac_queue(publisher)
    got: asyncio.Queue = asyncio.Queue()
    for name in ("first", "second", "third"):
        await (await queue_on(await consumer_channel(aconn), queue.name)).consume(Sink(name, got, ack=True))
    await publish(publisher, queue.name, *[b"%d" % i for i in range(5)])
    assert await collect(got, 5) == [("first", b"%d" % i) for i in range(5)]
    declared = await publisher.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.consumer_count == 3


async def test_the_next_consumer_takes_over_with_the_unacked_messages(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await sac_queue(publisher)
    got: asyncio.Queue = asyncio.Queue()
    first_channel = await consumer_channel(aconn, prefetch=2)
    await (await queue_on(first_channel, queue.name)).consume(Sink("first", got))
    await (await queue_on(await consumer_channel(aconn), queue.name)).consume(Sink("second", got, ack=True))
    await publish(publisher, queue.name, b"0", b"1", b"2", b"3")
    # the active consumer is at its prefetch: the other one still gets nothing
    assert await collect(got, 2) == [("first", b"0"), ("first", b"1")]
    await publisher.declare_queue(queue.name, passive=True)
    assert got.empty()
    await first_channel.close()  # its unacked messages go back, in order
    assert await collect(got, 4) == [("second", b"0"), ("second", b"1"), ("second", b"2"), ("second", b"3")]


async def test_failover_after_cancel_and_a_new_consumer_waits_its_turn(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await sac_queue(publisher)
    got: asyncio.Queue = asyncio.Queue()
    first = await queue_on(await consumer_channel(aconn), queue.name)
    first_tag = await first.consume(Sink("first", got, ack=True))
    second = await queue_on(await consumer_channel(aconn), queue.name)
    second_tag = await second.consume(Sink("second", got, ack=True))
    await publish(publisher, queue.name, b"0")
    assert await collect(got, 1) == [("first", b"0")]
    await first.cancel(first_tag)
    await (await queue_on(await consumer_channel(aconn), queue.name)).consume(Sink("third", got, ack=True))
    await publish(publisher, queue.name, b"1")
    assert await collect(got, 1) == [("second", b"1")]
    await second.cancel(second_tag)
    await publish(publisher, queue.name, b"2")
    assert await collect(got, 1) == [("third", b"2")]


async def test_exclusive_consume_on_a_single_active_consumer_queue_is_403(aconn):
    channel = await aconn.channel()
    queue = await sac_queue(channel)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await queue.consume(Sink("x", asyncio.Queue()), exclusive=True)
    assert info.value.args[0] == "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % queue.name


@pytest.mark.parametrize("value, wire_type", [(1, "signedint"), ("true", "longstr")])
async def test_a_non_boolean_single_active_consumer_is_406(aconn, value, wire_type):
    channel = await aconn.channel()
    name = unique("sac")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_queue(name, exclusive=True, arguments={"x-single-active-consumer": value})
    assert info.value.args[0] == (
        "PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '%s' in vhost '/': "
        "{unacceptable_type,%s}" % (name, wire_type))


async def test_single_active_consumer_false_is_an_ordinary_queue(aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("sac"), exclusive=True,
                                          arguments={"x-single-active-consumer": False})
    got: asyncio.Queue = asyncio.Queue()
    for name in ("a", "b"):
        await (await queue_on(await consumer_channel(aconn), queue.name)).consume(Sink(name, got, ack=True))
    await publish(publisher, queue.name, b"0", b"1")
    assert sorted(name for name, _ in await collect(got, 2)) == ["a", "b"]


async def test_failover_when_the_active_consumers_connection_goes(broker, aconn):
    publisher = await aconn.channel(publisher_confirms=True)
    queue = await publisher.declare_queue(unique("sac"), arguments={"x-single-active-consumer": True},
                                          auto_delete=True)
    got: asyncio.Queue = asyncio.Queue()
    doomed = await aio_pika.connect(broker.url)
    await (await queue_on(await consumer_channel(doomed, prefetch=1), queue.name)).consume(Sink("first", got))
    await (await queue_on(await consumer_channel(aconn), queue.name)).consume(Sink("second", got, ack=True))
    await publish(publisher, queue.name, b"0", b"1")
    assert await collect(got, 1) == [("first", b"0")]
    await doomed.close()
    assert await collect(got, 2) == [("second", b"0"), ("second", b"1")]
