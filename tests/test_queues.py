"""Queues through real clients (pika and aio-pika) against the session broker.

Declare (server-named, passive, durable, exclusive, auto-delete), the
equivalence check on redeclare, the reserved prefix, exclusivity across
connections, auto-delete, bind/unbind, purge, delete (if-unused, if-empty),
DeclareOk counts and the empty-queue-name shortcut. Reply codes and texts are
RabbitMQ 3.10's, as observed with the same client calls against it.
"""
from __future__ import annotations

import re

import aio_pika
import aiormq.exceptions
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from helpers import channel_error, confirm_channel, connect, exists, inequivalent, publish_n, unique, wait_for


SERVER_NAMED = re.compile(r"^amq\.gen-[A-Za-z0-9_-]{22}$")


def locked(name: str) -> str:
    return (
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. It could be "
        "originally declared on another connection or the exclusive property value does not match that of "
        "the original declaration." % name
    )


NO_PREVIOUS = (404, "NOT_FOUND - no previously declared queue")


# -- helpers ----------------------------------------------------------------


@pytest.fixture
def other(broker):
    """A second connection (exclusive queues belong to one connection)."""
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        yield connection


@pytest.fixture
def ch(conn):
    return confirm_channel(conn)


def passive_code(conn, name: str) -> int:
    """0 when a passive declare of `name` succeeds, else the channel close code."""
    try:
        conn.channel().queue_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        return exc.reply_code
    return 0


def counts(ch, name: str) -> tuple[int, int]:
    ok = ch.queue_declare(name, passive=True).method
    return ok.message_count, ok.consumer_count


# -- declare ------------------------------------------------------------------


def test_server_named_queue(ch):
    first = ch.queue_declare("", exclusive=True).method
    second = ch.queue_declare("", exclusive=True).method
    assert SERVER_NAMED.match(first.queue), first.queue
    assert SERVER_NAMED.match(second.queue), second.queue
    assert first.queue != second.queue
    assert (first.message_count, first.consumer_count) == (0, 0)
    publish_n(ch, first.queue, 2)
    assert counts(ch, first.queue) == (2, 0)


async def test_server_named_queue_with_aio_pika(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(exclusive=True)
    assert SERVER_NAMED.match(queue.name), queue.name
    await channel.default_exchange.publish(aio_pika.Message(b"hello"), queue.name)
    message = await queue.get(no_ack=True)
    assert (message.body, message.routing_key) == (b"hello", queue.name)


@pytest.mark.parametrize("suffix", ["é ü", "tab\there", "quote'\"", "漢字"])
def test_any_utf8_name_works_for_queues_and_exchanges(conn, ch, suffix):
    """RabbitMQ accepts any UTF-8 name: declare, publish, get and return all
    carry it back unchanged."""
    queue, exchange = unique("q") + suffix, unique("x") + suffix
    returned = []
    assert ch.queue_declare(queue, exclusive=True).method.queue == queue
    ch.exchange_declare(exchange, "direct", auto_delete=True)
    ch.queue_bind(queue, exchange, routing_key=suffix)
    ch.basic_publish(exchange, suffix, b"body")
    method, _props, body = ch.basic_get(queue, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == (exchange, suffix, b"body")
    plain = conn.channel()  # `ch` confirms: pika would raise on the return
    plain.add_on_return_callback(lambda _ch, method, _props, _body: returned.append(method))
    plain.basic_publish(exchange, "nowhere " + suffix, b"x", mandatory=True)
    wait_for(lambda: conn.process_data_events(0.05) or returned)
    assert (returned[0].exchange, returned[0].routing_key) == (exchange, "nowhere " + suffix)


def test_passive_declare(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    publish_n(ch, name, 3)
    ok = ch.queue_declare(name, passive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 3, 0)
    # passive ignores the other flags
    assert ch.queue_declare(name, passive=True, durable=True, auto_delete=True).method.queue == name
    missing = unique("q-missing")
    assert channel_error(conn.channel().queue_declare, missing, passive=True) == (
        404, "NOT_FOUND - no queue '%s' in vhost '/'" % missing)


@pytest.mark.parametrize(
    "flag, first, second",
    [("durable", False, True), ("durable", True, False), ("auto_delete", False, True), ("auto_delete", True, False)],
)
def test_redeclare_with_different_flag_is_406(conn, ch, flag, first, second):
    name = unique("q")
    ch.queue_declare(name, **{flag: first})
    ch.queue_declare(name, **{flag: first})  # equivalent: ok
    detail = "received '%s' but current is '%s'" % (str(second).lower(), str(first).lower())
    assert channel_error(conn.channel().queue_declare, name, **{flag: second}) == (
        406, inequivalent("queue", name, flag, detail))
    assert exists(conn, "queue", name)
    conn.channel().queue_delete(name)


@pytest.mark.parametrize(
    "first, second, detail",
    [
        (10, 20, "received '20' but current is '10'"),
        (None, 20, "received the value '20' of type 'signedint' but current is none"),
        (10, None, "received none but current is the value '10' of type 'signedint'"),
    ],
    ids=["changed", "added", "removed"],
)
def test_redeclare_with_different_x_max_length_is_406(conn, ch, first, second, detail):
    name = unique("q")
    ch.queue_declare(name, exclusive=True, arguments={} if first is None else {"x-max-length": first})
    arguments = {} if second is None else {"x-max-length": second}
    assert channel_error(conn.channel().queue_declare, name, exclusive=True, arguments=arguments) == (
        406, inequivalent("queue", name, "x-max-length", detail))


def test_redeclare_with_different_message_ttl_is_406(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True, arguments={"x-message-ttl": 60000})
    assert channel_error(conn.channel().queue_declare, name, exclusive=True, arguments={"x-message-ttl": 1000}) == (
        406, inequivalent("queue", name, "x-message-ttl", "received '1000' but current is '60000'"))


async def test_other_arguments_are_ignored_on_redeclare(aconn):
    channel = await aconn.channel()
    name = unique("q")
    queue = await channel.declare_queue(name, exclusive=True, arguments={"foo": 1, "x-custom": "a"})
    again = await channel.declare_queue(name, exclusive=True, arguments={"foo": 2})
    assert again.name == queue.name == name
    await channel.declare_queue(name, exclusive=True)


async def test_aio_pika_inequivalent_redeclare_closes_the_channel(aconn):
    channel = await aconn.channel()
    name = unique("q")
    await channel.declare_queue(name, auto_delete=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_queue(name, durable=True, auto_delete=True)
    assert info.value.args[0] == inequivalent("queue", name, "durable", "received 'true' but current is 'false'")
    assert channel.is_closed
    channel = await aconn.channel()
    assert await channel.queue_delete(name)


def test_amq_prefix_is_reserved(conn, ch):
    name = "amq." + unique("q")
    assert channel_error(ch.queue_declare, name) == (
        403, "ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'" % name)
    # passive on such a name is a plain lookup
    assert channel_error(conn.channel().queue_declare, name, passive=True) == (
        404, "NOT_FOUND - no queue '%s' in vhost '/'" % name)


def test_durable_queue_declare(conn, ch):
    name = unique("q-durable")
    ok = ch.queue_declare(name, durable=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    ch.queue_declare(name, durable=True)
    assert ch.queue_delete(name).method.message_count == 0
    assert not exists(conn, "queue", name)


# -- exclusive queues ---------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        lambda ch, q: ch.queue_declare(q, exclusive=True),
        lambda ch, q: ch.queue_declare(q),
        lambda ch, q: ch.queue_declare(q, passive=True),
        lambda ch, q: ch.basic_consume(q, lambda *args: None),
        lambda ch, q: ch.basic_get(q),
        lambda ch, q: ch.queue_purge(q),
        lambda ch, q: ch.queue_delete(q),
        lambda ch, q: ch.queue_bind(q, "amq.direct", "k"),
        lambda ch, q: ch.queue_unbind(q, "amq.direct", "bound"),
    ],
    ids=["declare-exclusive", "declare", "declare-passive", "consume", "get", "purge", "delete", "bind",
         "unbind"],
)
def test_exclusive_queue_is_locked_to_its_connection(ch, other, operation):
    name = unique("q-excl")
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, "amq.direct", "bound")
    assert channel_error(operation, other.channel(), name) == (405, locked(name))
    # still there and usable from the owner
    publish_n(ch, name, 1)
    assert counts(ch, name) == (1, 0)


def test_unbind_of_missing_binding_on_someone_elses_exclusive_queue_is_ok(ch, other):
    name = unique("q-excl")
    ch.queue_declare(name, exclusive=True)
    # as in RabbitMQ: no binding, nothing to check
    assert other.channel().queue_unbind(name, "amq.direct", "never-bound").method.NAME == "Queue.UnbindOk"


def test_exclusive_queue_is_usable_from_another_channel_of_the_same_connection(conn, ch):
    name = unique("q-excl")
    ch.queue_declare(name, exclusive=True)
    second = confirm_channel(conn)
    publish_n(second, name, 1)
    method, _props, body = second.basic_get(name, auto_ack=True)
    assert body == b"m0"
    second.basic_consume(name, lambda *args: None)
    assert counts(ch, name) == (0, 1)


@pytest.mark.parametrize(
    "first, second",
    [({"exclusive": True}, {}), ({"auto_delete": True}, {"exclusive": True, "auto_delete": True})],
    ids=["exclusive-then-not", "not-then-exclusive"],
)
def test_redeclare_with_different_exclusivity_on_the_same_connection_is_405(conn, ch, first, second):
    name = unique("q")
    ch.queue_declare(name, **first)
    assert channel_error(conn.channel().queue_declare, name, **second) == (405, locked(name))
    conn.channel().queue_delete(name)


def test_exclusive_queue_goes_when_its_connection_closes(broker, conn):
    name = unique("q-excl")
    owner = connect(broker.port)
    owner.channel().queue_declare(name, exclusive=True)
    assert channel_error(conn.channel().queue_declare, name, passive=True) == (405, locked(name))
    owner.close()
    wait_for(lambda: not exists(conn, "queue", name))
    # the name is free again
    conn.channel().queue_declare(name, exclusive=True)


async def test_exclusive_queue_goes_when_aio_pika_connection_closes(broker, conn):
    owner = await aio_pika.connect(broker.url)
    channel = await owner.channel()
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind("amq.fanout")
    assert passive_code(conn, queue.name) == 405
    await owner.close()
    wait_for(lambda: passive_code(conn, queue.name) == 404)


# -- auto-delete ---------------------------------------------------------------------


def test_auto_delete_queue_goes_after_its_last_consumer_is_cancelled(conn, ch):
    name = unique("q-ad")
    ch.queue_declare(name, auto_delete=True)
    second_channel = conn.channel()
    first = ch.basic_consume(name, lambda *args: None)
    second = second_channel.basic_consume(name, lambda *args: None)
    assert counts(ch, name) == (0, 2)
    ch.basic_cancel(first)
    assert counts(ch, name) == (0, 1)
    ch.basic_cancel(second)  # a tag this channel does not know: no-op
    assert counts(ch, name) == (0, 1)
    second_channel.basic_cancel(second)
    wait_for(lambda: not exists(conn, "queue", name))


def test_auto_delete_queue_that_never_had_a_consumer_stays(conn, ch):
    name = unique("q-ad")
    ch.queue_declare(name, auto_delete=True)
    publish_n(ch, name, 2)
    ch.basic_get(name, auto_ack=True)
    assert exists(conn, "queue", name)
    assert counts(ch, name) == (1, 0)
    ch.queue_delete(name)


async def test_auto_delete_queue_goes_when_the_consuming_channel_closes(aconn, conn):
    channel = await aconn.channel()
    name = unique("q-ad")
    queue = await channel.declare_queue(name, auto_delete=True)
    async def on_message(message):
        pass

    await queue.consume(on_message)
    assert counts(conn.channel(), name) == (0, 1)
    await channel.close()
    wait_for(lambda: not exists(conn, "queue", name))


# -- bind / unbind ---------------------------------------------------------------------


def test_bind_and_unbind(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    key = unique("k")
    ch.queue_bind(name, "amq.direct", key)
    ch.queue_bind(name, "amq.direct", key)  # twice: still one binding
    ch.basic_publish("amq.direct", key, b"bound")
    assert counts(ch, name) == (1, 0)
    ch.queue_unbind(name, "amq.direct", key)
    ch.basic_publish("amq.direct", key, b"unbound")
    assert counts(ch, name) == (1, 0)
    assert ch.basic_get(name, auto_ack=True)[2] == b"bound"


def test_unbind_of_missing_binding_exchange_or_queue_is_ok(ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    assert ch.queue_unbind(name, "amq.direct", "never-bound").method.NAME == "Queue.UnbindOk"
    assert ch.queue_unbind(name, unique("x-missing"), "k").method.NAME == "Queue.UnbindOk"
    assert ch.queue_unbind(unique("q-missing"), "amq.direct", "k").method.NAME == "Queue.UnbindOk"
    assert ch.is_open


def test_bind_to_missing_exchange_or_queue_is_404(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    missing_x, missing_q = unique("x-missing"), unique("q-missing")
    assert channel_error(ch.queue_bind, name, missing_x, "k") == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % missing_x)
    assert channel_error(conn.channel().queue_bind, missing_q, "amq.direct", "k") == (
        404, "NOT_FOUND - no queue '%s' in vhost '/'" % missing_q)


async def test_bind_and_unbind_with_aio_pika(aconn, conn):
    channel = await aconn.channel()
    exchange = await channel.declare_exchange(unique("x"), "topic", auto_delete=True)
    queue = await channel.declare_queue(exclusive=True)
    await queue.bind(exchange, "a.*")
    await exchange.publish(aio_pika.Message(b"one"), "a.b")
    assert (await queue.get(no_ack=True)).body == b"one"
    await queue.unbind(exchange, "a.*")
    # the exchange was auto-delete and lost its last binding
    assert channel_error(conn.channel().exchange_declare, exchange.name, passive=True) == (
        404, "NOT_FOUND - no exchange '%s' in vhost '/'" % exchange.name)


# -- purge -----------------------------------------------------------------------------


def test_purge_returns_ready_count_and_leaves_unacked(ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    publish_n(ch, name, 5)
    tags = [ch.basic_get(name)[0].delivery_tag for _ in range(2)]
    assert ch.queue_purge(name).method.message_count == 3
    assert counts(ch, name) == (0, 0)
    assert ch.queue_purge(name).method.message_count == 0
    # the two unacked ones were not purged: rejected, they come back
    for tag in tags:
        ch.basic_reject(tag, requeue=True)
    assert counts(ch, name) == (2, 0)
    assert ch.queue_purge(name).method.message_count == 2


async def test_purge_with_aio_pika(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(exclusive=True)
    for i in range(4):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), queue.name)
    result = await queue.purge()
    assert result.message_count == 4
    assert await queue.get(fail=False) is None


# -- delete ----------------------------------------------------------------------------


def test_delete_returns_ready_message_count(conn, ch):
    name = unique("q")
    ch.queue_declare(name)
    publish_n(ch, name, 3)
    ch.basic_get(name)  # one unacked: not counted
    assert counts(ch, name) == (2, 0)
    assert ch.queue_delete(name).method.message_count == 2
    assert not exists(conn, "queue", name)


def test_delete_missing_queue_is_ok(ch):
    ok = ch.queue_delete(unique("q-missing")).method
    assert (ok.NAME, ok.message_count) == ("Queue.DeleteOk", 0)
    assert ch.queue_delete(unique("q-missing"), if_unused=True, if_empty=True).method.message_count == 0


def test_delete_if_unused_with_a_consumer_is_406(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    tag = ch.basic_consume(name, lambda *args: None)
    assert channel_error(conn.channel().queue_delete, name, if_unused=True) == (
        406, "PRECONDITION_FAILED - queue '%s' in vhost '/' in use" % name)
    assert exists(conn, "queue", name)
    ch.basic_cancel(tag)
    assert ch.queue_delete(name, if_unused=True).method.message_count == 0
    assert not exists(conn, "queue", name)


def test_delete_if_empty_with_messages_is_406(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    publish_n(ch, name, 1)
    assert channel_error(conn.channel().queue_delete, name, if_empty=True) == (
        406, "PRECONDITION_FAILED - queue '%s' in vhost '/' not empty" % name)
    assert exists(conn, "queue", name)
    ch.basic_get(name, auto_ack=True)
    assert ch.queue_delete(name, if_empty=True, if_unused=True).method.message_count == 0
    assert not exists(conn, "queue", name)


def test_delete_removes_bindings(conn, ch):
    name = unique("q")
    key = unique("k")
    ch.queue_declare(name)
    ch.queue_bind(name, "amq.direct", key)
    ch.queue_delete(name)
    ch.queue_declare(name, exclusive=True)  # same name again: not bound any more
    ch.basic_publish("amq.direct", key, b"x")
    assert counts(ch, name) == (0, 0)


async def test_delete_with_aio_pika(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("q"))
    await channel.default_exchange.publish(aio_pika.Message(b"x"), queue.name)
    await channel.default_exchange.publish(aio_pika.Message(b"y"), queue.name)
    result = await queue.delete(if_unused=False, if_empty=False)
    assert result.message_count == 2
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await channel.declare_queue(queue.name, passive=True)


# -- DeclareOk counts -----------------------------------------------------------------


def test_declare_ok_counts_ready_messages_and_consumers(conn, ch):
    name = unique("q")
    ok = ch.queue_declare(name, exclusive=True).method
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    publish_n(ch, name, 4)
    ch.basic_get(name)  # unacked: not in message_count
    ok = ch.queue_declare(name, exclusive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=1)
    delivered = []
    consumer.basic_consume(name, lambda c, m, p, b: delivered.append(b))
    consumer.basic_consume(name, lambda c, m, p, b: delivered.append(b))
    wait_for(lambda: conn.process_data_events(0) or len(delivered) == 2)
    ok = ch.queue_declare(name, exclusive=True).method
    assert (ok.message_count, ok.consumer_count) == (1, 2)
    consumer.close()
    # closing the consumers' channel requeues their two and removes them
    ok = ch.queue_declare(name, exclusive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)


# -- the empty queue name shortcut ---------------------------------------------------------


def test_empty_queue_name_means_the_last_declared_queue(conn, ch):
    name = unique("q")
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind("", "amq.direct", name + ".k")  # queue "" -> name
    ch.queue_bind("", "amq.direct")  # queue "" and key "" -> key is the queue's name
    ch.basic_publish("amq.direct", name + ".k", b"by-key")
    ch.basic_publish("amq.direct", name, b"by-name")
    ch.basic_publish("amq.direct", "", b"empty-key")
    assert ch.basic_get("", auto_ack=True)[2] == b"by-key"
    assert ch.basic_get("", auto_ack=True)[2] == b"by-name"
    assert ch.basic_get("", auto_ack=True)[0] is None
    publish_n(ch, name, 2)
    assert ch.queue_purge("").method.message_count == 2
    delivered = []
    ch.basic_consume("", lambda c, m, p, b: delivered.append(b), auto_ack=True)
    ch.basic_publish("", name, b"consumed")
    wait_for(lambda: conn.process_data_events(0) or delivered)
    assert delivered == [b"consumed"]
    ch.basic_cancel(ch.consumer_tags[0])
    ch.queue_unbind("", "amq.direct", name + ".k")
    ch.basic_publish("amq.direct", name + ".k", b"unbound")
    publish_n(ch, name, 1)
    assert ch.queue_delete("").method.message_count == 1
    assert not exists(conn, "queue", name)


def test_empty_queue_name_follows_server_named_queue_and_is_per_channel(conn, ch):
    generated = ch.queue_declare("", exclusive=True).method.queue
    publish_n(ch, generated, 2)
    assert ch.queue_purge("").method.message_count == 2
    # another channel has declared nothing
    assert channel_error(conn.channel().queue_purge, "") == NO_PREVIOUS
    # a passive declare also counts as declaring
    second = confirm_channel(conn)
    second.queue_declare(generated, passive=True)
    publish_n(second, generated, 1)
    assert second.basic_get("", auto_ack=True)[2] == b"m0"
    assert ch.queue_delete("").method.message_count == 0
    assert not exists(conn, "queue", generated)


@pytest.mark.parametrize(
    "operation",
    [
        lambda ch: ch.queue_bind("", "amq.direct", "k"),
        lambda ch: ch.queue_unbind("", "amq.direct", "k"),
        lambda ch: ch.basic_consume("", lambda *args: None),
        lambda ch: ch.basic_get(""),
        lambda ch: ch.queue_purge(""),
        lambda ch: ch.queue_delete(""),
    ],
    ids=["bind", "unbind", "consume", "get", "purge", "delete"],
)
def test_empty_queue_name_without_a_declared_queue_is_404(conn, operation):
    assert channel_error(operation, conn.channel()) == NO_PREVIOUS
    assert conn.is_open
