"""Exchanges through real clients (pika and aio-pika) against the session broker.

Declare (every type, passive, flags, arguments), the equivalence check on
redeclare, reserved names, delete (if-unused), the default exchange,
exchange-to-exchange bindings, auto-delete, the predeclared amq.* exchanges and
internal exchanges. Reply codes and texts are RabbitMQ 3.10's, as observed with
the same client calls against it.
"""
from __future__ import annotations

import aio_pika
import aiormq.exceptions
import pytest
from pika.exceptions import ConnectionClosedByBroker

from helpers import channel_error, exists, inequivalent, new_queue, publish_sync, unique


TYPES = ("direct", "fanout", "topic", "headers")
PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
DEFAULT_X = "ACCESS_REFUSED - operation not permitted on the default exchange"


# -- helpers ----------------------------------------------------------------


@pytest.fixture
def ch(conn):
    return conn.channel()


def get_body(ch, queue: str) -> bytes | None:
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    return body if method is not None else None


# -- declare ------------------------------------------------------------------


@pytest.mark.parametrize("xtype", TYPES)
def test_declare_each_type_then_passive_and_type_is_remembered(conn, ch, xtype):
    name = unique("x-" + xtype)
    assert ch.exchange_declare(name, xtype).method.NAME == "Exchange.DeclareOk"
    assert ch.exchange_declare(name, xtype).method.NAME == "Exchange.DeclareOk"  # same props: fine
    assert ch.exchange_declare(name, passive=True).method.NAME == "Exchange.DeclareOk"
    other = "fanout" if xtype != "fanout" else "direct"
    assert channel_error(conn.channel().exchange_declare, name, other) == (
        406, inequivalent("exchange", name, "type", "received '%s' but current is '%s'" % (other, xtype)))
    ch.exchange_delete(name)


def test_passive_declare_of_missing_exchange_is_404_and_channel_only(conn, ch):
    name = unique("x-missing")
    assert channel_error(ch.exchange_declare, name, passive=True) == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % name)
    assert not ch.is_open
    assert conn.is_open
    assert conn.channel().exchange_declare("amq.direct", passive=True)


def test_passive_declare_ignores_type_and_flags(conn, ch):
    name = unique("x")
    ch.exchange_declare(name, "topic", durable=True, arguments={"alternate-exchange": "ae"})
    # passive checks existence only: no type validation, no equivalence check
    ch.exchange_declare(name, "nosuch-type", passive=True)
    ch.exchange_declare(name, "direct", passive=True, durable=False, auto_delete=True, internal=True)
    # ... and an unknown type on a missing exchange is a 404, not a 503
    missing = unique("x-missing")
    assert channel_error(conn.channel().exchange_declare, missing, "nosuch-type", passive=True) == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % missing)
    ch.exchange_delete(name)


@pytest.mark.parametrize(
    "flag, first, second",
    [
        ("durable", False, True),
        ("durable", True, False),
        ("auto_delete", False, True),
        ("auto_delete", True, False),
        ("internal", False, True),
        ("internal", True, False),
    ],
)
def test_redeclare_with_different_flag_is_406(conn, ch, flag, first, second):
    name = unique("x")
    ch.exchange_declare(name, "direct", **{flag: first})
    ch.exchange_declare(name, "direct", **{flag: first})
    detail = "received '%s' but current is '%s'" % (str(second).lower(), str(first).lower())
    code, text = channel_error(conn.channel().exchange_declare, name, "direct", **{flag: second})
    assert (code, text) == (406, inequivalent("exchange", name, flag, detail))
    assert exists(conn, "exchange", name)
    conn.channel().exchange_delete(name)


@pytest.mark.parametrize(
    "first, second, detail",
    [
        (None, "ae", "received the value 'ae' of type 'longstr' but current is none"),
        ("ae", None, "received none but current is the value 'ae' of type 'longstr'"),
        ("ae", "ae2", "received 'ae2' but current is 'ae'"),
    ],
    ids=["added", "removed", "changed"],
)
def test_redeclare_with_different_alternate_exchange_is_406(conn, ch, first, second, detail):
    name = unique("x")
    ch.exchange_declare(name, "direct", arguments={} if first is None else {"alternate-exchange": first})
    arguments = {} if second is None else {"alternate-exchange": second}
    assert channel_error(conn.channel().exchange_declare, name, "direct", arguments=arguments) == (
        406, inequivalent("exchange", name, "alternate-exchange", detail))
    conn.channel().exchange_delete(name)


def test_alternate_exchange_argument_must_be_a_string(ch):
    name = unique("x")
    assert channel_error(ch.exchange_declare, name, "direct", arguments={"alternate-exchange": 1}) == (
        406, "PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' "
        "in exchange '%s' in vhost '/'" % name)


async def test_declare_with_arguments_and_other_arguments_are_ignored_on_redeclare(aconn):
    channel = await aconn.channel()
    name = unique("x")
    x = await channel.declare_exchange(name, "headers", arguments={"foo": "a", "x-bar": 1})
    assert x.name == name
    # arguments other than alternate-exchange take no part in the equivalence check
    await channel.declare_exchange(name, "headers", arguments={"foo": "b"})
    await channel.declare_exchange(name, "headers")
    await channel.declare_exchange(name, passive=True)
    await x.delete()


async def test_aio_pika_redeclare_with_other_type_closes_the_channel(aconn):
    channel = await aconn.channel()
    name = unique("x")
    await channel.declare_exchange(name, "fanout")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_exchange(name, "topic")
    assert info.value.args[0] == inequivalent("exchange", name, "type", "received 'topic' but current is 'fanout'")
    assert channel.is_closed
    channel = await aconn.channel()
    await channel.exchange_delete(name)


# -- reserved names and unknown types ---------------------------------------------


def test_new_exchange_with_amq_prefix_is_403(conn, ch):
    name = "amq." + unique("x")
    assert channel_error(ch.exchange_declare, name, "direct") == (
        403, "ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'" % name)
    assert not exists(conn, "exchange", name)


def test_redeclare_predeclared_with_matching_properties_is_ok(conn, ch):
    ch.exchange_declare("amq.direct", "direct", durable=True)
    assert channel_error(conn.channel().exchange_declare, "amq.direct", "direct") == (
        406, inequivalent("exchange", "amq.direct", "durable", "received 'false' but current is 'true'"))
    assert channel_error(conn.channel().exchange_declare, "amq.direct", "fanout", durable=True) == (
        406, inequivalent("exchange", "amq.direct", "type", "received 'fanout' but current is 'direct'"))


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_unknown_exchange_type_closes_the_connection_503(conn, ch, existing):
    name = "amq.direct" if existing else unique("x")
    with pytest.raises(ConnectionClosedByBroker) as info:
        ch.exchange_declare(name, "nosuch", durable=True)
    assert (info.value.reply_code, info.value.reply_text) == (503, "COMMAND_INVALID - unknown exchange type 'nosuch'")
    assert not conn.is_open


async def test_aio_pika_unknown_exchange_type_closes_the_connection(broker):
    connection = await aio_pika.connect(broker.url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ConnectionCommandInvalid) as info:
            await channel.declare_exchange(unique("x"), "x-no-such-type")
        assert info.value.args[0] == "COMMAND_INVALID - unknown exchange type 'x-no-such-type'"
    finally:
        await connection.close()


# -- delete ---------------------------------------------------------------------


def test_delete_removes_the_exchange_and_its_bindings(conn, ch):
    name = unique("x")
    ch.exchange_declare(name, "fanout")
    queue = new_queue(ch)
    ch.queue_bind(queue, name)
    publish_sync(ch, name, "k", b"before")
    assert get_body(ch, queue) == b"before"
    assert ch.exchange_delete(name).method.NAME == "Exchange.DeleteOk"
    assert not exists(conn, "exchange", name)
    ch.exchange_declare(name, "fanout")  # same name again: the old binding is gone
    publish_sync(ch, name, "k", b"after")
    assert get_body(ch, queue) is None
    ch.exchange_delete(name)


def test_delete_missing_exchange_is_ok(ch):
    assert ch.exchange_delete(unique("x-missing")).method.NAME == "Exchange.DeleteOk"
    assert ch.exchange_delete(unique("x-missing"), if_unused=True).method.NAME == "Exchange.DeleteOk"
    assert ch.is_open


def test_delete_if_unused_with_a_queue_binding_is_406(conn, ch):
    name = unique("x")
    ch.exchange_declare(name, "direct")
    queue = new_queue(ch)
    ch.queue_bind(queue, name, "k")
    assert channel_error(conn.channel().exchange_delete, name, if_unused=True) == (
        406, "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use" % name)
    assert exists(conn, "exchange", name)
    ch.queue_unbind(queue, name, "k")
    ch.exchange_delete(name, if_unused=True)
    assert not exists(conn, "exchange", name)


def test_delete_if_unused_counts_bindings_as_source_only(conn, ch):
    source, destination = unique("x-src"), unique("x-dst")
    ch.exchange_declare(source, "direct")
    ch.exchange_declare(destination, "direct")
    ch.exchange_bind(destination, source, "k")
    assert channel_error(conn.channel().exchange_delete, source, if_unused=True) == (
        406, "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use" % source)
    # the destination of a binding is "unused": it goes, and the binding with it
    ch.exchange_delete(destination, if_unused=True)
    assert not exists(conn, "exchange", destination)
    ch.exchange_delete(source, if_unused=True)
    assert not exists(conn, "exchange", source)


def test_delete_if_unused_of_unbound_exchange(conn, ch):
    name = unique("x")
    ch.exchange_declare(name, "topic")
    ch.exchange_delete(name, if_unused=True)
    assert not exists(conn, "exchange", name)


@pytest.mark.parametrize("name", [x for x, _ in PREDECLARED] + ["amq.no-such-exchange"])
def test_amq_exchanges_cannot_be_deleted(conn, ch, name):
    assert channel_error(ch.exchange_delete, name) == (
        403, "ACCESS_REFUSED - deletion of system exchange '%s' in vhost '/' not allowed" % name)
    if name != "amq.no-such-exchange":
        assert exists(conn, "exchange", name)


# -- the default exchange -----------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        lambda ch, q, x: ch.exchange_declare("", "direct"),
        lambda ch, q, x: ch.exchange_declare("", "direct", durable=True),
        lambda ch, q, x: ch.exchange_declare("", "direct", passive=True),
        lambda ch, q, x: ch.exchange_delete(""),
        lambda ch, q, x: ch.queue_bind(q, "", q),
        lambda ch, q, x: ch.queue_unbind(q, "", q),
        lambda ch, q, x: ch.exchange_bind(x, "", "k"),
        lambda ch, q, x: ch.exchange_bind("", x, "k"),
        lambda ch, q, x: ch.exchange_unbind(x, "", "k"),
        lambda ch, q, x: ch.exchange_unbind("", x, "k"),
    ],
    ids=["declare", "declare-durable", "declare-passive", "delete", "queue-bind", "queue-unbind",
         "e2e-bind-source", "e2e-bind-destination", "e2e-unbind-source", "e2e-unbind-destination"],
)
def test_default_exchange_cannot_be_declared_deleted_or_bound(conn, ch, operation):
    queue = new_queue(ch)
    x = unique("x")
    ch.exchange_declare(x, "direct", auto_delete=True)
    assert channel_error(operation, conn.channel(), queue, x) == (403, DEFAULT_X)
    # still routes by queue name
    publish_sync(ch, "", queue, b"still-there")
    assert get_body(ch, queue) == b"still-there"
    ch.exchange_delete(x)


# -- exchange-to-exchange bindings -----------------------------------------------------


async def test_exchange_to_exchange_chain_bind_and_unbind(aconn):
    channel = await aconn.channel()
    first = await channel.declare_exchange(unique("x-a"), "direct")
    second = await channel.declare_exchange(unique("x-b"), "topic")
    third = await channel.declare_exchange(unique("x-c"), "fanout")
    queue = await channel.declare_queue(exclusive=True)
    await second.bind(first, "k1")
    await third.bind(second, "k1.#")
    await queue.bind(third)

    await first.publish(aio_pika.Message(b"through"), "k1")
    await first.publish(aio_pika.Message(b"wrong key"), "k2")
    message = await queue.get(no_ack=True)
    assert (message.body, message.exchange, message.routing_key) == (b"through", first.name, "k1")
    assert await queue.get(fail=False) is None

    await third.unbind(second, "k1.#")
    await first.publish(aio_pika.Message(b"after unbind"), "k1")
    assert await queue.get(fail=False) is None
    # unbinding again (the binding is gone) is fine
    await third.unbind(second, "k1.#")
    for x in (first, second, third):
        await x.delete()


def test_exchange_bind_with_missing_source_or_destination_is_404(conn, ch):
    missing = unique("x-missing")
    assert channel_error(ch.exchange_bind, missing, "amq.direct", "k") == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % missing)
    assert channel_error(conn.channel().exchange_bind, "amq.direct", missing, "k") == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % missing)
    # unbind is idempotent, even with neither end present
    assert conn.channel().exchange_unbind(unique("x"), unique("x"), "k").method.NAME == "Exchange.UnbindOk"


# -- auto-delete ------------------------------------------------------------------


def test_auto_delete_exchange_goes_when_its_last_queue_binding_is_removed(conn, ch):
    name = unique("x-ad")
    ch.exchange_declare(name, "direct", auto_delete=True)
    queue = new_queue(ch)
    ch.queue_bind(queue, name, "a")
    ch.queue_bind(queue, name, "b")
    ch.queue_unbind(queue, name, "a")
    assert exists(conn, "exchange", name)
    ch.queue_unbind(queue, name, "b")
    assert not exists(conn, "exchange", name)


def test_auto_delete_exchange_goes_when_its_bound_queue_is_deleted(conn, ch):
    name = unique("x-ad")
    ch.exchange_declare(name, "fanout", auto_delete=True)
    queue = unique("q")
    ch.queue_declare(queue)
    ch.queue_bind(queue, name)
    assert exists(conn, "exchange", name)
    ch.queue_delete(queue)
    assert not exists(conn, "exchange", name)


def test_auto_delete_exchange_goes_when_its_last_exchange_binding_is_removed(conn, ch):
    source, destination = unique("x-ad"), unique("x")
    ch.exchange_declare(source, "direct", auto_delete=True)
    ch.exchange_declare(destination, "direct", auto_delete=True)
    ch.exchange_bind(destination, source, "k")
    ch.exchange_unbind(destination, source, "k")
    assert not exists(conn, "exchange", source)
    # the destination of the binding had no bindings of its own: it stays
    assert exists(conn, "exchange", destination)
    ch.exchange_delete(destination)


def test_auto_delete_cascades_through_exchange_bindings(conn, ch):
    upstream, downstream = unique("x-ad-up"), unique("x-ad-down")
    ch.exchange_declare(upstream, "direct", auto_delete=True)
    ch.exchange_declare(downstream, "fanout", auto_delete=True)
    ch.exchange_bind(downstream, upstream, "k")
    queue = unique("q")
    ch.queue_declare(queue)
    ch.queue_bind(queue, downstream)
    # the queue goes -> downstream loses its last binding and goes -> so does
    # the binding upstream -> downstream, and upstream goes too
    ch.queue_delete(queue)
    assert not exists(conn, "exchange", downstream)
    assert not exists(conn, "exchange", upstream)


def test_auto_delete_exchange_that_was_never_bound_stays(conn, ch):
    name = unique("x-ad")
    ch.exchange_declare(name, "topic", auto_delete=True)
    # declaring, publishing, and a failed bind leave it in place
    publish_sync(ch, name, "a.b")
    assert channel_error(conn.channel().queue_bind, unique("q-missing"), name, "k")[0] == 404
    assert exists(conn, "exchange", name)
    ch.exchange_delete(name)


# -- predeclared exchanges -------------------------------------------------------------


@pytest.mark.parametrize("name, xtype", PREDECLARED)
def test_predeclared_exchange_exists_with_its_type(conn, ch, name, xtype):
    ch.exchange_declare(name, passive=True)
    ch.exchange_declare(name, xtype, durable=True)  # equivalent: ok
    other = "fanout" if xtype != "fanout" else "direct"
    assert channel_error(conn.channel().exchange_declare, name, other, durable=True) == (
        406, inequivalent("exchange", name, "type", "received '%s' but current is '%s'" % (other, xtype)))


@pytest.mark.parametrize("name, xtype", PREDECLARED)
def test_predeclared_exchange_routes_as_its_type(ch, name, xtype):
    queue = new_queue(ch)
    tag = unique("k")
    if xtype == "direct":
        ch.queue_bind(queue, name, tag)
        sends = [(tag, None, True), (tag + ".x", None, False)]
    elif xtype == "fanout":
        ch.queue_bind(queue, name, tag)
        sends = [("anything-" + tag, None, True)]
    elif xtype == "topic":
        ch.queue_bind(queue, name, tag + ".*")
        sends = [(tag + ".one", None, True), (tag + ".one.two", None, False), (tag, None, False)]
    else:
        ch.queue_bind(queue, name, "", arguments={"x-match": "all", "tag": tag})
        sends = [("", {"tag": tag}, True), ("", {"tag": tag + "-other"}, False)]
    for index, (key, headers, _routed) in enumerate(sends):
        publish_sync(ch, name, key, b"%d" % index, headers)
    expected = [b"%d" % i for i, (_k, _h, routed) in enumerate(sends) if routed]
    received = []
    while (body := get_body(ch, queue)) is not None:
        received.append(body)
    if xtype == "fanout":
        # other tests' publishes to amq.fanout reach this queue too
        received = [b for b in received if b in expected]
    assert received == expected


# -- internal exchanges ---------------------------------------------------------------


def test_publish_to_internal_exchange_is_403(conn, ch):
    name = unique("x-int")
    ch.exchange_declare(name, "fanout", internal=True)
    assert channel_error(publish_sync, ch, name, "k") == (
        403, "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'" % name)
    assert conn.is_open
    conn.channel().exchange_delete(name)


async def test_internal_exchange_is_reachable_through_an_exchange_binding(aconn):
    channel = await aconn.channel()
    front = await channel.declare_exchange(unique("x-front"), "direct", auto_delete=True)
    inner = await channel.declare_exchange(unique("x-int"), "fanout", internal=True, auto_delete=True)
    queue = await channel.declare_queue(exclusive=True)
    await inner.bind(front, "k")
    await queue.bind(inner)
    await front.publish(aio_pika.Message(b"via-front"), "k")
    message = await queue.get(no_ack=True)
    assert (message.body, message.exchange, message.routing_key) == (b"via-front", front.name, "k")
    # aio-pika refuses this client-side; go one layer down to send it anyway
    underlay = await channel.get_underlay_channel()
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await underlay.basic_publish(b"direct", exchange=inner.name, routing_key="k")
    assert info.value.args[0] == "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'" % inner.name


def test_publish_to_missing_exchange_is_404(ch):
    name = unique("x-missing")
    assert channel_error(publish_sync, ch, name, "k") == (404, "NOT_FOUND - no exchange '%s' in vhost '/'" % name)


# -- headers bindings are validated -------------------------------------------------------


@pytest.mark.parametrize(
    "x_match, text",
    [
        ("bogus", 'Invalid x-match field value <<"bogus">>; expected all, any, all-with-x, or any-with-x'),
        ("", "Invalid x-match field value <<>>; expected all, any, all-with-x, or any-with-x"),
        (1, "Invalid x-match field type signedint (value 1); expected longstr"),
    ],
)
def test_headers_binding_with_invalid_x_match_is_406(ch, x_match, text):
    queue = new_queue(ch)
    name = unique("x-h")
    ch.exchange_declare(name, "headers", auto_delete=True)
    assert channel_error(ch.queue_bind, queue, name, "", arguments={"x-match": x_match, "a": 1}) == (
        406, "PRECONDITION_FAILED - " + text)
