"""basic.consume / cancel / qos / flow: who receives what, when, and the errors.

aio-pika and pika consumers against the session broker; a raw-socket client
(pamqp frames) where both libraries hide the protocol (they invent consumer
tags client-side and refuse to reuse one). Publishes go through confirm-mode
channels so a count read afterwards is exact. Reply codes and texts are
RabbitMQ 3.10's; the one documented difference is channel.flow (see there).
"""
from __future__ import annotations

import asyncio
import re
import struct

import aio_pika
import aiormq
import pika
import pytest
from pamqp import commands
from pika.exceptions import ConnectionClosedByBroker

from amqp_raw import CLIENT_CAPABILITIES, RawClient
from helpers import confirm_channel, connect, declare, pump, ready, unique, wait_for

SERVER_TAG = re.compile(r"^amq\.ctag-[A-Za-z0-9_-]{22}$")


# -- helpers ------------------------------------------------------------------


@pytest.fixture
def raw(broker):
    """A raw-socket client through the handshake, with channel 1 open."""
    with RawClient.connected(broker.port, capabilities=CLIENT_CAPABILITIES, channels=(1,)) as client:
        yield client


async def ignore(message) -> None:
    """A consumer callback that does nothing (manual-ack messages stay unacked)."""


async def collect(queue: asyncio.Queue, n: int) -> list:
    return [await asyncio.wait_for(queue.get(), 5) for _ in range(n)]


# -- consumer tags --------------------------------------------------------------


def test_server_generates_consumer_tags(raw):
    q = raw.declare_queue(1)
    tags = []
    for _ in range(2):
        raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="", no_ack=True), 1)
        tags.append(raw.expect(commands.Basic.ConsumeOk, 1).consumer_tag)
    assert all(SERVER_TAG.match(tag) for tag in tags), tags
    assert tags[0] != tags[1]
    raw.send_frame(commands.Basic.Publish(exchange="", routing_key=q), 1)
    raw.send(struct.pack(">BHIHHQH", 2, 1, 14, 60, 0, 0, 0) + b"\xce")
    deliver = raw.expect(commands.Basic.Deliver, 1)
    assert deliver.consumer_tag == tags[0]
    raw.read_content(1)
    raw.send_frame(commands.Basic.Cancel(consumer_tag=tags[1]), 1)
    assert raw.expect(commands.Basic.CancelOk, 1).consumer_tag == tags[1]


def test_consumer_tag_reuse_on_one_channel_closes_connection_530(raw):
    raw.open_channel(2)
    q = raw.declare_queue(1)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="dup"), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="dup"), 2)  # other channel: fine
    raw.expect(commands.Basic.ConsumeOk, 2)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="dup"), 1)
    close = raw.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")
    assert (close.class_id, close.method_id) == (60, 20)


# -- exclusive, missing queue -------------------------------------------------


async def test_exclusive_consumer_refuses_a_second_consumer_403(aconn):
    ch1 = await aconn.channel()
    queue = await ch1.declare_queue(unique("consume"), exclusive=True)
    tag = await queue.consume(ignore, exclusive=True)
    ch2 = await aconn.channel()
    q2 = await ch2.get_queue(queue.name, ensure=False)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await q2.consume(ignore)
    assert info.value.args[0] == "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % queue.name
    # once the exclusive consumer is gone, others may consume
    await queue.cancel(tag)
    ch3 = await aconn.channel()
    q3 = await ch3.get_queue(queue.name, ensure=False)
    assert (await q3.consume(ignore)).startswith("ctag")


async def test_exclusive_consume_after_another_consumer_is_403(aconn):
    ch1 = await aconn.channel()
    queue = await ch1.declare_queue(unique("consume"), exclusive=True)
    await queue.consume(ignore)
    ch2 = await aconn.channel()
    q2 = await ch2.get_queue(queue.name, ensure=False)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await q2.consume(ignore, exclusive=True)
    assert info.value.args[0] == "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % queue.name
    assert not aconn.is_closed


async def test_consume_from_missing_queue_is_404(aconn):
    channel = await aconn.channel()
    name = unique("missing")
    queue = await channel.get_queue(name, ensure=False)
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
        await queue.consume(ignore)
    assert info.value.args[0] == "NOT_FOUND - no queue '%s' in vhost '/'" % name


# -- no-ack, cancel, cancel notification --------------------------------------


async def test_no_ack_consumer_leaves_nothing_outstanding(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("consume"), exclusive=True)
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    got: asyncio.Queue = asyncio.Queue()

    async def on_message(message):
        await got.put((message.body, message.delivery_tag))

    await queue.consume(on_message, no_ack=True)
    assert await collect(got, 3) == [(b"0", 1), (b"1", 2), (b"2", 3)]
    underlay = await channel.get_underlay_channel()
    await underlay.basic_recover(requeue=True)  # nothing to redeliver
    declared = await channel.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == 0
    assert got.empty()
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await underlay.basic_ack(1)
        await channel.declare_queue(queue.name, passive=True)
    assert info.value.args[0] == "PRECONDITION_FAILED - unknown delivery tag 1"


async def test_cancel_answers_cancel_ok_and_stops_deliveries(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("consume"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()

    async def on_message(message):
        await got.put(message.body)
        await message.ack()

    tag = await queue.consume(on_message)
    await channel.default_exchange.publish(aio_pika.Message(b"before"), routing_key=queue.name)
    assert await collect(got, 1) == [b"before"]
    cancel_ok = await queue.cancel(tag)
    assert isinstance(cancel_ok, commands.Basic.CancelOk) and cancel_ok.consumer_tag == tag
    for body in (b"after-1", b"after-2"):
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
    declared = await channel.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == 2
    assert declared.declaration_result.consumer_count == 0
    assert got.empty()


def test_cancel_of_unknown_tag_is_answered(raw):
    raw.send_frame(commands.Basic.Cancel(consumer_tag="never-consumed"), 1)
    assert raw.expect(commands.Basic.CancelOk, 1).consumer_tag == "never-consumed"


def test_queue_deletion_cancels_consumer_pika(conn):
    ch = conn.channel()
    q = declare(ch)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    assert other.queue_delete(q).method.message_count == 0
    pump(conn, lambda: cancelled)
    assert cancelled == [tag]
    assert ch.is_open and tag not in ch.consumer_tags


async def test_queue_deletion_cancels_consumer_aio_pika(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("consume"), exclusive=True)
    cancelled: asyncio.Queue = asyncio.Queue()
    underlay = await channel.get_underlay_channel()
    underlay.on_consumer_cancel_callbacks.add(lambda frame: cancelled.put_nowait(frame))
    tag = await queue.consume(ignore)
    other = await aconn.channel()
    await other.queue_delete(queue.name)
    frame = await asyncio.wait_for(cancelled.get(), 5)
    assert isinstance(frame, commands.Basic.Cancel) and frame.consumer_tag == tag
    assert not channel.is_closed


# -- dispatch: round robin, prefetch ------------------------------------------


def test_round_robin_among_three_consumers(conn):
    ch = conn.channel()
    q = declare(ch)
    order = []
    tags = [ch.basic_consume(q, lambda _c, m, _p, _b: order.append(m.consumer_tag), auto_ack=True)
            for _ in range(3)]
    pub = confirm_channel(conn)
    for i in range(30):
        pub.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(order) == 30)
    assert order == tags * 10


async def test_round_robin_across_channels_aio_pika(aconn):
    channels = [await aconn.channel() for _ in range(3)]
    queue = await channels[0].declare_queue(unique("consume"), exclusive=True)
    got: asyncio.Queue = asyncio.Queue()
    for index, channel in enumerate(channels):
        q = await channel.get_queue(queue.name, ensure=False)

        async def on_message(message, index=index):
            await got.put((index, message.body))

        await q.consume(on_message, no_ack=True)
    pub = await aconn.channel()
    for i in range(9):
        await pub.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    received = await collect(got, 9)
    for index in range(3):  # consumer k gets messages k, k+3, k+6 (in order)
        assert [body for i, body in received if i == index] == [b"%d" % n for n in range(index, 9, 3)]


def consumers(ch, q, names):
    """One manual-ack consumer per name; returns {name: [method, ...]}."""
    got = {name: [] for name in names}
    for name in names:
        ch.basic_consume(q, lambda _c, m, _p, _b, name=name: got[name].append(m), consumer_tag=name)
    return got


def test_per_consumer_prefetch_applies_to_consumers_created_after(conn):
    ch = conn.channel()
    q = declare(ch)
    got = consumers(ch, q, ["unlimited"])
    ch.basic_qos(prefetch_count=2)  # global=false: consumers created from now on
    got.update(consumers(ch, q, ["limited"]))
    pub = confirm_channel(conn)
    for i in range(20):
        pub.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(got["unlimited"]) + len(got["limited"]) == 20)
    assert (len(got["unlimited"]), len(got["limited"])) == (18, 2)
    assert ready(pub, q) == 0


def test_per_consumer_prefetch_limits_each_consumer(conn):
    ch = conn.channel()
    q = declare(ch)
    ch.basic_qos(prefetch_count=2)
    got = consumers(ch, q, ["a", "b"])
    pub = confirm_channel(conn)
    for i in range(10):
        pub.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) == 4)
    assert ready(pub, q) == 6
    assert (len(got["a"]), len(got["b"])) == (2, 2)
    ch.basic_ack(got["a"][0].delivery_tag)  # frees one slot of consumer a only
    pump(conn, lambda: len(got["a"]) == 3)
    assert ready(pub, q) == 5
    assert len(got["b"]) == 2


def test_global_prefetch_limits_the_whole_channel(conn):
    ch = conn.channel()
    q = declare(ch)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got = consumers(ch, q, ["a", "b"])
    pub = confirm_channel(conn)
    for i in range(10):
        pub.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) == 3)
    assert ready(pub, q) == 7
    assert (len(got["a"]), len(got["b"])) == (2, 1)
    ch.basic_ack(0, multiple=True)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) == 6)
    assert ready(pub, q) == 4


def test_per_consumer_and_global_prefetch_together(conn):
    ch = conn.channel()
    q = declare(ch)
    ch.basic_qos(prefetch_count=2)
    ch.basic_qos(prefetch_count=3, global_qos=True)
    got = consumers(ch, q, ["a", "b"])
    pub = confirm_channel(conn)
    for i in range(20):
        pub.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(got["a"]) + len(got["b"]) == 3)
    assert ready(pub, q) == 17
    assert (len(got["a"]), len(got["b"])) == (2, 1)  # a stops at its own limit, the channel at 3
    ch.basic_ack(got["b"][0].delivery_tag)
    pump(conn, lambda: len(got["b"]) == 2)
    assert ready(pub, q) == 16
    assert len(got["a"]) == 2


async def test_prefetch_one_with_aio_pika(aconn):
    channel = await aconn.channel()
    await channel.set_qos(prefetch_count=1)
    queue = await channel.declare_queue(unique("consume"), exclusive=True)
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    got: asyncio.Queue = asyncio.Queue()

    async def on_message(message):
        await got.put(message)

    await queue.consume(on_message)
    first = (await collect(got, 1))[0]
    declared = await channel.declare_queue(queue.name, passive=True)
    assert declared.declaration_result.message_count == 2
    assert got.empty()
    await first.ack()
    second = (await collect(got, 1))[0]
    assert (first.body, second.body) == (b"0", b"1")


def test_prefetch_size_is_not_implemented_540(conn):
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as info:
        ch.basic_qos(prefetch_size=10)
    assert (info.value.reply_code, info.value.reply_text) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)")


# -- unacked messages come back when their channel or connection goes -----------


async def test_unacked_requeued_when_channel_closes(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("consume"), exclusive=True)
    for i in range(3):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
    consumer_channel = await aconn.channel()
    q = await consumer_channel.get_queue(queue.name, ensure=False)
    got: asyncio.Queue = asyncio.Queue()

    async def on_message(message):
        await got.put(message)

    await q.consume(on_message)
    first = await collect(got, 3)
    await first[1].ack()
    await consumer_channel.close()
    again = []
    for _ in range(2):
        message = await queue.get(timeout=5)
        again.append((message.body, message.redelivered))
        await message.ack()
    assert again == [(b"0", True), (b"2", True)]
    assert await queue.get(fail=False, timeout=5) is None


def test_unacked_requeued_when_connection_closes(broker, conn):
    ch = conn.channel()
    q = ch.queue_declare(unique("consume"), auto_delete=False).method.queue
    pub = confirm_channel(conn)
    for i in range(4):
        pub.basic_publish("", q, b"%d" % i)
    consumer_conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    cch = consumer_conn.channel()
    seen = []
    cch.basic_consume(q, lambda _c, m, _p, b: seen.append(b))
    pump(consumer_conn, lambda: len(seen) == 4)
    consumer_conn.close()
    wait_for(lambda: ready(ch, q) == 4)
    again = [ch.basic_get(q, auto_ack=True) for _ in range(4)]
    assert [(body, m.redelivered) for m, _p, body in again] == [(b"%d" % i, True) for i in range(4)]
    ch.queue_delete(q)


# -- channel.flow -------------------------------------------------------------


def test_channel_flow_pauses_and_resumes_deliveries(start_broker):
    """With channel_flow_pause, channel.flow works as the AMQP 0-9-1 spec
    describes it. By default RabbitMQ's answer, 540 NOT_IMPLEMENTED
    "active=false" (tests/differential/test_diff_connection.py)."""
    conn = connect(start_broker("--channel-flow-pause", "true").port)
    ch = conn.channel()
    q = declare(ch)
    seen = []
    ch.basic_consume(q, lambda _c, m, _p, b: seen.append(b), auto_ack=True)
    assert ch.flow(False) is False
    pub = confirm_channel(conn)
    for i in range(3):
        pub.basic_publish("", q, b"%d" % i)
    assert ready(ch, q) == 3  # a round trip on the paused channel: still nothing delivered
    conn.process_data_events(time_limit=0)
    assert seen == []
    assert ch.flow(True) is True
    pump(conn, lambda: len(seen) == 3)
    assert seen == [b"0", b"1", b"2"]
    assert ready(ch, q) == 0
    conn.close()
