"""Consumers of another shard's queue behave as on one process (issue 39,
docs/scaling.md "How a message travels between shards"): exclusivity is
the owner's to judge and the consume is answered once it did, basic.qos
after a consume reaches the owner, a basic.get whose channel closed gives
its message back, and a cancel loses no no-ack delivery.

Real brokers with real clients (pika; a raw client where pika hides what
the broker sent): each test runs against a node of two shards, connections
kept on their shard (`--shard-moves false`), with the client on shard 0
and the queue on shard 1, and against one process (`--shards 1`), which
is what the node must match; the exclusivity tests also on three shards.
"""
from __future__ import annotations

import time

import pika
import pytest
from pamqp import commands

from amqp_raw import RawClient
from conftest import launch
from helpers import channel_error, wait_for
from shard_kit import on_shard, queue_on


@pytest.fixture(scope="module", params=[2, 1], ids=["2-shards", "1-shard"])
def node(request, tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("consumers"), "--shards", str(request.param), "--shard-moves", "false")
    proc.shards = request.param
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def node3(tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("consumers3"), "--shards", "3", "--shard-moves", "false")
    proc.shards = 3
    yield proc
    proc.stop()


def connect(node, shard: int) -> pika.BlockingConnection:
    """A connection served by `shard` (one process has no `shard` server property)."""
    if node.shards == 1:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    return on_shard(node.port, shard)


def owner_shard(node) -> int:
    """Where the tests' queues live: another shard than the client's (0), but on one process."""
    return 1 if node.shards > 1 else 0


@pytest.fixture
def across(node):
    """A connection on the queue's shard, a durable queue there, and a client connection on shard 0;
    the queue is deleted after the test (queues go to the shard with the fewest: `queue_on`)."""
    owner = connect(node, owner_shard(node))
    queue = queue_on(node, owner.channel(), owner_shard(node), shards=node.shards)
    client = connect(node, 0)
    yield owner, queue, client
    for connection in (owner, client):
        if connection.is_open:
            connection.close()
    cleaner = connect(node, 0)
    cleaner.channel().queue_delete(queue)
    cleaner.close()


def raw_on_shard(node, shard: int) -> RawClient:
    """A raw client through the handshake, served by `shard`, with channel 1 open."""
    others = []
    try:
        for _ in range(200):
            client = RawClient.connected(node.port, channels=(1,))
            if client.start.server_properties.get("shard", 0) == shard:
                return client
            others.append(client)
    finally:
        for other in others:
            other.close()
    raise AssertionError("no raw connection landed on shard %d" % shard)


def fill(connection, queue: str, count: int, body: bytes = b"m") -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(count):
        channel.basic_publish("", queue, body)
    channel.close()


def ready(connection, queue: str) -> int:
    channel = connection.channel()
    count = channel.queue_declare(queue, passive=True).method.message_count
    channel.close()
    return count


def in_exclusive_use(queue: str) -> tuple:
    return 403, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use" % queue


# -- exclusivity is the owner's, and the consume waits for its answer ------------------------


def test_a_consume_of_a_queue_held_exclusively_elsewhere_is_refused(node, across):
    owner, queue, client = across
    owner.channel().basic_consume(queue, lambda *_: None, exclusive=True)
    assert channel_error(client.channel().basic_consume, queue, lambda *_: None) == in_exclusive_use(queue)
    # so also an exclusive one, and the holder is untouched: it still gets the queue's messages
    assert channel_error(client.channel().basic_consume, queue, lambda *_: None,
                         exclusive=True) == in_exclusive_use(queue)
    fill(client, queue, 1)
    wait_for(lambda: owner.process_data_events(0.05) or ready(client, queue) == 0, what="the holder took it")


def test_an_exclusive_consume_of_a_queue_consumed_elsewhere_is_refused(node, across):
    owner, queue, client = across
    owner.channel().basic_consume(queue, lambda *_: None)
    assert channel_error(client.channel().basic_consume, queue, lambda *_: None,
                         exclusive=True) == in_exclusive_use(queue)
    # the refused consumer was never the owner's: once the other goes, the queue is free
    owner.close()
    client.channel().basic_consume(queue, lambda *_: None, exclusive=True)


def test_a_nowait_consume_of_a_queue_held_exclusively_elsewhere_closes_the_channel(node, across):
    owner, queue, client = across
    owner.channel().basic_consume(queue, lambda *_: None, exclusive=True)
    raw = raw_on_shard(node, 0)
    raw.send_frame(commands.Basic.Consume(queue=queue, nowait=True), 1)
    close = raw.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.reply_text) == in_exclusive_use(queue)
    assert (close.class_id, close.method_id) == (60, 20)
    raw.close()


def test_exclusivity_holds_between_consumers_on_two_shards_of_a_third_ones_queue(node3):
    owner = on_shard(node3.port, 2)
    queue = queue_on(node3, owner.channel(), 2, shards=3)
    holder, client = on_shard(node3.port, 1), on_shard(node3.port, 0)
    holder.channel().basic_consume(queue, lambda *_: None, exclusive=True)
    assert channel_error(client.channel().basic_consume, queue, lambda *_: None) == in_exclusive_use(queue)
    holder.close()  # its shard cancels it at the owner: the queue is free again
    wait_for(lambda: _consumes(client, queue), what="a consume once the holder is gone")
    for connection in (owner, client):
        connection.close()


def _consumes(connection, queue: str) -> bool:
    try:
        connection.channel().basic_consume(queue, lambda *_: None, exclusive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    return True


# -- basic.qos after a consume reaches the owner ---------------------------------------------


def _consumer(client, queue: str, global_prefetch: int, prefetch: int = 0):
    channel = client.channel()
    if prefetch:
        channel.basic_qos(prefetch_count=prefetch)
    if global_prefetch:
        channel.basic_qos(prefetch_count=global_prefetch, global_qos=True)
    tags = []
    channel.basic_consume(queue, lambda _ch, method, _props, _body: tags.append(method.delivery_tag))
    return channel, tags


def _settled(connection, tags: list, count: int) -> None:
    """`count` deliveries came, and no more within 0.3 s."""
    wait_for(lambda: connection.process_data_events(0.02) or len(tags) >= count, what="%d deliveries" % count)
    connection.process_data_events(0.3)
    assert len(tags) == count


@pytest.mark.parametrize("after", [3, 0], ids=["raised", "lifted"])
def test_a_global_prefetch_raised_after_the_consume_lets_the_owner_send_more(node, across, after):
    owner, queue, client = across
    fill(client, queue, 20)
    channel, tags = _consumer(client, queue, global_prefetch=1)
    _settled(client, tags, 1)
    channel.basic_qos(prefetch_count=after, global_qos=True)
    _settled(client, tags, after or 20)


@pytest.mark.parametrize("prefetch, global_prefetch", [(0, 4), (4, 0)], ids=["global", "per-consumer"])
def test_a_global_prefetch_lowered_after_the_consume_leaves_the_rest_to_other_consumers(node, prefetch,
                                                                                          global_prefetch, across):
    owner, queue, client = across
    fill(client, queue, 20)
    channel, tags = _consumer(client, queue, global_prefetch, prefetch)
    _settled(client, tags, 4)
    channel.basic_qos(prefetch_count=1, global_qos=True)
    channel.basic_ack(tags[-1], multiple=True)
    _settled(client, tags, 5)
    # what the first consumer's channel may not take stays in the queue for another consumer
    other = owner.channel()
    others = []
    other.basic_consume(queue, lambda _ch, method, _props, _body: others.append(method.delivery_tag), auto_ack=True)
    _settled(owner, others, 15)


# -- a basic.get whose channel closed before the answer gives its message back ---------------


def test_a_get_whose_channel_closed_before_the_answer_leaves_the_message_in_the_queue(node, across):
    owner, queue, client = across
    fill(client, queue, 1, b"wanted")
    raw = raw_on_shard(node, 0)
    # In one write, so the channel is closed before another shard could answer the get.
    raw.send_frames((1, commands.Basic.Get(queue=queue)),
                    (1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    while not isinstance(raw.read_frame()[1], commands.Channel.CloseOk):
        pass
    raw.close()
    channel = client.channel()
    method, _props, body = wait_for(lambda: _got(channel, queue), what="the message back")
    assert body == b"wanted"
    assert method.redelivered  # it was the channel's a moment (one process: its get-ok went out)


def _got(channel, queue: str):
    method, props, body = channel.basic_get(queue, auto_ack=True)
    return (method, props, body) if method is not None else None


# -- a cancel loses no no-ack delivery ---------------------------------------------------------


def test_a_cancel_of_a_no_ack_consumer_loses_no_message(node, across):
    owner, queue, client = across
    total = 2000
    fill(client, queue, total, b"x" * 16384)
    raw = raw_on_shard(node, 0)
    raw.send_frame(commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=True), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    # Not reading: the broker's output to it pauses, and deliveries wait on the client's shard.
    time.sleep(1.0)
    raw.send_frame(commands.Basic.Cancel(consumer_tag="c"), 1)
    delivered = 0
    while True:
        _channel, value = raw.read_frame(timeout=10)
        if isinstance(value, commands.Basic.Deliver):
            delivered += 1
        elif isinstance(value, commands.Basic.CancelOk):
            break
    raw.close()
    assert 0 < delivered < total
    assert delivered + ready(client, queue) == total
