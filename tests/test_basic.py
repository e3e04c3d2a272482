"""basic.publish / basic.get / ack / nack / reject / recover, seen through real clients.

pika and aio-pika for what a user does; a small raw-socket client (pamqp does the
encoding) where the client libraries refuse the request (immediate=true) or hide
what must be checked (exact frames, exact content-header bytes).
Reply codes and texts are RabbitMQ 3.10's.
"""
from __future__ import annotations

import datetime
import decimal
import struct

import aio_pika
import pika
import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import header as pheader
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, UnroutableError

from amqp_raw import CLIENT_CAPABILITIES, RawClient
from helpers import channel_error, confirm_channel, declare, drain, publish_n, ready, unique, wait_for

FRAME_MAX = 131072  # hutch's default, negotiated by pika and the raw client


# -- helpers ------------------------------------------------------------------


@pytest.fixture
def raw(broker):
    """A raw-socket client through the handshake, no channel open yet."""
    with RawClient.connected(broker.port, capabilities=CLIENT_CAPABILITIES) as client:
        yield client


def get_all(channel, queue: str) -> list:
    """basic.get (manual ack) until get-empty: [(GetOk, body), ...]."""
    return [(method, body) for method, _props, body in drain(channel, queue, auto_ack=False)]


# -- publish: bodies ----------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, FRAME_MAX - 8, FRAME_MAX - 7, 1 << 20])
def test_body_sizes_round_trip_pika(conn, size):
    ch = confirm_channel(conn)
    q = declare(ch)
    body = bytes(i % 251 for i in range(size))
    ch.basic_publish("", q, body)
    method, _props, got = ch.basic_get(q, auto_ack=True)
    assert method is not None and got == body
    assert ch.basic_get(q)[0] is None


async def test_body_sizes_round_trip_aio_pika(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("basic"), exclusive=True)
        bodies = [b"", b"x", b"y" * (FRAME_MAX - 8), bytes(range(256)) * 4096]
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
        received = []
        async with queue.iterator() as it:
            async for message in it:
                received.append(message.body)
                await message.ack()
                if len(received) == len(bodies):
                    break
        assert received == bodies


@pytest.mark.parametrize(
    "size, frames",
    [(0, 0), (1, 1), (FRAME_MAX - 8, 1), (FRAME_MAX - 7, 2), (1 << 20, 9)],
)
def test_delivered_body_is_split_at_frame_max(raw, size, frames):
    raw.open_channel()
    q = raw.declare_queue()
    body = bytes(i % 253 for i in range(size))
    raw.publish(q, body)
    raw.send_frame(commands.Basic.Get(queue=q, no_ack=True), 1)
    raw.expect(commands.Basic.GetOk, 1)
    _header, parts = raw.read_content(1)
    assert len(parts) == frames
    assert all(len(p) <= FRAME_MAX - 8 for p in parts)
    assert b"".join(parts) == body


def test_body_published_in_small_frames_is_reassembled(raw):
    raw.open_channel()
    q = raw.declare_queue()
    body = bytes(i % 241 for i in range(10_000))
    raw.publish(q, body, chunk=7)
    raw.send_frame(commands.Basic.Get(queue=q, no_ack=True), 1)
    raw.expect(commands.Basic.GetOk, 1)
    _header, parts = raw.read_content(1)
    assert parts == [body]


# -- publish: properties and headers ------------------------------------------

PIKA_HEADERS = {
    "str": "héllo wörld",
    "bytes": b"\x00\xff\x10",
    "true": True,
    "false": False,
    "int": -7,
    "int32_max": 2**31 - 1,
    "long": -(2**40),
    "decimal": decimal.Decimal("12.345"),
    "decimal_whole": decimal.Decimal("42"),
    "timestamp": datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc),
    "void": None,
    "array": [1, "two", [3, [4]], {"k": "v"}, None, True, b"\x01"],
    "empty_array": [],
    "empty_table": {},
    "nested": {"a": {"b": {"c": [True, b"x", {"d": decimal.Decimal("0.5")}]}}},
}


def test_all_properties_and_headers_round_trip_pika(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=PIKA_HEADERS,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="reply.queue",
        expiration="600000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="kind",
        user_id="guest",
        app_id="app",
    )
    ch.basic_publish("", q, b"payload", sent)
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"payload"
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"):
        assert getattr(props, name) == getattr(sent, name), name
    assert props.headers == PIKA_HEADERS


def test_no_properties_round_trip_as_none(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    ch.basic_publish("", q, b"bare")
    _method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"bare"
    assert props.headers is None and props.content_type is None and props.delivery_mode is None


async def test_all_properties_round_trip_aio_pika(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("basic"), exclusive=True)
        headers = {
            "s": "v", "i": 1, "l": 2**40, "b": True, "t": {"n": [1, "x", {"deep": None}]}, "x": bytearray(b"\x00"),
        }
        stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
        await channel.default_exchange.publish(
            aio_pika.Message(
                b"body",
                headers=headers,
                content_type="text/plain",
                content_encoding="utf-8",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=3,
                correlation_id="c",
                reply_to="r",
                expiration=60,
                message_id="m",
                timestamp=stamp,
                type="t",
                user_id="guest",
                app_id="a",
            ),
            routing_key=queue.name,
        )
        message = await queue.get(no_ack=True, timeout=5)
        assert message.body == b"body"
        assert message.headers == headers
        assert (message.content_type, message.content_encoding) == ("text/plain", "utf-8")
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert (message.priority, message.correlation_id, message.reply_to) == (3, "c", "r")
        assert message.expiration == 60
        assert (message.message_id, message.type, message.user_id, message.app_id) == ("m", "t", "guest", "a")
        assert message.timestamp == stamp


def _short(text: str) -> bytes:
    data = text.encode("utf-8")
    return bytes((len(data),)) + data


def _long(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _table(items: list[tuple[str, bytes]]) -> bytes:
    return _long(b"".join(_short(k) + v for k, v in items))


# Every field type RabbitMQ's table parser knows, hand-encoded (no client library).
ALL_FIELD_TYPES = _table([
    ("bool", b"t\x01"),
    ("int8", b"b" + struct.pack(">b", -5)),
    ("uint8", b"B\xfa"),
    ("int16", b"s" + struct.pack(">h", -300)),
    ("uint16", b"u" + struct.pack(">H", 60000)),
    ("int32", b"I" + struct.pack(">i", -70000)),
    ("uint32", b"i" + struct.pack(">I", 4_000_000_000)),
    ("int64", b"l" + struct.pack(">q", -(2**40))),
    ("float", b"f" + struct.pack(">f", 1.5)),
    ("double", b"d" + struct.pack(">d", 2.25)),
    ("decimal", b"D\x02" + struct.pack(">i", 12345)),
    ("longstr", b"S" + _long("héllo".encode())),
    ("binary", b"x" + _long(b"\x00\xff")),
    ("timestamp", b"T" + struct.pack(">Q", 1_700_000_000)),
    ("void", b"V"),
    ("array", b"A" + _long(b"I" + struct.pack(">i", 1) + b"S" + _long(b"two") + b"F" + _table([("k", b"t\x00")]))),
    ("nested", b"F" + _table([("inner", b"F" + _table([("deep", b"A" + _long(b"V"))]))])),
    ("empty", b"F" + _table([])),
])


def test_content_header_is_delivered_byte_identical(raw):
    raw.open_channel()
    q = raw.declare_queue()
    body = b"hello"
    props = b"".join([
        _short("application/json"), _short("gzip"), ALL_FIELD_TYPES, b"\x02", b"\x07", _short("corr"),
        _short("reply"), _short("60000"), _short("mid"), struct.pack(">Q", 1_234_567_890), _short("type"),
        _short("guest"), _short("app"), _short(""),
    ])
    header = struct.pack(">HHQH", 60, 0, len(body), 0xFFFC) + props
    raw.publish(q, body, header=header)
    raw.send_frame(commands.Basic.Consume(queue=q, consumer_tag="c", no_ack=True), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    raw.expect(commands.Basic.Deliver, 1)
    got_header, parts = raw.read_content(1)
    assert got_header == header
    assert parts == [body]
    raw.send_frames((1, commands.Basic.Publish(exchange="", routing_key=q)),
                    (1, pheader.ContentHeader(0, 3, commands.Basic.Properties(headers={"k": "v"}))),
                    (1, pbody.ContentBody(b"abc")))
    deliver = raw.expect(commands.Basic.Deliver, 1)
    assert (deliver.delivery_tag, deliver.redelivered, deliver.routing_key) == (2, False, q)
    got_header, parts = raw.read_content(1)
    assert got_header == pheader.ContentHeader(0, 3, commands.Basic.Properties(headers={"k": "v"})).marshal()
    assert parts == [b"abc"]


# -- publish: returns and errors ----------------------------------------------


def test_mandatory_unroutable_is_returned_with_312(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, props, body)))
    key = unique("nowhere")
    q = declare(ch)

    def returns(n):
        def check():
            conn.process_data_events(time_limit=0.05)
            return len(returned) >= n
        return check

    ch.basic_publish("amq.direct", key, b"lost", pika.BasicProperties(message_id="m1"), mandatory=True)
    wait_for(returns(1))
    method, props, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", key)
    assert (props.message_id, body) == ("m1", b"lost")
    # a routable mandatory publish and an unroutable non-mandatory one return
    # nothing: the next return is the marker published after them
    ch.basic_publish("", q, b"kept", mandatory=True)
    ch.basic_publish("amq.direct", key, b"dropped")
    ch.basic_publish("", key, b"marker", mandatory=True)
    wait_for(returns(2))
    assert [(m.exchange, m.routing_key, b) for m, _p, b in returned[1:]] == [("", key, b"marker")]
    assert ready(ch, q) == 1


def test_mandatory_unroutable_with_confirms_raises_unroutable(conn):
    ch = confirm_channel(conn)
    with pytest.raises(UnroutableError) as info:
        ch.basic_publish("amq.direct", unique("nowhere"), b"lost", mandatory=True)
    [message] = info.value.messages
    assert (message.method.reply_code, message.method.reply_text, message.body) == (312, "NO_ROUTE", b"lost")
    q = declare(ch)
    ch.basic_publish("", q, b"kept", mandatory=True)
    assert ready(ch, q) == 1


def test_immediate_publish_closes_connection_540(raw):
    raw.open_channel()
    q = raw.declare_queue()
    raw.publish(q, b"now", immediate=True)
    close = raw.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")
    assert (close.class_id, close.method_id) == (60, 40)
    raw.send_frame(commands.Connection.CloseOk(), 0)
    assert raw.at_eof()


def test_publish_to_missing_exchange_closes_channel_404(conn):
    ch = conn.channel()
    name = unique("missing-x")
    ch.basic_publish(name, "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(unique("never"), exclusive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no exchange '%s' in vhost '/'" % name
    ch2 = confirm_channel(conn)
    q = declare(ch2)
    ch2.basic_publish("", q, b"fine")
    assert ready(ch2, q) == 1


def test_max_message_size_refuses_larger_body_406(start_broker):
    small = start_broker("--max-message-size", "1000")
    connection = pika.BlockingConnection(pika.URLParameters(small.url))
    try:
        ch = confirm_channel(connection)
        q = declare(ch)
        ch.basic_publish("", q, b"a" * 1000)
        assert ready(ch, q) == 1
        with pytest.raises(ChannelClosedByBroker) as info:
            ch.basic_publish("", q, b"a" * 1001)
            ready(ch, q)
        assert info.value.reply_code == 406
        assert info.value.reply_text == (
            "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000")
        assert connection.is_open
        ch2 = confirm_channel(connection)
        assert ready(ch2, q) == 1
        method, _props, body = ch2.basic_get(q, auto_ack=True)
        assert body == b"a" * 1000 and method.message_count == 0
    finally:
        if connection.is_open:
            connection.close()


def test_max_message_size_close_names_basic_publish(start_broker):
    small = start_broker("--max-message-size", "1000")
    raw = RawClient.connected(small.port, capabilities=CLIENT_CAPABILITIES)
    try:
        raw.open_channel()
        raw.open_channel(2)
        raw.publish("q", b"b" * 1001)
        close = raw.expect(commands.Channel.Close, 1)
        assert (close.reply_code, close.class_id, close.method_id) == (406, 60, 40)
        raw.send_frame(commands.Channel.CloseOk(), 1)
        q = raw.declare_queue(2)
        assert q.startswith("amq.gen-")
    finally:
        raw.close()


# -- basic.get ----------------------------------------------------------------


def test_get_reports_message_count_then_get_empty(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    got = get_all(ch, q)
    assert [(m.message_count, body) for m, body in got] == [(2, b"m0"), (1, b"m1"), (0, b"m2")]
    assert [m.delivery_tag for m, _ in got] == [1, 2, 3]
    assert all(m.redelivered is False and m.exchange == "" and m.routing_key == q for m, _ in got)
    assert ch.basic_get(q) == (None, None, None)


def test_get_empty_on_raw_socket(raw):
    raw.open_channel()
    q = raw.declare_queue()
    raw.send_frame(commands.Basic.Get(queue=q), 1)
    raw.expect(commands.Basic.GetEmpty, 1)


async def test_get_with_aio_pika(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("basic"), exclusive=True)
        assert await queue.get(fail=False, timeout=5) is None
        await channel.default_exchange.publish(aio_pika.Message(b"one"), routing_key=queue.name)
        message = await queue.get(timeout=5)
        assert message.body == b"one" and message.redelivered is False
        await message.ack()
        assert await queue.get(fail=False, timeout=5) is None


def test_empty_queue_name_means_last_declared_queue(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    method, _props, body = ch.basic_get("", auto_ack=True)
    assert (body, method.routing_key) == (b"a", q)
    seen = []
    ch.basic_consume("", lambda _c, m, _p, b: seen.append(b), auto_ack=True)
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or seen)
    assert seen == [b"b"]


def test_empty_queue_name_without_declared_queue_is_404(conn):
    ch = confirm_channel(conn)
    assert channel_error(ch.basic_get, "") == (404, "NOT_FOUND - no previously declared queue")
    # the shortcut is per channel: a queue declared on another channel does not count
    other = conn.channel()
    declare(other)
    ch2 = confirm_channel(conn)
    with pytest.raises(ChannelClosedByBroker) as info:
        ch2.basic_consume("", lambda *a: None)
    assert info.value.reply_code == 404


# -- ack / nack / reject ------------------------------------------------------


def test_ack_multiple_acks_up_to_the_tag(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 5)
    got = [ch.basic_get(q)[0] for _ in range(5)]
    assert [m.delivery_tag for m in got] == [1, 2, 3, 4, 5]
    ch.basic_ack(3, multiple=True)
    ch.basic_recover(requeue=True)
    again = get_all(ch, q)
    assert [body for _, body in again] == [b"m3", b"m4"]
    assert all(m.redelivered for m, _ in again)


def test_ack_multiple_with_tag_zero_acks_everything(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 4)
    assert len(get_all(ch, q)) == 4
    ch.basic_ack(0, multiple=True)
    ch.basic_recover(requeue=True)  # nothing is left to redeliver
    assert ch.basic_get(q)[0] is None
    ch.basic_ack(4)
    with pytest.raises(ChannelClosedByBroker) as info:
        ready(ch, q)
    assert info.value.reply_text == "PRECONDITION_FAILED - unknown delivery tag 4"


def test_requeued_messages_keep_original_order_and_are_redelivered(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 6)
    got = [ch.basic_get(q)[0] for _ in range(4)]  # m0..m3 unacked, m4 m5 ready
    ch.basic_reject(got[2].delivery_tag, requeue=True)
    ch.basic_reject(got[0].delivery_tag, requeue=True)
    ch.basic_nack(got[1].delivery_tag, requeue=True)
    again = get_all(ch, q)
    assert [(body, m.redelivered) for m, body in again] == [
        (b"m0", True), (b"m1", True), (b"m2", True), (b"m4", False), (b"m5", False)]
    ch.basic_ack(got[3].delivery_tag)  # m3 is still outstanding under its old tag
    ch.basic_ack(0, multiple=True)
    assert ready(ch, q) == 0


def test_nack_multiple_requeues_up_to_the_tag(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 5)
    got = [ch.basic_get(q)[0] for _ in range(4)]
    ch.basic_nack(got[2].delivery_tag, multiple=True, requeue=True)
    again = get_all(ch, q)
    assert [(body, m.redelivered) for m, body in again] == [
        (b"m0", True), (b"m1", True), (b"m2", True), (b"m4", False)]
    ch.basic_nack(0, multiple=True, requeue=True)  # everything, m3 included
    assert [body for _, body in get_all(ch, q)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


@pytest.mark.parametrize("how", ["nack", "nack_multiple", "reject"])
def test_nack_and_reject_without_requeue_drop(conn, how):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 3)
    got = [ch.basic_get(q)[0] for _ in range(3)]
    if how == "nack_multiple":
        ch.basic_nack(got[-1].delivery_tag, multiple=True, requeue=False)
    else:
        for m in got:
            getattr(ch, "basic_" + how)(m.delivery_tag, requeue=False)
    assert ready(ch, q) == 0
    ch.basic_recover(requeue=True)  # nothing is left outstanding
    assert ch.basic_get(q)[0] is None


@pytest.mark.parametrize("how", ["ack", "nack", "reject"])
def test_unknown_delivery_tag_is_406(conn, how):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 1)
    ch.basic_get(q)
    getattr(ch, "basic_" + how)(9)
    assert channel_error(ready, ch, q) == (406, "PRECONDITION_FAILED - unknown delivery tag 9")
    other = conn.channel()
    wait_for(lambda: ready(other, q) == 1)  # the closed channel's unacked message went back


def test_reject_tag_zero_is_unknown(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    ch.basic_reject(0)
    assert channel_error(ready, ch, q) == (406, "PRECONDITION_FAILED - unknown delivery tag 0")


def test_double_ack_is_406(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 2)
    method = ch.basic_get(q)[0]
    ch.basic_ack(method.delivery_tag)
    ch.basic_ack(method.delivery_tag)
    assert channel_error(ready, ch, q) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")
    assert conn.is_open


def test_ack_of_no_ack_delivery_is_unknown(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 1)
    method = ch.basic_get(q, auto_ack=True)[0]
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as info:
        ready(ch, q)
    assert info.value.reply_text == "PRECONDITION_FAILED - unknown delivery tag 1"


# -- recover ------------------------------------------------------------------


def test_recover_requeue_redelivers_unacked_to_consumer(conn):
    ch = confirm_channel(conn)
    q = declare(ch)
    publish_n(ch, q, 3)
    seen = []
    ch.basic_consume(q, lambda _c, m, _p, b: seen.append((b, m.redelivered, m.delivery_tag)))
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(seen) == 3)
    ch.basic_recover(requeue=True)
    wait_for(lambda: conn.process_data_events(time_limit=0.05) or len(seen) == 6)
    assert seen == [
        (b"m0", False, 1), (b"m1", False, 2), (b"m2", False, 3),
        (b"m0", True, 4), (b"m1", True, 5), (b"m2", True, 6),
    ]


def test_recover_requeue_false_closes_connection_540(conn):
    ch = confirm_channel(conn)
    with pytest.raises(ConnectionClosedByBroker) as info:
        ch.basic_recover(requeue=False)
    assert (info.value.reply_code, info.value.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")
