"""Peek and move, the broker operations behind the admin API / hutchctl:
`VirtualHost.peek_queue(name, count)` and `VirtualHost.move_messages(...)`
(and `vhost.delayer.held(exchange)`, a delayed exchange's message count).

They have no AMQP method, so the broker runs in the test's process
(`BrokerServer`, the object `hutch-server` runs, on port 0 and its own data
directory) and the operations are called on its vhost, while aio-pika and
pika clients publish and consume over real sockets. Durability after a move
is checked by copying the data directory the moment the move returns (what
a crash at that instant leaves) and starting a broker process on the copy.
"""
from __future__ import annotations

import asyncio
import shutil

import aio_pika
import pytest

from amqp_server.config import BrokerConfig, ManagementConfig, PrometheusConfig, StorageConfig
from amqp_server.server import BrokerServer
from conftest import launch
from helpers import connect, drain, unique
from vhosts.errors import AMQPError


async def started(data_dir) -> BrokerServer:
    """An in-process broker whose memory budget makes queues page out."""
    config = BrokerConfig(bind="127.0.0.1", port=0, data_dir=str(data_dir),
                          storage=StorageConfig(vm_memory_high_watermark_absolute=4000000, segment_entries=1024),
                          management=ManagementConfig(enabled=False), prometheus=PrometheusConfig(enabled=False))
    broker = BrokerServer(config)
    await broker.start()
    broker.port = broker.servers[0].sockets[0].getsockname()[1]
    broker.vhost = broker.broker.vhosts["/"]
    return broker


@pytest.fixture
async def server(tmp_path):
    broker = await started(tmp_path / "data")
    yield broker
    await broker.stop()


@pytest.fixture
async def client(server):
    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:%d/" % server.port)
    # No confirms: publishes are pipelined, and `synced` makes a round trip
    # once they are all routed.
    yield await connection.channel(publisher_confirms=False)
    await connection.close()


async def synced(channel) -> None:
    """A round trip on the channel: every publish sent before it is routed."""
    await channel.declare_exchange("amq.direct", passive=True)


async def publish(channel, queue: str, bodies, **properties) -> None:
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body, **properties), routing_key=queue)
    await synced(channel)


async def consume_all(channel, queue: str) -> list[bytes]:
    q = await channel.get_queue(queue, ensure=False)
    bodies = []
    while (message := await q.get(no_ack=True, fail=False)) is not None:
        bodies.append(message.body)
    return bodies


async def consume(channel, queue: str, count: int) -> list[bytes]:
    """`count` bodies through a consumer (faster than basic.get for many)."""
    q = await channel.get_queue(queue, ensure=False)
    bodies: list[bytes] = []
    async with q.iterator(no_ack=True) as messages:
        async for message in messages:
            bodies.append(message.body)
            if len(bodies) == count:
                break
    return bodies


async def ready(channel, queue: str) -> int:
    return (await channel.declare_queue(queue, passive=True)).declaration_result.message_count


# -- peek --------------------------------------------------------------------------


async def test_peek_shows_the_first_messages_and_leaves_them(server, client):
    queue = await client.declare_queue(unique("peek"))
    await client.default_exchange.publish(
        aio_pika.Message(b"first", headers={"h": "v", "n": 7}, content_type="text/plain", message_id="id-1",
                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=queue.name)
    await publish(client, queue.name, [b"second", b"third", b"fourth"])
    taken = await queue.get()  # "first", then given back: redelivered
    await taken.nack(requeue=True)
    assert await ready(client, queue.name) == 4  # a round trip: the nack is in

    peeked = await server.vhost.peek_queue(queue.name, 3)
    assert [e.message.body for e in peeked] == [b"first", b"second", b"third"]
    assert [e.redelivered for e in peeked] == [True, False, False]
    first = peeked[0].message
    assert (first.exchange, first.routing_key) == ("", queue.name)
    assert first.headers == {"h": "v", "n": 7}
    assert (first.properties.content_type, first.properties.message_id, first.properties.delivery_mode) == (
        "text/plain", "id-1", 2)
    assert [e.message.body for e in await server.vhost.peek_queue(queue.name, 100)] == [
        b"first", b"second", b"third", b"fourth"]
    assert await server.vhost.peek_queue(queue.name, 0) == []
    assert await ready(client, queue.name) == 4
    assert await consume_all(client, queue.name) == [b"first", b"second", b"third", b"fourth"]


async def test_peek_reads_paged_out_messages_back_without_disturbing_the_queue(server, client):
    queue = await client.declare_queue(unique("peek-paged"), durable=True)
    count = 6000  # more than a queue keeps in RAM (2048): the rest is on disk only (delta)
    # every tenth one too large to be embedded in the index: read from the message store
    bodies = [b"%05d" % i + b"." * (5000 if i % 10 == 0 else 300) for i in range(count)]
    await publish(client, queue.name, bodies, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    states = server.vhost.queues[queue.name].backing.state_counts()
    assert states["delta"] > 0, states
    peeked = await server.vhost.peek_queue(queue.name, count + 10)
    assert [e.message.body for e in peeked] == bodies
    assert server.vhost.queues[queue.name].backing.state_counts() == states
    assert await consume(client, queue.name, count) == bodies
    assert await ready(client, queue.name) == 0


async def test_peek_of_a_priority_queue_follows_priorities(server, client):
    queue = await client.declare_queue(unique("peek-prio"), arguments={"x-max-priority": 3})
    for body, priority in ((b"low", 1), (b"none", None), (b"high", 3), (b"low2", 1)):
        await client.default_exchange.publish(aio_pika.Message(body, priority=priority), routing_key=queue.name)
    await synced(client)
    peeked = await server.vhost.peek_queue(queue.name, 3)
    assert [e.message.body for e in peeked] == [b"high", b"low", b"low2"]


async def test_peek_of_a_missing_queue_is_404(server):
    with pytest.raises(AMQPError) as info:
        await server.vhost.peek_queue("no-such-queue", 1)
    assert info.value.reply_text == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"


# -- move ----------------------------------------------------------------------------


async def test_move_everything_to_another_queue(server, client):
    source = await client.declare_queue(unique("dlq"))
    target = await client.declare_queue(unique("work"))
    await client.default_exchange.publish(
        aio_pika.Message(b"with-props", headers={"x-death": [{"count": 1}]}, correlation_id="c1"),
        routing_key=source.name)
    await publish(client, source.name, [b"m%d" % i for i in range(600)])
    assert await server.vhost.move_messages(source.name, target.name) == 601
    assert await ready(client, source.name) == 0
    first = await target.get(no_ack=True)
    assert (first.body, first.correlation_id, first.routing_key) == (b"with-props", "c1", source.name)
    assert first.headers["x-death"][0]["count"] == 1
    assert await consume_all(client, target.name) == [b"m%d" % i for i in range(600)]


async def test_move_at_most_n_keeps_the_rest_in_order(server, client):
    source = await client.declare_queue(unique("dlq"))
    target = await client.declare_queue(unique("work"))
    await publish(client, source.name, [b"m%d" % i for i in range(10)])
    assert await server.vhost.move_messages(source.name, target.name, count=4) == 4
    assert await consume_all(client, target.name) == [b"m0", b"m1", b"m2", b"m3"]
    assert await consume_all(client, source.name) == [b"m%d" % i for i in range(4, 10)]


async def test_move_through_an_exchange_routes_each_by_its_key_and_stops_at_an_unroutable_one(server, client):
    source = await client.declare_queue(unique("dlq"))
    exchange = await client.declare_exchange(unique("replay"), aio_pika.ExchangeType.DIRECT)
    orders = await client.declare_queue(unique("orders"))
    await orders.bind(exchange, "orders")
    # The source gets its messages through a fanout exchange, so each keeps its own key.
    staging = await client.declare_exchange(unique("staging"), aio_pika.ExchangeType.FANOUT)
    await source.bind(staging)
    for body, key in ((b"o1", "orders"), (b"o2", "orders"), (b"lost", "nowhere"), (b"o3", "orders")):
        await staging.publish(aio_pika.Message(body), routing_key=key)
    await synced(client)

    assert await server.vhost.move_messages(source.name, exchange.name, kind="exchange") == 2
    delivered = await orders.get(no_ack=True)
    assert (delivered.body, delivered.exchange, delivered.routing_key) == (b"o1", exchange.name, "orders")
    assert await consume_all(client, orders.name) == [b"o2"]
    # the unroutable one is still first in the source (given back, redelivered), the rest behind it
    head = await source.get(no_ack=True)
    assert (head.body, head.redelivered) == (b"lost", True)
    assert await consume_all(client, source.name) == [b"o3"]


async def test_move_through_an_exchange_with_a_new_routing_key(server, client):
    source = await client.declare_queue(unique("dlq"))
    target = await client.declare_queue(unique("work"))
    await publish(client, source.name, [b"a", b"b"])
    moved = await server.vhost.move_messages(source.name, "", kind="exchange", routing_key=target.name)
    assert moved == 2
    assert await consume_all(client, target.name) == [b"a", b"b"]


async def test_move_from_a_priority_queue_takes_the_highest_first(server, client):
    source = await client.declare_queue(unique("dlq"), arguments={"x-max-priority": 5})
    target = await client.declare_queue(unique("work"))
    for body, priority in ((b"low", 1), (b"high", 5), (b"mid", 3), (b"high2", 5)):
        await client.default_exchange.publish(aio_pika.Message(body, priority=priority), routing_key=source.name)
    await synced(client)
    assert await server.vhost.move_messages(source.name, target.name, count=3) == 3
    assert await consume_all(client, target.name) == [b"high", b"high2", b"mid"]
    assert await consume_all(client, source.name) == [b"low"]


async def test_move_errors(server, client):
    source = await client.declare_queue(unique("dlq"))
    with pytest.raises(AMQPError) as info:
        await server.vhost.move_messages(source.name, source.name)
    assert info.value.reply_code == 406
    with pytest.raises(AMQPError) as info:
        await server.vhost.move_messages(source.name, "no-such-queue")
    assert info.value.reply_text == "NOT_FOUND - no queue 'no-such-queue' in vhost '/'"
    with pytest.raises(AMQPError) as info:
        await server.vhost.move_messages(source.name, "no-such-exchange", kind="exchange")
    assert info.value.reply_text == "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
    with pytest.raises(AMQPError) as info:
        await server.vhost.move_messages("no-such-queue", source.name)
    assert info.value.reply_code == 404


async def test_moved_persistent_messages_are_on_disk_when_the_move_returns(server, client, tmp_path):
    """A copy of the data directory taken as the move returns (a crash at that
    instant) holds every moved message in the durable destination; a message
    may also still be in the source (at least once), none is lost."""
    source = await client.declare_queue(unique("dlq"), durable=True)
    target = await client.declare_queue(unique("work"), durable=True)
    bodies = [b"p%04d" % i + b"." * 5000 * (i % 2) for i in range(3000)]  # large ones go to the message store
    await publish(client, source.name, bodies, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    assert await server.vhost.move_messages(source.name, target.name, count=2000) == 2000
    snapshot = tmp_path / "crashed"
    await asyncio.get_running_loop().run_in_executor(
        None, lambda: shutil.copytree(server.config.data_dir, snapshot))
    recovered = launch(tmp_path, "--data-dir", str(snapshot), "--storage-segment-entries", "1024")
    try:
        connection = connect(recovered.port)
        channel = connection.channel()
        assert [body for _m, _p, body in drain(channel, target.name)] == bodies[:2000]
        left = [body for _m, _p, body in drain(channel, source.name)]
        assert left[-1000:] == bodies[2000:]
        assert set(left[:-1000]) <= set(bodies[:2000])
        connection.close()
        assert "Traceback" not in recovered.log
    finally:
        recovered.stop()


async def test_a_move_waiting_for_the_disk_ends_when_the_source_is_deleted(tmp_path):
    """After a restart a durable queue's messages are all on disk: a move
    first waits for the read back. Deleting the queue then ends the move
    (driven step by step, so the delete surely comes while it waits)."""
    first = await started(tmp_path / "data")
    connection = await aio_pika.connect("amqp://guest:guest@127.0.0.1:%d/" % first.port)
    channel = await connection.channel()
    source = await channel.declare_queue(unique("dlq"), durable=True)
    target = await channel.declare_queue(unique("work"), durable=True)
    await publish(channel, source.name, [b"m"] * 10, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await connection.close()
    await first.stop()
    second = await started(tmp_path / "data")
    try:
        assert second.vhost.queues[source.name].backing.state_counts()["delta"] == 10
        moving = second.vhost.move_messages(source.name, target.name)
        waiting = moving.send(None)  # runs up to the wait for the disk read
        assert isinstance(waiting, asyncio.Future) and not waiting.done()
        second.vhost.delete_queue(source.name, None)
        with pytest.raises(StopIteration) as finished:
            moving.send(None)
        assert finished.value.value == 0
        assert second.vhost.queues[target.name].message_count == 0
    finally:
        await second.stop()


# -- delayed messages held ------------------------------------------------------------


async def test_held_counts_the_messages_a_delayed_exchange_holds(server, client):
    exchange = await client.declare_exchange(unique("delayed"), "x-delayed-message",
                                             arguments={"x-delayed-type": "fanout"})
    other = await client.declare_exchange(unique("delayed"), "x-delayed-message",
                                          arguments={"x-delayed-type": "fanout"})
    for delay in (60000, 60000, 0):
        await exchange.publish(aio_pika.Message(b"m", headers={"x-delay": delay}), routing_key="")
    await other.publish(aio_pika.Message(b"m", headers={"x-delay": 60000}), routing_key="")
    await synced(client)
    assert (server.vhost.delayer.held(exchange.name), server.vhost.delayer.held(other.name)) == (2, 1)
