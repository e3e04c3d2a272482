"""Routing end to end: real publishes (pika, aio-pika) read back with basic.get
or consumers, against the session broker.

The routing tables (binding keys x routing keys -> queues reached) are
RabbitMQ 3.10's answers to the same publishes. Publishing channels use
publisher confirms so a publish has been routed when basic_publish returns.
"""
from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest
from pika.exceptions import UnroutableError

from helpers import channel_error, confirm_channel, drain, new_queue, publish_sync, send, unique, wait_for


# -- helpers ----------------------------------------------------------------


@pytest.fixture
def ch(conn):
    return confirm_channel(conn)


def bodies(ch, queue: str) -> list[bytes]:
    return [body for _m, _p, body in drain(ch, queue)]


# -- routing tables, checked end to end -----------------------------------------------
# Each case: exchange type, {queue label: [(binding key, binding arguments)]},
# [(routing key, headers, labels of the queues the message must reach)].

TOPIC_KEYS = ["#", "*", "a.#", "#.b", "a.*.b", "a.#.b", "", "a..b", "*.*", "#.#", "a.*", "*.a", "a",
              "#.a.#", "*.#", "a.b"]
TOPIC = [
    ("", ["", "#", "#.#"]),
    ("a", ["#", "#.#", "#.a.#", "*", "*.#", "a", "a.#"]),
    ("b", ["#", "#.#", "#.b", "*", "*.#"]),
    ("a.b", ["#", "#.#", "#.a.#", "#.b", "*.#", "*.*", "a.#", "a.#.b", "a.*", "a.b"]),
    ("a..b", ["#", "#.#", "#.a.#", "#.b", "*.#", "a.#", "a.#.b", "a.*.b", "a..b"]),
    ("a.x.b", ["#", "#.#", "#.a.#", "#.b", "*.#", "a.#", "a.#.b", "a.*.b"]),
    ("a.x.y.b", ["#", "#.#", "#.a.#", "#.b", "*.#", "a.#", "a.#.b"]),
    (".", ["#", "#.#", "*.#", "*.*"]),
    ("a.", ["#", "#.#", "#.a.#", "*.#", "*.*", "a.#", "a.*"]),
    (".b", ["#", "#.#", "#.b", "*.#", "*.*"]),
    ("b.a", ["#", "#.#", "#.a.#", "*.#", "*.*", "*.a"]),
    ("a.b.c", ["#", "#.#", "#.a.#", "*.#", "a.#"]),
    ("x.a.y", ["#", "#.#", "#.a.#", "*.#"]),
    ("A.B", ["#", "#.#", "*.#", "*.*"]),
    ("..", ["#", "#.#", "*.#"]),
    ("a.b.b", ["#", "#.#", "#.a.#", "#.b", "*.#", "a.#", "a.#.b", "a.*.b"]),
]

HEADERS_BINDINGS = {
    "all": [("", {"x-match": "all", "a": 1, "b": "2"})],
    "any": [("", {"x-match": "any", "a": 1, "b": "2"})],
    "all-with-x": [("", {"x-match": "all-with-x", "x-f": "1", "a": 1})],
    "any-with-x": [("", {"x-match": "any-with-x", "x-f": "1"})],
    "no-args": [("", {})],
    "all-empty": [("", {"x-match": "all"})],
    "any-empty": [("", {"x-match": "any"})],
    "any-only-x": [("", {"x-match": "any", "x-f": "1"})],
    "all-only-x": [("", {"x-match": "all", "x-f": "1"})],
    "default-all": [("", {"a": 1})],
    "keyed": [("rk", {"x-match": "any", "c": 3})],
    "two": [("", {"x-match": "all", "a": 1}), ("", {"x-match": "all", "b": "2"})],
    "void": [("", {"x-match": "any", "v": None})],
}
ALWAYS = ["all-empty", "all-only-x", "no-args"]  # match any headers at all (x- keys are ignored)
HEADERS = [
    ("other", {}, ALWAYS),
    ("rk", {"a": 1}, ALWAYS + ["any", "default-all", "two"]),
    ("other", {"a": 1, "b": "2"}, ALWAYS + ["all", "any", "default-all", "two"]),
    ("rk", {"a": 1, "b": 2}, ALWAYS + ["any", "default-all", "two"]),
    ("other", {"x-f": "1"}, ALWAYS + ["any-with-x"]),
    ("rk", {"x-f": "1", "a": 1}, ALWAYS + ["all-with-x", "any", "any-with-x", "default-all", "two"]),
    ("other", {"b": "2", "c": 3}, ALWAYS + ["any", "keyed", "two"]),
    ("rk", {"a": "1"}, ALWAYS),
    ("other", {"a": True}, ALWAYS),
    ("rk", {"v": "anything"}, ALWAYS + ["void"]),
    ("other", {"v": None}, ALWAYS + ["void"]),
    ("rk", None, ALWAYS),
]

ROUTING_TABLES = [
    pytest.param(
        "direct",
        {"a": [("a", None)], "a|b": [("a", None), ("b", None)], "empty": [("", None)], "A": [("A", None)],
         "a.b": [("a.b", None)], "*": [("*", None)], "#": [("#", None)]},
        [("a", None, ["a", "a|b"]), ("b", None, ["a|b"]), ("", None, ["empty"]), ("A", None, ["A"]),
         ("a.b", None, ["a.b"]), ("*", None, ["*"]), ("#", None, ["#"]), ("c", None, []),
         (" a", None, []), ("a ", None, [])],
        id="direct",
    ),
    pytest.param(
        "fanout",
        {"x": [("x", None)], "empty": [("", None)], "x|y": [("x", None), ("y", None)]},
        [(key, None, ["empty", "x", "x|y"]) for key in ("", "x", "y", "zzz")],
        id="fanout",
    ),
    pytest.param(
        "topic",
        {key: [(key, None)] for key in TOPIC_KEYS},
        [(key, None, labels) for key, labels in TOPIC],
        id="topic",
    ),
    pytest.param("headers", HEADERS_BINDINGS, HEADERS, id="headers"),
]


@pytest.mark.parametrize("xtype, bindings, publishes", ROUTING_TABLES)
def test_routing_table(ch, xtype, bindings, publishes):
    exchange = unique("x-" + xtype)
    ch.exchange_declare(exchange, xtype, auto_delete=True)
    queues = {}
    for label, binds in bindings.items():
        queues[label] = new_queue(ch)
        for key, arguments in binds:
            ch.queue_bind(queues[label], exchange, key, arguments=arguments)
    for index, (key, headers, _labels) in enumerate(publishes):
        send(ch, exchange, key, b"%d" % index, headers)
    reached = {index: [] for index in range(len(publishes))}
    for label, queue in queues.items():
        for method, _props, body in drain(ch, queue):
            reached[int(body)].append(label)
            assert method.exchange == exchange
            assert method.routing_key == publishes[int(body)][0]
    actual = [(key, headers, sorted(reached[i])) for i, (key, headers, _l) in enumerate(publishes)]
    expected = [(key, headers, sorted(labels)) for key, headers, labels in publishes]
    assert actual == expected


# -- default exchange ---------------------------------------------------------------


def test_default_exchange_routes_by_queue_name(ch):
    first, second = new_queue(ch), new_queue(ch)
    send(ch, "", first, b"to-first")
    send(ch, "", second, b"to-second")
    send(ch, "", first.upper(), b"wrong-case")
    send(ch, "", unique("q-missing"), b"nowhere")
    assert bodies(ch, first) == [b"to-first"]
    assert bodies(ch, second) == [b"to-second"]
    send(ch, "", first, b"again")
    method, _props, body = ch.basic_get(first, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == ("", first, b"again")


async def test_default_exchange_with_aio_pika(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(exclusive=True)
    await channel.default_exchange.publish(aio_pika.Message(b"hello", headers={"h": "v"}), queue.name)
    message = await queue.get(no_ack=True)
    assert (message.body, message.headers, message.exchange, message.routing_key) == (
        b"hello", {"h": "v"}, "", queue.name)


# -- direct / fanout / topic / headers through a consumer ------------------------------------


async def test_each_exchange_type_delivers_to_a_consumer(aconn):
    channel = await aconn.channel()
    received: asyncio.Queue = asyncio.Queue()
    queue = await channel.declare_queue(exclusive=True)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await received.put((message.exchange, message.routing_key, message.body))
        await message.ack()

    await queue.consume(on_message)
    direct = await channel.declare_exchange(unique("x-d"), "direct", auto_delete=True)
    fanout = await channel.declare_exchange(unique("x-f"), "fanout", auto_delete=True)
    topic = await channel.declare_exchange(unique("x-t"), "topic", auto_delete=True)
    headers = await channel.declare_exchange(unique("x-h"), "headers", auto_delete=True)
    await queue.bind(direct, "key")
    await queue.bind(fanout, "ignored")
    await queue.bind(topic, "stock.*.nyse")
    await queue.bind(headers, arguments={"x-match": "any", "kind": "report", "size": "big"})

    await direct.publish(aio_pika.Message(b"d-miss"), "other")
    await direct.publish(aio_pika.Message(b"d"), "key")
    await fanout.publish(aio_pika.Message(b"f"), "anything")
    await topic.publish(aio_pika.Message(b"t-miss"), "stock.ibm.nasdaq")
    await topic.publish(aio_pika.Message(b"t"), "stock.ibm.nyse")
    await headers.publish(aio_pika.Message(b"h-miss", headers={"kind": "note"}), "")
    await headers.publish(aio_pika.Message(b"h", headers={"kind": "report"}), "whatever")
    got = [await asyncio.wait_for(received.get(), 5) for _ in range(4)]
    assert got == [
        (direct.name, "key", b"d"),
        (fanout.name, "anything", b"f"),
        (topic.name, "stock.ibm.nyse", b"t"),
        (headers.name, "whatever", b"h"),
    ]
    assert received.empty()


def test_queue_bound_twice_gets_one_copy(ch):
    exchange = unique("x-t")
    ch.exchange_declare(exchange, "topic", auto_delete=True)
    queue = new_queue(ch)
    for key in ("a.*", "*.b", "#", "a.b"):
        ch.queue_bind(queue, exchange, key)
    send(ch, exchange, "a.b", b"once")
    assert bodies(ch, queue) == [b"once"]


# -- alternate exchanges ----------------------------------------------------------------


def test_unroutable_message_goes_to_the_alternate_exchange(ch):
    ae, main = unique("x-ae"), unique("x-main")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(main, "direct", auto_delete=True, arguments={"alternate-exchange": ae})
    routed, spill = new_queue(ch), new_queue(ch)
    ch.queue_bind(routed, main, "known")
    ch.queue_bind(spill, ae)
    send(ch, main, "known", b"routed")
    send(ch, main, "unknown", b"unroutable")
    assert bodies(ch, routed) == [b"routed"]
    [(method, _props, body)] = drain(ch, spill)
    # it keeps the exchange it was published to and its routing key
    assert (method.exchange, method.routing_key, body) == (main, "unknown", b"unroutable")


def test_chain_of_alternate_exchanges(ch):
    first, second, third = unique("x-ae1"), unique("x-ae2"), unique("x-ae3")
    ch.exchange_declare(third, "fanout", auto_delete=True)
    ch.exchange_declare(second, "direct", auto_delete=True, arguments={"alternate-exchange": third})
    ch.exchange_declare(first, "topic", auto_delete=True, arguments={"alternate-exchange": second})
    at_second, at_third = new_queue(ch), new_queue(ch)
    ch.queue_bind(at_second, second, "k2")
    ch.queue_bind(at_third, third)
    send(ch, first, "k2", b"caught-by-second")
    send(ch, first, "k3", b"caught-by-third")
    assert bodies(ch, at_second) == [b"caught-by-second"]
    [(method, _props, body)] = drain(ch, at_third)
    assert (method.exchange, method.routing_key, body) == (first, "k3", b"caught-by-third")


def test_alternate_exchange_of_an_exchange_reached_through_a_binding(ch):
    front, back, ae = unique("x-front"), unique("x-back"), unique("x-ae")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(back, "direct", arguments={"alternate-exchange": ae})
    ch.exchange_declare(front, "direct", auto_delete=True)
    ch.exchange_bind(back, front, "k")
    spill = new_queue(ch)
    ch.queue_bind(spill, ae)
    send(ch, front, "k", b"reached-back")  # back routes it nowhere: its AE takes it
    send(ch, front, "other", b"front-only")  # front has no AE: dropped
    assert bodies(ch, spill) == [b"reached-back"]
    ch.exchange_delete(back)


def test_missing_or_cyclic_alternate_exchange_drops_and_returns(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method.reply_code, body)))
    lonely, a, b = unique("x"), unique("x-a"), unique("x-b")
    ch.exchange_declare(lonely, "direct", auto_delete=True, arguments={"alternate-exchange": unique("x-missing")})
    ch.exchange_declare(a, "direct", auto_delete=True, arguments={"alternate-exchange": b})
    ch.exchange_declare(b, "direct", auto_delete=True, arguments={"alternate-exchange": a})
    ch.basic_publish(lonely, "k", b"missing-ae", mandatory=True)
    ch.basic_publish(a, "k", b"cyclic-ae", mandatory=True)
    wait_for(lambda: conn.process_data_events(0) or len(returned) == 2)
    assert returned == [(312, b"missing-ae"), (312, b"cyclic-ae")]
    ch.exchange_delete(lonely)
    ch.exchange_delete(a)
    ch.exchange_delete(b)


def test_message_taken_by_the_alternate_exchange_is_not_returned(ch):
    ae, main = unique("x-ae"), unique("x-main")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(main, "direct", auto_delete=True, arguments={"alternate-exchange": ae})
    spill = new_queue(ch)
    ch.queue_bind(spill, ae)
    ch.basic_publish(main, "nowhere", b"m", mandatory=True)  # confirm mode: raises if returned
    assert bodies(ch, spill) == [b"m"]


# -- CC and BCC ------------------------------------------------------------------------


def test_cc_and_bcc_reach_each_queue_once_and_bcc_is_stripped(ch):
    main, cc, bcc, both = (new_queue(ch) for _ in range(4))
    headers = {"CC": [cc, both, main], "BCC": [bcc, both], "other": "kept"}
    send(ch, "", main, b"m", headers)
    for queue in (main, cc, bcc, both):
        [(method, props, body)] = drain(ch, queue)
        assert (method.exchange, method.routing_key, body) == ("", main, b"m")
        assert props.headers == {"CC": [cc, both, main], "other": "kept"}


def test_cc_and_bcc_route_through_the_exchange_bindings(ch):
    exchange = unique("x-t")
    ch.exchange_declare(exchange, "topic", auto_delete=True)
    orders, audit, billing = new_queue(ch), new_queue(ch), new_queue(ch)
    ch.queue_bind(orders, exchange, "orders.#")
    ch.queue_bind(audit, exchange, "audit.*")
    ch.queue_bind(billing, exchange, "billing")
    send(ch, exchange, "orders.new", b"m", {"CC": ["audit.orders", "nothing.here"], "BCC": ["billing"]})
    assert bodies(ch, orders) == [b"m"]
    [(_m, audit_props, _b)] = drain(ch, audit)
    [(_m, billing_props, _b)] = drain(ch, billing)
    assert audit_props.headers == billing_props.headers == {"CC": ["audit.orders", "nothing.here"]}


def test_bcc_only_routes_and_mandatory_is_satisfied_by_cc(conn, ch):
    target = new_queue(ch)
    # the routing key reaches nothing; the BCC'd queue still counts as routed
    ch.basic_publish("", unique("q-missing"), b"bcc", pika.BasicProperties(headers={"BCC": [target]}),
                     mandatory=True)
    [(_method, props, body)] = drain(ch, target)
    assert (body, props.headers) == (b"bcc", {})


@pytest.mark.parametrize(
    "header, value, type_name",
    [("CC", "just-a-string", "longstr"), ("BCC", "just-a-string", "longstr"), ("CC", {"a": "b"}, "table")],
)
def test_cc_or_bcc_that_is_not_an_array_is_406(conn, header, value, type_name):
    ch = conn.channel()
    queue = new_queue(ch)
    assert channel_error(publish_sync, ch, "", queue, b"m", {header: value}) == (
        406, 'PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"%s",%s}' % (header, type_name))
    assert conn.is_open


def test_non_string_cc_entries_are_ignored(ch):
    main, cc = new_queue(ch), new_queue(ch)
    send(ch, "", main, b"m", {"CC": [1, cc, True]})
    assert bodies(ch, main) == [b"m"]
    assert bodies(ch, cc) == [b"m"]


async def test_cc_and_bcc_with_aio_pika(aconn):
    channel = await aconn.channel()
    main = await channel.declare_queue(exclusive=True)
    copy = await channel.declare_queue(exclusive=True)
    hidden = await channel.declare_queue(exclusive=True)
    await channel.default_exchange.publish(
        aio_pika.Message(b"hello", headers={"CC": [copy.name], "BCC": [hidden.name]}), main.name)
    for queue in (main, copy, hidden):
        message = await queue.get(no_ack=True)
        assert (message.body, message.routing_key, message.headers) == (b"hello", main.name, {"CC": [copy.name]})
        assert await queue.get(fail=False) is None


# -- exchange-to-exchange graphs ----------------------------------------------------------


def test_exchange_to_exchange_cycle_delivers_once_per_queue(ch):
    a, b, c = unique("x-a"), unique("x-b"), unique("x-c")
    for name in (a, b, c):
        ch.exchange_declare(name, "fanout")
    ch.exchange_bind(b, a)
    ch.exchange_bind(c, b)
    ch.exchange_bind(a, c)  # a -> b -> c -> a
    on_all, on_c = new_queue(ch), new_queue(ch)
    for name in (a, b, c):
        ch.queue_bind(on_all, name)
    ch.queue_bind(on_c, c)
    for entry in (a, b, c):
        send(ch, entry, "k", entry.encode())
    assert bodies(ch, on_all) == [a.encode(), b.encode(), c.encode()]
    assert bodies(ch, on_c) == [a.encode(), b.encode(), c.encode()]
    for name in (a, b, c):
        ch.exchange_delete(name)


def test_exchange_to_exchange_diamond_delivers_once(ch):
    top, left, right, bottom = (unique("x-" + n) for n in ("top", "left", "right", "bottom"))
    ch.exchange_declare(top, "topic")
    ch.exchange_declare(left, "direct")
    ch.exchange_declare(right, "fanout")
    ch.exchange_declare(bottom, "direct")
    ch.exchange_bind(left, top, "a.*")
    ch.exchange_bind(right, top, "#")
    ch.exchange_bind(bottom, left, "a.b")
    ch.exchange_bind(bottom, right, "")
    queue = new_queue(ch)
    ch.queue_bind(queue, bottom, "a.b")
    send(ch, top, "a.b", b"diamond")
    send(ch, top, "a.c", b"no")
    [(method, _props, body)] = drain(ch, queue)
    assert (method.exchange, method.routing_key, body) == (top, "a.b", b"diamond")
    for name in (top, left, right, bottom):
        ch.exchange_delete(name)


# -- mandatory ----------------------------------------------------------------------------


def test_mandatory_unroutable_is_returned_with_its_body(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, props, body)))
    key = unique("nowhere")
    ch.basic_publish("amq.direct", key, b"payload", pika.BasicProperties(headers={"h": 1}, message_id="id-1"),
                     mandatory=True)
    ch.basic_publish("amq.direct", key, b"not-mandatory")  # dropped silently
    wait_for(lambda: conn.process_data_events(0) or returned)
    [(method, props, body)] = returned
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
        312, "NO_ROUTE", "amq.direct", key)
    assert (body, props.headers, props.message_id) == (b"payload", {"h": 1}, "id-1")
    # the channel stays open
    ch.basic_publish("", new_queue(ch), b"ok", mandatory=True)
    conn.process_data_events(0)
    assert len(returned) == 1


def test_mandatory_unroutable_with_confirms_raises_unroutable(ch):
    with pytest.raises(UnroutableError) as info:
        ch.basic_publish("", unique("q-missing"), b"lost", mandatory=True)
    [message] = info.value.messages
    assert (message.method.reply_code, message.method.reply_text, message.body) == (312, "NO_ROUTE", b"lost")


async def test_mandatory_unroutable_with_aio_pika(aconn):
    channel = await aconn.channel(on_return_raises=False)
    returned = []
    channel.return_callbacks.add(lambda _channel, message: returned.append(message))
    key = unique("nowhere")
    result = await channel.default_exchange.publish(aio_pika.Message(b"back"), key, mandatory=True)
    assert (result.delivery.reply_code, result.delivery.reply_text, result.body) == (312, "NO_ROUTE", b"back")
    assert [(m.body, m.exchange, m.routing_key) for m in returned] == [(b"back", "", key)]
