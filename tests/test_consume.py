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
import socket
import struct

import aio_pika
import aiormq
import pika
import pytest
from pamqp import commands
from pamqp import frame as pframe
from pika.exceptions import ConnectionClosedByBroker

from conftest import unique, wait_for

SERVER_TAG = re.compile(r"^amq\.ctag-[A-Za-z0-9_-]{22}$")


# -- helpers ------------------------------------------------------------------


class Raw:
    """A minimal AMQP 0-9-1 client on a plain socket (pamqp marshals frames)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(0, commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"consumer_cancel_notify": True}},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = self.expect(0, commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.expect(0, commands.Connection.OpenOk)

    def send(self, channel: int, *methods) -> None:
        self.sock.sendall(b"".join(pframe.marshal(m, channel) for m in methods))

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(channel, commands.Channel.OpenOk)

    def read_frame(self) -> tuple[int, int, bytes]:
        while True:
            if len(self.buf) >= 7:
                frame_type, channel, size = struct.unpack_from(">BHI", self.buf)
                if len(self.buf) >= size + 8:
                    frame, self.buf = self.buf[:size + 8], self.buf[size + 8:]
                    return frame_type, channel, frame
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("socket closed by the broker")
            self.buf += data

    def expect(self, channel: int, cls):
        frame_type, got, frame = self.read_frame()
        assert frame_type == 1, frame_type
        method = pframe.unmarshal(frame)[2]
        assert got == channel and isinstance(method, cls), (got, method, dict(method))
        return method

    def skip_content(self, channel: int) -> None:
        frame_type, got, frame = self.read_frame()
        assert (frame_type, got) == (2, channel)
        size = struct.unpack_from(">Q", frame, 11)[0]
        while size:
            frame_type, got, frame = self.read_frame()
            assert (frame_type, got) == (3, channel)
            size -= len(frame) - 8


@pytest.fixture
def conn(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
async def aconn(broker):
    connection = await aio_pika.connect(broker.url)
    yield connection
    await connection.close()


def declare(channel) -> str:
    return channel.queue_declare(unique("consume"), exclusive=True).method.queue


def ready(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def publisher(connection):
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def pump(connection, predicate):
    """Let a pika connection dispatch callbacks until `predicate()` holds."""
    def check():
        connection.process_data_events(time_limit=0.02)
        return predicate()
    return wait_for(check)


async def ignore(message) -> None:
    """A consumer callback that does nothing (manual-ack messages stay unacked)."""


async def collect(queue: asyncio.Queue, n: int) -> list:
    return [await asyncio.wait_for(queue.get(), 5) for _ in range(n)]


# -- consumer tags --------------------------------------------------------------


def test_server_generates_consumer_tags(broker):
    raw = Raw(broker.port)
    raw.open_channel(1)
    raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
    q = raw.expect(1, commands.Queue.DeclareOk).queue
    tags = []
    for _ in range(2):
        raw.send(1, commands.Basic.Consume(queue=q, consumer_tag="", no_ack=True))
        tags.append(raw.expect(1, commands.Basic.ConsumeOk).consumer_tag)
    assert all(SERVER_TAG.match(tag) for tag in tags), tags
    assert tags[0] != tags[1]
    raw.send(1, commands.Basic.Publish(exchange="", routing_key=q))
    raw.sock.sendall(struct.pack(">BHIHHQH", 2, 1, 14, 60, 0, 0, 0) + b"\xce")
    deliver = raw.expect(1, commands.Basic.Deliver)
    assert deliver.consumer_tag == tags[0]
    raw.skip_content(1)
    raw.send(1, commands.Basic.Cancel(consumer_tag=tags[1]))
    assert raw.expect(1, commands.Basic.CancelOk).consumer_tag == tags[1]
    raw.sock.close()


def test_consumer_tag_reuse_on_one_channel_closes_connection_530(broker):
    raw = Raw(broker.port)
    raw.open_channel(1)
    raw.open_channel(2)
    raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
    q = raw.expect(1, commands.Queue.DeclareOk).queue
    raw.send(1, commands.Basic.Consume(queue=q, consumer_tag="dup"))
    raw.expect(1, commands.Basic.ConsumeOk)
    raw.send(2, commands.Basic.Consume(queue=q, consumer_tag="dup"))  # other channel: fine
    raw.expect(2, commands.Basic.ConsumeOk)
    raw.send(1, commands.Basic.Consume(queue=q, consumer_tag="dup"))
    close = raw.expect(0, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")
    assert (close.class_id, close.method_id) == (60, 20)
    raw.sock.close()


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


def test_cancel_of_unknown_tag_is_answered(broker):
    raw = Raw(broker.port)
    raw.open_channel(1)
    raw.send(1, commands.Basic.Cancel(consumer_tag="never-consumed"))
    assert raw.expect(1, commands.Basic.CancelOk).consumer_tag == "never-consumed"
    raw.sock.close()


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
    pub = publisher(conn)
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
    pub = publisher(conn)
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
    pub = publisher(conn)
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
    pub = publisher(conn)
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
    pub = publisher(conn)
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
    pub = publisher(conn)
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


def test_channel_flow_pauses_and_resumes_deliveries(conn):
    """hutch implements channel.flow as the AMQP 0-9-1 spec describes it.

    Documented difference: RabbitMQ refuses flow(active=false) with
    540 NOT_IMPLEMENTED "active=false" and closes the connection.
    """
    ch = conn.channel()
    q = declare(ch)
    seen = []
    ch.basic_consume(q, lambda _c, m, _p, b: seen.append(b), auto_ack=True)
    assert ch.flow(False) is False
    pub = publisher(conn)
    for i in range(3):
        pub.basic_publish("", q, b"%d" % i)
    assert ready(ch, q) == 3  # a round trip on the paused channel: still nothing delivered
    conn.process_data_events(time_limit=0)
    assert seen == []
    assert ch.flow(True) is True
    pump(conn, lambda: len(seen) == 3)
    assert seen == [b"0", b"1", b"2"]
    assert ready(ch, q) == 0
