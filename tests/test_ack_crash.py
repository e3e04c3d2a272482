"""An ack the client could have seen processed never comes back after SIGKILL.

AMQP has no reply to basic.ack, but a client that gets any later reply on the
same connection knows the ack was handled before it (a connection's frames
are handled in order). hutch therefore writes an ack's record to the
operating system before it sends anything else on that connection
(docs/storage.md, "Acks"); a process crash cannot lose it then.

Each cycle, on one data directory: a publisher connection keeps the disk
writer busy with confirmed persistent messages while a consumer connection
(pika, a real client) takes deliveries with manual acks, acks some of them,
then waits for a later reply on the same connection (a basic.qos-ok, or a
queue.declare-ok) and the broker is killed at once (SIGKILL). After the
restart nothing acked may be delivered again.

On a node of several shards an ack of a queue another shard owns is written
by the owner; the same holds there (`test_an_ack_of_another_shards_queue_...`).
"""
from __future__ import annotations

import threading

import pika
import pytest

from conftest import launch
from helpers import connect, wait_for
from shard_kit import on_shard, queue_on

pytestmark = pytest.mark.timeout(120)

CYCLES = 12
QUEUE = "acked-then-killed"
FILLER = "filler"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _keep_writing(port: int, stop: threading.Event) -> None:
    """Confirmed persistent publishes (to another queue) until `stop` or the
    kill: the disk writer always has work queued, so an ack's record is not
    written the moment it is queued (without the rule, 18 to 80 acked
    messages came back within the first three cycles)."""
    try:
        connection = connect(port)
        channel = connection.channel()
        channel.confirm_delivery()
        while not stop.is_set():
            channel.basic_publish("", FILLER, b"filler", PERSISTENT)
    except Exception:  # noqa: BLE001 - the broker was killed under it
        pass


def _came_back(channel, acked: set) -> set:
    """Takes every message in QUEUE; returns those that were acked before."""
    back = set()
    while (got := channel.basic_get(QUEUE, auto_ack=True))[0] is not None:
        back.add(got[2])
    return back & acked


def test_acked_before_a_later_reply_never_comes_back(tmp_path):
    data_dir = tmp_path / "data"
    broker = launch(tmp_path, "--data-dir", str(data_dir))
    acked: set[bytes] = set()
    try:
        for cycle in range(CYCLES + 1):
            connection = connect(broker.port)
            channel = connection.channel()
            channel.queue_declare(QUEUE, durable=True)
            channel.queue_declare(FILLER, durable=True)
            returned = _came_back(channel, acked)
            assert not returned, "cycle %d: %d acked messages came back" % (cycle, len(returned))
            if cycle == CYCLES:
                connection.close()
                break
            channel.queue_purge(FILLER)
            channel.confirm_delivery()
            for i in range(200):
                channel.basic_publish("", QUEUE, b"c%d-m%d" % (cycle, i), PERSISTENT)
            channel.close()

            stop = threading.Event()
            writer = threading.Thread(target=_keep_writing, args=(broker.port, stop), daemon=True)
            writer.start()
            consumer = connection.channel()
            # A later reply on the same connection: every ack sent before it was handled.
            reply = (lambda: consumer.basic_qos(prefetch_count=50)) if cycle % 2 else \
                (lambda: consumer.queue_declare(QUEUE, durable=True, passive=True))
            _ack_120(consumer, QUEUE, cycle, acked, reply)
            broker.crash()
            stop.set()
            writer.join(10)
            broker = launch(tmp_path, "--data-dir", str(data_dir))
    finally:
        broker.stop()


def _ack_120(consumer, queue: str, cycle: int, acked: set, reply) -> None:
    """Consume and ack 120 messages; after every 40, reply() (a method with an answer) and
    count the messages acked before it in `acked`."""
    consumer.basic_qos(prefetch_count=50)
    handled = []
    for method, _props, body in consumer.consume(queue, inactivity_timeout=10):
        assert method is not None, "cycle %d: deliveries stopped" % cycle
        consumer.basic_ack(method.delivery_tag)
        handled.append(body)
        if len(handled) % 40 == 0:
            reply()
            acked.update(handled)
            if len(handled) == 120:
                return


def test_an_ack_of_another_shards_queue_never_comes_back(tmp_path):
    """The consumer's connection is on shard 0 and the queue on shard 1
    (connections stay where they land: shard_moves off), whose writer is kept
    busy by publishers of large messages into another of its queues; the
    consumer acks, sees a later reply, and the whole node is killed. Before
    the rule held across shards, 40 to 77 acked messages came back in 10
    cycles, in each of two runs."""
    data_dir = tmp_path / "data"
    flags = ("--data-dir", str(data_dir), "--shards", "2", "--shard-moves", "false")
    broker = launch(tmp_path, *flags)
    broker.data_dir = data_dir
    owner = on_shard(broker.port, 1)
    queue, filler = queue_on(broker, owner.channel(), 1), queue_on(broker, owner.channel(), 1)
    owner.close()
    acked: set[bytes] = set()
    try:
        for cycle in range(11):
            if cycle:
                broker = launch(tmp_path, *flags)
                broker.data_dir = data_dir
            connection = on_shard(broker.port, 0)
            channel = connection.channel()
            back = set()
            while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
                back.add(got[2])
            assert not back & acked, "cycle %d: %d acked messages came back" % (cycle, len(back & acked))
            if cycle == 10:
                connection.close()
                break
            channel.queue_purge(filler)
            channel.confirm_delivery()
            for i in range(200):
                channel.basic_publish("", queue, b"c%d-m%d" % (cycle, i), PERSISTENT)

            stop = threading.Event()

            def keep_writing(port=broker.port) -> None:
                try:
                    busy = on_shard(port, 1).channel()
                    busy.confirm_delivery()
                    while not stop.is_set():
                        busy.basic_publish("", filler, b"x" * 1_000_000, PERSISTENT)
                except Exception:  # noqa: BLE001 - the node was killed under it
                    pass

            writers = [threading.Thread(target=keep_writing, daemon=True) for _ in range(2)]
            for writer in writers:
                writer.start()
            wait_for(lambda: channel.queue_declare(filler, passive=True).method.message_count > 0, 10,
                     what="the owner's writer busy")
            consumer = connection.channel()
            # a later reply, from shard 0 itself
            _ack_120(consumer, queue, cycle, acked, lambda: consumer.basic_qos(prefetch_count=50))
            broker.crash()  # the whole node at once (a shard killed through its supervisor lives on a moment)
            stop.set()
            for writer in writers:
                writer.join(10)
    finally:
        broker.stop()
