"""A node of several shards (docs/scaling.md), from the outside: real
clients on a broker started with --shards 2, whose connections land on
either shard (the kernel spreads them: SO_REUSEPORT); each test picks
connections on the shard it needs by the `shard` server property.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiomqtt
import pika
import pytest

from amqp_server.mqtt.sessions import queue_name
from conftest import PORT_ARGS, ROOT, launch
from helpers import channel_error, pump, unique, wait_for
from http_api import call
from test_alarms import Notices
from shard_kit import on_shard, placement, queue_on
from shard_kit import pid_of_shard as _pid_of_shard
from mqtt_raw import DISCONNECT, RawMQTT, parse_publish, publish_packet, subscribe_packet, until_ping

SHARDS = 2


@pytest.fixture(scope="module", params=[True, False], ids=["moves", "no-moves"])
def node(request, tmp_path_factory):
    """A node of two shards; with moves off every cross-shard path is taken for good (a connection
    bound for another shard's queues does not move there)."""
    proc = launch(tmp_path_factory.mktemp("shards"), "--shards", str(SHARDS), "--shard-moves",
                  "true" if request.param else "false", expect=("AMQP", "MQTT"))
    proc.moves = request.param
    wait_for(lambda: proc.log.count("listening for AMQP") >= SHARDS, 20, what="every shard listening")
    yield proc
    proc.stop()


def across(node) -> tuple:
    """A connection on shard 1, a durable queue that lives there, and a connection on shard 0."""
    owner = on_shard(node.port, 1)
    return owner, queue_on(node, owner.channel(), 1), on_shard(node.port, 0)


def test_connections_land_on_every_shard_and_definitions_are_everywhere_once_answered(node):
    a, b = on_shard(node.port, 0), on_shard(node.port, 1)
    ca, cb = a.channel(), b.channel()
    exchange, queue = unique("sx"), unique("sq")
    ca.exchange_declare(exchange, "direct")
    cb.queue_declare(queue)
    ca.queue_bind(queue, exchange, "key")
    # the other shard knows each at once: passive declares, a publish routed by the binding
    cb.exchange_declare(exchange, "direct", passive=True)
    ca.queue_declare(queue, passive=True)
    cb.confirm_delivery()
    cb.basic_publish(exchange, "key", b"routed")
    assert ca.basic_get(queue, auto_ack=True)[2] == b"routed"
    # a refusal comes from the shard that orders definitions, with RabbitMQ's code and text
    code, text = channel_error(b.channel().queue_declare, queue, durable=True)
    assert code == 406
    assert "inequivalent arg 'durable' for queue '%s'" % queue in text
    ca.exchange_delete(exchange)
    code, _text = channel_error(b.channel().exchange_declare, exchange, "direct", passive=True)
    assert code == 404
    a.close()
    b.close()


@pytest.mark.parametrize("owner", [0, 1])
def test_confirmed_publishes_into_another_shards_queue_are_all_there_in_order(node, owner):
    publisher = on_shard(node.port, 1 - owner)
    local = on_shard(node.port, owner)
    queue = queue_on(node, local.channel(), owner)
    channel = publisher.channel()
    channel.confirm_delivery()
    for i in range(200):
        channel.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert channel.queue_declare(queue, passive=True).method.message_count == 200
    # consumed half on the owner's shard, half across: each once, in order
    bodies = []
    for connection in (local, publisher):
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=10)
        for method, _props, body in consumer.consume(queue, inactivity_timeout=5):
            assert method is not None, "deliveries stopped after %d" % len(bodies)
            bodies.append(int(body))
            consumer.basic_ack(method.delivery_tag)
            if len(bodies) % 100 == 0:
                break
        consumer.cancel()
    assert bodies == list(range(200))
    publisher.close()
    local.close()


def test_a_publisher_moving_to_its_queues_shard_keeps_its_publishes_in_order(node):
    """Without confirms nothing holds a publisher's move back: the publishes it
    sent across before it moved reach the queue before those it sends after.
    25 publishers in turn, each moving after 64 publishes, keep the owner busy
    writing (persistent bodies of two sizes): a move raced its last records
    across about one time in ten."""
    owner = on_shard(node.port, 1)
    queue = queue_on(node, owner.channel(), 1)
    sent = []
    for _round in range(25):
        publisher = on_shard(node.port, 0)
        channel = publisher.channel()
        for _ in range(100):
            body = b"%05d" % len(sent) + b"." * 5000 * (len(sent) % 2)
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            sent.append(body)
        publisher.close()
    reader = owner.channel()
    wait_for(lambda: reader.queue_declare(queue, passive=True).method.message_count == len(sent), 10,
             what="every publish in the queue")
    got = [body for _method, _props, body in iter(lambda: _get_or_none(reader, queue), None)]
    assert [body[:5] for body in got] == [body[:5] for body in sent]
    owner.close()


def test_a_publisher_moving_keeps_its_order_into_a_third_shards_queue(tmp_path):
    """On three shards a publisher on shard 0 writes to a queue of shard 2, moves to
    shard 1 (64 publishes for it), then writes to shard 2's queue again, now from
    shard 1: what it sent from shard 0 is in that queue first. Shard 2 is stopped
    meanwhile, so the records of both wait for it, shard 0's more than it reads at once."""
    proc = launch(tmp_path, "--shards", "3")
    try:
        wait_for(lambda: proc.log.count("listening for AMQP") >= 3, 20, what="every shard listening")
        setup = on_shard(proc.port, 0).channel()
        third, target = queue_on(proc, setup, 2), queue_on(proc, setup, 1)
        publisher = on_shard(proc.port, 0).channel()
        stopped = _pid_of_shard(proc, 2, of=3)
        moved = proc.log.count("moved here")
        os.kill(stopped, signal.SIGSTOP)
        try:
            sent = []
            for i in range(170):  # fewer than 64 in a row for shard 2: the publisher moves to shard 1
                into = target if 60 <= i < 130 else third
                # large before the move (more than shard 2 reads at once), small after: the
                # client's socket must take what it sends while the move waits for shard 2
                body = b"%05d" % i + b"." * (6000 if i < 60 else 10)
                publisher.basic_publish("", into, body, pika.BasicProperties(delivery_mode=2))
                if into == third:
                    sent.append(body[:5])
            time.sleep(1)  # time for a move that would not wait for shard 2, and its publishes there
        finally:
            os.kill(stopped, signal.SIGCONT)
        wait_for(lambda: proc.log.count("moved here") > moved, 10, what="the publisher's move")
        wait_for(lambda: setup.queue_declare(third, passive=True).method.message_count == len(sent), 10,
                 what="every publish in the queue")
        got = [body[:5] for _method, _props, body in iter(lambda: _get_or_none(setup, third), None)]
        assert got == sent
    finally:
        proc.stop()


def test_a_message_routed_to_queues_on_both_shards_is_confirmed_once_both_have_it(node):
    connection = on_shard(node.port, 0)
    channel = connection.channel()
    exchange = unique("fan")
    channel.exchange_declare(exchange, "fanout", durable=True)
    queues = [queue_on(node, channel, shard) for shard in range(SHARDS)]
    for queue in queues:
        channel.queue_bind(queue, exchange)
    channel.confirm_delivery()
    channel.basic_publish(exchange, "", b"both", pika.BasicProperties(delivery_mode=2), mandatory=True)
    assert [channel.queue_declare(q, passive=True).method.message_count for q in queues] == [1] * SHARDS
    assert [channel.basic_get(q, auto_ack=True)[2] for q in queues] == [b"both"] * SHARDS
    connection.close()


def test_a_fanout_without_confirms_reaches_each_queue_of_the_other_shard_once_in_order(node):
    # a message crosses once per shard, carrying the names of all its queues there
    connection = on_shard(node.port, 0)
    channel = connection.channel()
    exchange = unique("fan")
    channel.exchange_declare(exchange, "fanout")
    queues = [queue_on(node, channel, shard) for shard in (1, 1, 1, 0)]
    gone = queue_on(node, channel, 1)  # deleted while messages for it are on their way
    for queue in queues + [gone]:
        channel.queue_bind(queue, exchange)
    for i in range(300):
        channel.basic_publish(exchange, "", b"%d" % i)
        if i == 150:
            channel.queue_delete(gone)
    for queue in queues:
        bodies = [int(body) for _method, _props, body in iter(lambda q=queue: _get_or_none(channel, q), None)]
        assert bodies == list(range(300)), queue
    connection.close()


def _get_or_none(channel, queue):
    got = channel.basic_get(queue, auto_ack=True)
    return None if got[0] is None else got


def test_get_reject_and_requeue_across_shards_keep_rabbitmqs_flags(node):
    owner, queue, other = across(node)
    channel = other.channel()
    channel.basic_publish("", queue, b"once")
    method, _props, body = channel.basic_get(queue)
    assert (body, method.redelivered, method.message_count) == (b"once", False, 0)
    channel.basic_nack(method.delivery_tag, requeue=True)  # as on one process, the nack is not answered:
    method, _props, body = _get(owner.channel(), queue)  # the message is back once the owner had it
    assert (body, method.redelivered) == (b"once", True)
    assert channel.basic_get(queue)[0] is None
    owner.close()
    other.close()


def test_an_exclusive_queue_lives_with_its_connection_and_goes_with_it(node):
    owner = on_shard(node.port, 1)
    other = on_shard(node.port, 0)
    queue = owner.channel().queue_declare("", exclusive=True).method.queue
    code, _text = channel_error(other.channel().basic_consume, queue, lambda *a: None)
    assert code == 405
    owner.close()
    code, _text = wait_for(lambda: (lambda r: r if r[0] == 404 else None)(
        channel_error(other.channel().queue_declare, queue, passive=True)), 5, what="the exclusive queue gone")
    assert code == 404
    other.close()


def test_a_shard_killed_under_load_loses_nothing_confirmed_and_the_other_keeps_serving(node):
    publisher = on_shard(node.port, 0).channel()
    publisher.confirm_delivery()
    kept = queue_on(node, publisher, 1)  # its messages are on the shard that is killed
    steady = on_shard(node.port, 0).channel()
    local = queue_on(node, steady, 0)
    steady.confirm_delivery()
    confirmed = 0
    for i in range(300):
        publisher.basic_publish("", kept, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        confirmed += 1
    victim = _pid_of_shard(node, 1)
    os.kill(victim, signal.SIGKILL)
    # shard 0's clients of its own queues see nothing
    for i in range(50):
        steady.basic_publish("", local, b"still %d" % i, pika.BasicProperties(delivery_mode=2))
    assert steady.queue_declare(local, passive=True).method.message_count == 50
    wait_for(lambda: _pid_of_shard(node, 1) not in (None, victim), 20, what="shard 1 started again")
    fresh = on_shard(node.port, 1).channel()
    count = wait_for(lambda: fresh.queue_declare(kept, passive=True).method.message_count or None, 20,
                     what="the queue back")
    assert count == confirmed
    bodies = [int(fresh.basic_get(kept, auto_ack=True)[2]) for _ in range(confirmed)]
    assert bodies == list(range(confirmed))
    steady.connection.close()


def test_a_shard_that_held_no_queue_does_not_stop_fewer_shards(tmp_path):
    """Shard 1 served clients but holds no queue or message: the node starts with one shard,
    its queues on shard 0 intact."""
    proc = launch(tmp_path, "--shards", "2")
    wait_for(lambda: proc.log.count("listening for AMQP") >= 2, 20, what="every shard listening")
    client = on_shard(proc.port, 1)
    queue = queue_on(proc, client.channel(), 0)
    client.channel().basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    client.channel().queue_declare(unique("transient"))  # gone with the stop anyway
    client.close()
    proc.stop()
    again = launch(tmp_path, "--data-dir", str(proc.data_dir), "--shards", "1")
    try:
        with pika.BlockingConnection(pika.URLParameters(again.url)) as connection:
            assert connection.channel().basic_get(queue, auto_ack=True)[2] == b"kept"
    finally:
        again.stop()


def test_fewer_shards_than_hold_queues_is_refused_with_the_reason(tmp_path):
    proc = launch(tmp_path, "--shards", "2")
    wait_for(lambda: proc.log.count("listening for AMQP") >= 2, 20, what="every shard listening")
    connection = on_shard(proc.port, 1)
    queue = queue_on(proc, connection.channel(), 1)
    connection.channel().basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    connection.close()
    proc.stop()
    result = subprocess.run([sys.executable, "-m", "cli.server", *PORT_ARGS, "--data-dir", str(proc.data_dir),
                             "--shards", "1"], capture_output=True, text=True, timeout=30,
                            cwd=ROOT)
    assert result.returncode != 0
    assert "shard 1 of this node holds queues ('%s' in vhost '/')" % queue in result.stderr
    assert "start with shards >= 2" in result.stderr
    # and with two shards again, the message is there
    again = launch(tmp_path, "--data-dir", str(proc.data_dir), "--shards", "2")
    try:
        wait_for(lambda: again.log.count("listening for AMQP") >= 2, 20, what="every shard listening")
        channel = on_shard(again.port, 0).channel()
        assert channel.basic_get(queue, auto_ack=True)[2] == b"kept"
    finally:
        again.stop()


def test_a_transaction_into_another_shards_queue_is_there_once_committed(node):
    owner, queue, publisher = across(node)
    channel = publisher.channel()
    channel.tx_select()
    for i in range(20):
        channel.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    assert owner.channel().queue_declare(queue, passive=True).method.message_count == 0
    channel.tx_commit()
    assert owner.channel().queue_declare(queue, passive=True).method.message_count == 20
    channel.basic_publish("", queue, b"rolled back")
    channel.tx_rollback()
    assert owner.channel().queue_declare(queue, passive=True).method.message_count == 20
    owner.close()
    publisher.close()


def test_direct_reply_to_answers_a_caller_on_another_shard(node):
    caller = on_shard(node.port, 0).channel()
    server = on_shard(node.port, 1).channel()
    requests = queue_on(node, server, 1)
    replies = []
    caller.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: replies.append(body), auto_ack=True)
    caller.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    _method, props, body = _get(server, requests)
    # the token is a queue to declare on the caller's shard and on the other (RabbitMQ: 0 messages, 1 consumer)
    for channel in (server, caller):
        declared = channel.queue_declare(props.reply_to, passive=True).method
        assert (declared.queue, declared.message_count, declared.consumer_count) == (props.reply_to, 0, 1)
    server.basic_publish("", props.reply_to, b"pong:" + body)
    wait_for(lambda: caller.connection.process_data_events(0.05) or replies, 5, what="the reply")
    assert replies == [b"pong:ping"]
    # with its consumer gone, the token is no queue on either shard; neither is a name marked for no shard
    caller.basic_cancel(caller.consumer_tags[0])
    for channel in (server, caller):
        code, text = channel_error(channel.connection.channel().queue_declare, props.reply_to, passive=True)
        assert (code, text) == (404, "NOT_FOUND - no queue '%s' in vhost '/'" % props.reply_to)
    code, _text = channel_error(server.connection.channel().queue_declare, "amq.rabbitmq.reply-to.zz", passive=True)
    assert code == 404


def _get(channel, queue, auto_ack: bool = True):
    """The next message of `queue` (polled: it may be on its way from another shard)."""
    return wait_for(lambda: (lambda got: got if got[0] is not None else None)(
        channel.basic_get(queue, auto_ack=auto_ack)), 5, what="a message in %s" % queue)


def test_dead_letters_reach_a_queue_on_another_shard_and_an_alternate_exchange_routes_there(node):
    channel = on_shard(node.port, 0).channel()
    dlx, ae = unique("dlx"), unique("ae")
    channel.exchange_declare(dlx, "fanout", durable=True)
    channel.exchange_declare(ae, "fanout", durable=True)
    dead = queue_on(node, channel, 1)
    channel.queue_bind(dead, dlx)
    channel.queue_bind(dead, ae)
    source = unique("src")
    channel.queue_declare(source, durable=True, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"dies")
    method, _props, _body = _get(channel, source, auto_ack=False)
    channel.basic_reject(method.delivery_tag, requeue=False)
    routed = unique("rx")
    channel.exchange_declare(routed, "direct", arguments={"alternate-exchange": ae})
    channel.basic_publish(routed, "nowhere", b"unroutable")
    other = on_shard(node.port, 1).channel()
    bodies = sorted(_get(other, dead)[2] for _ in range(2))
    assert bodies == [b"dies", b"unroutable"]


def test_single_active_consumer_and_priorities_hold_across_shards(node):
    owner = on_shard(node.port, 1).channel()
    queue = unique("sac")
    owner.queue_declare(queue, durable=True, arguments={"x-single-active-consumer": True})
    got = {0: [], 1: []}
    consumers = []
    for shard in (0, 1):
        channel = on_shard(node.port, shard).channel()
        channel.basic_consume(queue, lambda ch, m, p, body, shard=shard: got[shard].append(body), auto_ack=True)
        consumers.append(channel)
    for i in range(10):
        owner.basic_publish("", queue, b"%d" % i)
    wait_for(lambda: [c.connection.process_data_events(0.02) for c in consumers] and
             len(got[0]) + len(got[1]) == 10, 5, what="every message delivered")
    assert sorted(len(v) for v in got.values()) == [0, 10]  # one consumer got them all


async def test_mqtt_subscribers_get_what_amqp_publishes_on_any_shard(node):
    topic = unique("room") + "/temp"
    async with aiomqtt.Client("127.0.0.1", node.ports["MQTT"], identifier=unique("c")) as subscriber:
        await subscriber.subscribe(topic, qos=1)
        for shard in range(SHARDS):
            channel = on_shard(node.port, shard).channel()
            channel.basic_publish("amq.topic", topic.replace("/", "."), b"from %d" % shard)
            message = await asyncio.wait_for(anext(aiter(subscriber.messages)), 5)
            assert (str(message.topic), message.payload) == (topic, b"from %d" % shard)


def test_deleting_another_shards_queue_answers_its_count_and_honours_if_empty(node):
    owner = on_shard(node.port, 1).channel()
    queue = queue_on(node, owner, 1)
    owner.basic_publish("", queue, b"a")
    owner.basic_publish("", queue, b"b")
    other = on_shard(node.port, 0)
    code, _text = channel_error(other.channel().queue_delete, queue, if_empty=True)
    assert code == 406
    assert other.channel().queue_delete(queue).method.message_count == 2
    code, _text = channel_error(owner.connection.channel().queue_declare, queue, passive=True)
    assert code == 404


def test_a_stream_is_read_from_either_shard_from_an_offset(node):
    writer = on_shard(node.port, 1).channel()
    stream = unique("st")
    writer.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    writer.confirm_delivery()
    for i in range(30):
        writer.basic_publish("", stream, b"%d" % i)
    for shard in range(SHARDS):
        reader = on_shard(node.port, shard).channel()
        reader.basic_qos(prefetch_count=10)
        bodies = []
        for method, props, body in reader.consume(stream, arguments={"x-stream-offset": 10}, inactivity_timeout=5):
            assert method is not None, "stream deliveries stopped after %d" % len(bodies)
            assert props.headers["x-stream-offset"] == 10 + len(bodies)
            bodies.append(int(body))
            reader.basic_ack(method.delivery_tag)
            if len(bodies) == 20:
                break
        assert bodies == list(range(10, 30)), shard


def _refusal(fn, *args, **kwargs) -> tuple[int, str]:
    """The (code, text) of the channel or connection error `fn` ends in."""
    with pytest.raises((pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)) as info:
        fn(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text


def test_a_stream_refuses_the_same_from_either_shard(node):
    """A stream lives on shard 0; a channel of shard 1 hears its refusals
    with the same codes and texts (not a consumer accepted, then cancelled,
    or a get that never answers)."""
    stream = unique("st")
    on_shard(node.port, 0).channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    refusals = []
    for shard in range(SHARDS):
        def channel(prefetch: int = 0):
            """A channel of a new connection on `shard` (540 closes the connection) that stays
            there: it has two channels, and a move needs one."""
            connection = on_shard(node.port, shard)
            connection.channel()
            opened = connection.channel()
            if prefetch:
                opened.basic_qos(prefetch_count=prefetch)
            return opened

        seen = [_refusal(channel().basic_consume, stream, print)]
        for kwargs in ({"auto_ack": True}, {"arguments": {"x-stream-filter": [5]}},
                       {"arguments": {"x-stream-offset": "1x"}}):
            seen.append(_refusal(channel(10).basic_consume, stream, print, **kwargs))
        seen.append(_refusal(channel().basic_get, stream))
        seen.append(_refusal(channel().queue_purge, stream))
        reader = channel(10)
        publisher = reader.connection.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", stream, b"m")
        method, _props, _body = next(reader.consume(stream, arguments={"x-stream-offset": "first"}))
        reader.basic_nack(method.delivery_tag)
        seen.append(_refusal(reader.basic_qos, prefetch_count=10))  # its answer is the nack's refusal
        refusals.append(seen)
    assert [code for code, _text in refusals[0]] == [406, 540, 406, 406, 540, 540, 540]
    assert refusals[1] == refusals[0]


def test_passive_declares_on_either_shard_renew_x_expires(node):
    """Polled by passive declares from the queue's own shard and from the
    other, queues on shard 1 outlive their x-expires; one left alone goes."""
    owner = on_shard(node.port, 1)
    channel = owner.channel()
    lease = {"x-expires": 1500}
    from_owner, from_other, left = (queue_on(node, channel, 1, lease) for _ in range(3))
    other = on_shard(node.port, 0).channel()

    def gone(name: str) -> bool:
        """A bind on a channel of its own: a passive declare would renew the lease."""
        try:
            owner.channel().queue_bind(name, "amq.direct", unique("probe"))
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            return True
        return False

    def left_is_gone() -> bool:
        channel.queue_declare(from_owner, passive=True)
        other.queue_declare(from_other, passive=True)
        return gone(left)

    wait_for(left_is_gone, 20, what="the queue left alone expired")
    assert not gone(from_owner) and not gone(from_other)


def test_the_memory_alarm_is_the_nodes_and_blocks_publishers_on_every_shard(node):
    """One node, one alarm (as RabbitMQ): a watermark set through the management API (shard 0)
    blocks a publisher on each shard, and its clearing unblocks both; the node's memory is
    every shard's."""
    wait_for(lambda: "HTTP" in node.ports, 20, what="the management listener")
    http = node.ports["HTTP"]
    publishers = [on_shard(node.port, shard, client_properties={"connection_name": "alarm-%d" % shard})
                  for shard in range(SHARDS)]
    notices = [Notices(publisher) for publisher in publishers]
    names = {"alarm-%d" % shard for shard in range(SHARDS)}

    def states() -> set:
        rows = call(http, "GET", "/api/connections").body
        return {row["state"] for row in rows if row["client_properties"].get("connection_name") in names}

    try:
        assert call(http, "PUT", "/api/hutch/vm-memory-high-watermark", {"value": "1000"}).status == 204
        assert call(http, "GET", "/api/nodes").body[0]["mem_alarm"]
        assert states() == {"blocking"}
        for publisher, seen in zip(publishers, notices):
            publisher.channel().basic_publish("", unique("nowhere"), b"during")
            pump(publisher, lambda seen=seen: seen.seen)
            assert [(type(m).__name__, m.reason) for m in seen.seen] == [("Blocked", "low on memory")]
        wait_for(lambda: states() == {"blocked"}, 10, what="both publishers blocked")
    finally:
        assert call(http, "PUT", "/api/hutch/vm-memory-high-watermark", {"value": 0.4}).status == 204
    assert not call(http, "GET", "/api/nodes").body[0]["mem_alarm"]
    for publisher, seen in zip(publishers, notices):
        pump(publisher, lambda seen=seen: len(seen.seen) == 2)
        assert type(seen.seen[1]).__name__ == "Unblocked"
    assert states() == {"running"}
    # the node's memory counts every shard's (each tells shard 0 at every alarm check, each second)
    def resident(shard: int) -> int:
        with open("/proc/%d/statm" % _pid_of_shard(node, shard)) as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    wait_for(lambda: call(http, "GET", "/api/nodes").body[0]["mem_used"] > resident(0) + resident(1) // 2, 10,
             what="the node's memory counting every shard")
    for publisher in publishers:
        publisher.close()


def test_purging_another_shards_queue_answers_the_owners_count(node):
    owner = on_shard(node.port, 1).channel()
    queue = queue_on(node, owner, 1)
    for body in (b"a", b"b", b"c"):
        owner.basic_publish("", queue, body)
    other = on_shard(node.port, 0).channel()
    assert other.queue_purge(queue).method.message_count == 3
    assert owner.queue_declare(queue, passive=True).method.message_count == 0


def test_a_connection_moves_to_the_shard_of_its_queue_and_the_client_notices_nothing(node):
    """(With moves off it stays, and is served across shards.)"""
    owner = on_shard(node.port, 1).channel()
    queue = queue_on(node, owner, 1)
    consumer = on_shard(node.port, 0)
    channel = consumer.channel()
    channel.basic_qos(prefetch_count=3)
    moved = node.log.count("moved here")
    for i in range(10):
        owner.basic_publish("", queue, b"%d" % i)
    bodies = []
    for method, _props, body in channel.consume(queue, inactivity_timeout=5):
        assert method is not None
        bodies.append(int(body))
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == 10:
            break
    assert bodies == list(range(10))
    channel.cancel()
    wait_for(lambda: node.log.count("moved here") == moved + node.moves, 5, what="the consumer's move logged")
    # a publisher whose every publish is for that shard's queue moves there too, confirms going on
    publisher = on_shard(node.port, 0).channel()
    publisher.confirm_delivery()
    for i in range(200):
        publisher.basic_publish("", queue, b"p%d" % i)
    wait_for(lambda: node.log.count("moved here") == moved + 2 * node.moves, 5, what="the publisher's move logged")
    assert publisher.queue_declare(queue, passive=True).method.message_count == 200


@pytest.mark.parametrize("qos", [0, 1])
async def test_mqtt_persistent_sessions_whose_queues_live_on_either_shard_get_their_messages(node, qos):
    topic = unique("dev") + "/state"
    clients = [aiomqtt.Client("127.0.0.1", node.ports["MQTT"], identifier=unique("p"), clean_session=False)
               for _ in range(2 * SHARDS)]
    for client in clients:  # a persistent session's queue is placed as any durable queue
        await client.__aenter__()
        await client.subscribe(topic, qos=qos)
    try:
        on_shard(node.port, 1).channel().basic_publish("amq.topic", topic.replace("/", "."), b"on")
        for client in clients:
            message = await asyncio.wait_for(anext(aiter(client.messages)), 5)
            assert (message.payload, message.qos) == (b"on", qos)
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)


def _persistent_session_on(node, shard: int, qos: int) -> tuple[str, str]:
    """(client id, topic) of a persistent MQTT session subscribed at `qos`
    whose queue lives on `shard` (placed as any durable queue: sessions are
    made until one lands there; the others are ended then)."""
    extra = []
    try:
        for _ in range(4 * SHARDS):
            cid, topic = unique("ps"), unique("t")
            with RawMQTT(node.ports["MQTT"]) as raw:
                raw.connect(cid, clean=False)
                raw.send(subscribe_packet(1, (topic, qos)))
                assert raw.read() == (9, 0, b"\x00\x01" + bytes((qos,)))
                raw.send(DISCONNECT)
            if placement(node, queue_name(cid, qos)) == shard:
                return cid, topic
            extra.append(cid)
    finally:
        for cid in extra:
            with RawMQTT(node.ports["MQTT"]) as raw:
                raw.connect(cid, clean=True)
    raise AssertionError("no session queue placed on shard %d" % shard)


def test_mqtt_qos2_resumes_with_the_same_packet_id_from_a_queue_on_another_shard(node):
    """MQTT is served by shard 0; a QoS 2 message of a session whose queue is on shard 1 comes
    back after a reconnect with the packet id the client holds (the owner's message id
    travels with each delivery)."""
    cid, topic = _persistent_session_on(node, 1, 2)
    with RawMQTT(node.ports["MQTT"]) as raw:
        raw.connect(cid, clean=False)
        on_shard(node.port, 1).channel().basic_publish("amq.topic", topic, b"exactly")
        kind, flags, body = raw.read()
        assert kind == 3
        _topic, qos, pid, _retain, dup, payload = parse_publish(flags, body)
        assert (qos, dup, payload) == (2, False, b"exactly")
    with RawMQTT(node.ports["MQTT"]) as raw:  # no PUBREC was sent: the PUBLISH again, same id, DUP
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        kind, flags, body = raw.read()
        assert kind == 3
        assert parse_publish(flags, body)[1:] == (2, pid, False, True, b"exactly")
    with RawMQTT(node.ports["MQTT"]) as raw:
        raw.connect(cid, clean=True)


def test_mqtt_a_persistent_session_resumed_gets_its_kept_messages_first(node):
    """The QoS 1 messages kept for a persistent session whose queue is on shard 1 go out
    when it reconnects, before the answer to its next PINGREQ, as from a queue on shard 0."""
    cid, topic = _persistent_session_on(node, 1, 1)
    with RawMQTT(node.ports["MQTT"]) as pub:
        pub.connect(unique("pub"))
        for n in range(3):
            pub.send(publish_packet(topic, b"m%d" % n, qos=1, pid=n + 1))
            assert pub.read()[0] == 4  # PUBACK: the queue has it
    with RawMQTT(node.ports["MQTT"]) as raw:
        assert raw.connect(cid, clean=False) == b"\x01\x00"
        assert [payload for _t, _q, _r, _d, payload in until_ping(raw)] == [b"m0", b"m1", b"m2"]
        raw.send(DISCONNECT)
    with RawMQTT(node.ports["MQTT"]) as raw:
        raw.connect(cid, clean=True)


def test_the_shards_end_with_their_supervisor_even_a_sigkilled_one(tmp_path):
    proc = launch(tmp_path, "--shards", str(SHARDS))
    wait_for(lambda: all(_pid_of_shard(proc, index) for index in range(SHARDS)), 10, what="every shard started")
    proc.kill()
    wait_for(lambda: not any(_pid_of_shard(proc, index) for index in range(SHARDS)), 10, what="the shards gone")


def test_a_shard_keeps_its_messages_when_shard_0_lost_its_definitions(tmp_path):
    proc = launch(tmp_path, "--shards", str(SHARDS))
    connection = on_shard(proc.port, 1)
    queue = queue_on(proc, connection.channel(), 1)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    connection.close()
    proc.stop()
    for name in os.listdir(proc.data_dir):  # shard 0's store of definitions is lost
        if name.startswith("definitions.db"):
            os.remove(os.path.join(proc.data_dir, name))
    again = launch(tmp_path, "--data-dir", str(proc.data_dir), "--shards", str(SHARDS))
    try:
        wait_for(lambda: "shard 0 does not know it: kept" in again.log, 20, what="the queue kept")
        channel = on_shard(again.port, 1).channel()
        assert channel.basic_get(queue, auto_ack=True)[2] == b"kept"
    finally:
        again.stop()
