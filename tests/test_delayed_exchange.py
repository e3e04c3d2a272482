"""The x-delayed-message exchange (RabbitMQ's rabbitmq_delayed_message_exchange
plugin, which the reference RabbitMQ does not have: its documented and
source-code behaviour is the reference).

- declare: `x-delayed-type` is required and must name an exchange type;
- a message with a positive `x-delay` (ms) is routed, as the x-delayed-type
  would route it, once the delay has passed; it arrives with `x-delay`
  negated; no (or a non-positive) delay routes at once;
- a delayed mandatory publish is returned NO_ROUTE at once, and still
  delivered when due (the plugin routes it to no queue at publish time, so
  an alternate exchange gets it at once);
- a persistent message on a durable delayed exchange survives a clean
  restart and a SIGKILL and is delivered when due; a transient one does not.

Tests never assert how long anything took, only the order
in which delayed messages arrive, and that a message with a long delay is
not there yet right after its publish was confirmed.
"""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import pika
import pytest
from pika.exceptions import UnroutableError

from helpers import confirm_channel, connect, drain, restarted, unique, wait_for


async def delayed_setup(channel, delayed_type: str = "direct", durable: bool = False):
    exchange = await channel.declare_exchange(
        unique("delayed"), "x-delayed-message", durable=durable, arguments={"x-delayed-type": delayed_type})
    queue = await channel.declare_queue(unique("delayed-q"), exclusive=True)
    return exchange, queue


async def collect(queue, n: int) -> list:
    got: list = []
    async with queue.iterator(no_ack=True) as messages:
        async for message in messages:
            got.append(message)
            if len(got) == n:
                return got
    return got


async def count(channel, queue: str) -> int:
    return (await channel.declare_queue(queue, passive=True)).declaration_result.message_count


async def test_delayed_messages_arrive_in_due_order_with_x_delay_negated(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel)
    await queue.bind(exchange, "k")
    for body, delay in ((b"third", 900), (b"first", 100), (b"second", 500)):
        await exchange.publish(aio_pika.Message(body, headers={"x-delay": delay}), routing_key="k")
    got = await asyncio.wait_for(collect(queue, 3), 10)
    assert [m.body for m in got] == [b"first", b"second", b"third"]
    assert [m.headers["x-delay"] for m in got] == [-100, -500, -900]
    assert all(m.exchange == exchange.name and m.routing_key == "k" for m in got)


async def test_a_long_delay_is_not_there_yet_and_counts_nowhere(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel, "fanout")
    await queue.bind(exchange)
    await exchange.publish(aio_pika.Message(b"later", headers={"x-delay": 60000}), routing_key="")
    await exchange.publish(aio_pika.Message(b"now"), routing_key="")
    assert await count(channel, queue.name) == 1
    assert (await queue.get(no_ack=True)).body == b"now"


@pytest.mark.parametrize("header", [None, 0, -5, "abc", True, 2**32])
async def test_no_positive_delay_routes_at_once(aconn, header):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel)
    await queue.bind(exchange, "k")
    headers = {"x-delay": header} if header is not None else None
    await exchange.publish(aio_pika.Message(b"m", headers=headers), routing_key="k")
    assert await count(channel, queue.name) == 1


async def test_numeric_string_and_float_delays_count(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel)
    await queue.bind(exchange, "k")
    await exchange.publish(aio_pika.Message(b"b", headers={"x-delay": "400"}), routing_key="k")
    await exchange.publish(aio_pika.Message(b"a", headers={"x-delay": 100.9}), routing_key="k")
    got = await asyncio.wait_for(collect(queue, 2), 10)
    assert [(m.body, m.headers["x-delay"]) for m in got] == [(b"a", -100), (b"b", -400)]


async def test_routes_as_its_delayed_type(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel, "topic")
    await queue.bind(exchange, "orders.#")
    for key, delay in (("orders.eu.new", 200), ("invoices.eu", 100), ("orders.us", 300)):
        await exchange.publish(aio_pika.Message(key.encode(), headers={"x-delay": delay}), routing_key=key)
    got = await asyncio.wait_for(collect(queue, 2), 10)
    assert [m.body for m in got] == [b"orders.eu.new", b"orders.us"]
    assert await count(channel, queue.name) == 0


async def test_messages_of_a_deleted_exchange_are_dropped(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    doomed, queue = await delayed_setup(channel)
    kept = await channel.declare_exchange(unique("delayed"), "x-delayed-message",
                                          arguments={"x-delayed-type": "direct"})
    await queue.bind(doomed, "k")
    await queue.bind(kept, "k")
    # long enough for the delete to come first on any machine
    await doomed.publish(aio_pika.Message(b"dropped", headers={"x-delay": 2000}), routing_key="k")
    await kept.publish(aio_pika.Message(b"kept", headers={"x-delay": 2300}), routing_key="k")
    await doomed.delete()
    got = await asyncio.wait_for(collect(queue, 1), 10)
    assert [m.body for m in got] == [b"kept"]
    assert await count(channel, queue.name) == 0


def test_a_delayed_mandatory_message_is_returned_at_once_and_delivered_when_due(conn):
    channel = confirm_channel(conn)
    exchange = unique("delayed")
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    queue = channel.queue_declare(unique("delayed-q"), exclusive=True).method.queue
    channel.queue_bind(queue, exchange, "k")
    with pytest.raises(UnroutableError):
        channel.basic_publish(exchange, "k", b"m", pika.BasicProperties(headers={"x-delay": 200}), mandatory=True)
    wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == 1)
    channel.basic_publish(exchange, "k", b"at once", mandatory=True)  # no delay: routed, not returned


async def test_a_headers_delayed_exchange_checks_x_match_and_routes_by_headers(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    exchange, queue = await delayed_setup(channel, "headers")
    await queue.bind(exchange, arguments={"x-match": "all", "kind": "order"})
    for body, kind in ((b"invoice", "invoice"), (b"order", "order")):
        await exchange.publish(aio_pika.Message(body, headers={"x-delay": 100, "kind": kind}), routing_key="")
    assert [m.body for m in await asyncio.wait_for(collect(queue, 1), 10)] == [b"order"]
    other = await aconn.channel()
    bound = await other.get_queue(queue.name, ensure=False)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await bound.bind(exchange, arguments={"x-match": "bogus"})
    assert info.value.args[0] == ('PRECONDITION_FAILED - Invalid x-match field value <<"bogus">>; '
                                  "expected all, any, all-with-x, or any-with-x")


async def test_an_alternate_exchange_gets_a_delayed_message_at_once(aconn):
    """The plugin routes a delayed message to no queue at publish time, so
    RabbitMQ hands it to the alternate exchange then (x-delay as published),
    and the exchange's own queues get it when due."""
    channel = await aconn.channel(publisher_confirms=True)
    alternate = await channel.declare_exchange(unique("ae"), aio_pika.ExchangeType.FANOUT)
    unrouted = await channel.declare_queue(unique("ae-q"), exclusive=True)
    await unrouted.bind(alternate)
    exchange = await channel.declare_exchange(
        unique("delayed"), "x-delayed-message",
        arguments={"x-delayed-type": "direct", "alternate-exchange": alternate.name})
    queue = await channel.declare_queue(unique("delayed-q"), exclusive=True)
    await queue.bind(exchange, "k")
    await exchange.publish(aio_pika.Message(b"m", headers={"x-delay": 200}), routing_key="k")
    now = await unrouted.get(no_ack=True)
    assert (now.body, now.headers["x-delay"]) == (b"m", 200)
    later = await asyncio.wait_for(collect(queue, 1), 10)
    assert [(m.body, m.headers["x-delay"]) for m in later] == [(b"m", -200)]
    assert await count(channel, unrouted.name) == 0


# -- declaration -------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [None, {"x-delayed-type": 1}, {"x-delayed-type": "x-delayed-message"}])
async def test_declare_needs_an_exchange_type_406(aconn, arguments):
    channel = await aconn.channel()
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_exchange(unique("delayed"), "x-delayed-message", arguments=arguments)
    assert info.value.args[0] == (
        "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type")


def test_declare_with_an_unknown_delayed_type_closes_the_connection_503(broker):
    connection = connect(broker.port)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        connection.channel().exchange_declare(unique("delayed"), "x-delayed-message",
                                              arguments={"x-delayed-type": "nonsense"})
    assert (info.value.reply_code, info.value.reply_text) == (503, "COMMAND_INVALID - unknown exchange type 'nonsense'")


async def test_redeclare_and_passive_declare(aconn):
    channel = await aconn.channel()
    exchange, _queue = await delayed_setup(channel)
    again = await channel.declare_exchange(exchange.name, "x-delayed-message",
                                           arguments={"x-delayed-type": "direct"})
    assert again.name == exchange.name
    await channel.declare_exchange(exchange.name, passive=True)
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await channel.declare_exchange(exchange.name, "direct")


# -- durability ------------------------------------------------------------------------------


def publish_delayed(port: int, exchange: str, queue: str, messages) -> None:
    connection = connect(port)
    channel = confirm_channel(connection)
    channel.exchange_declare(exchange, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "k")
    for body, delay, mode in messages:
        channel.basic_publish(exchange, "k", body, pika.BasicProperties(headers={"x-delay": delay}, delivery_mode=mode))
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    connection.close()


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_persistent_delayed_messages_survive_a_restart(start_broker, kill):
    first = start_broker()
    exchange, queue = unique("delayed"), unique("delayed-q")
    # Delays long enough that nothing is delivered before the stop: what
    # arrives afterwards came back from the delayed store.
    publish_delayed(first.port, exchange, queue, [
        (b"persistent-2", 3500, 2), (b"transient", 3000, 1), (b"persistent-1", 3000, 2)])
    second = restarted(start_broker, first, kill)
    connection = connect(second.port)
    channel = connection.channel()
    wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == 2, timeout=15)
    got = drain(channel, queue)
    assert [body for _m, _p, body in got] == [b"persistent-1", b"persistent-2"]
    assert [p.headers["x-delay"] for _m, p, _b in got] == [-3000, -3500]
    connection.close()
    # delivered messages left the delayed store: a further restart brings nothing back
    second.stop()
    third = start_broker("--data-dir", str(first.data_dir))
    connection = connect(third.port)
    channel = connection.channel()
    channel.queue_declare(queue, passive=True)
    assert drain(channel, queue) == []
    connection.close()
    assert "Traceback" not in second.log + third.log
