"""A node of several shards under the faults one process never has
(docs/scaling.md, "When a shard ends"): a shard killed or stopped while
another shard's clients hold its deliveries or wait on it, and traffic that
once broke the links between shards. Real broker processes, pika clients;
connections stay where the kernel landed them (moves off)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest

from conftest import launch
from helpers import channel_error, unique, wait_for
from shard_kit import on_shard, pid_of_shard, placement, queue_on
from vhosts.node import NODE

PERSISTENT = pika.BasicProperties(delivery_mode=2)
SHARD_TIMEOUT = 2.0  # seconds a silent link is allowed (shard_timeout), short for the test


@pytest.fixture(scope="module", params=[2, 3], ids=["2-shards", "3-shards"])
def node(request, tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("shard-faults"), "--shards", str(request.param), "--shard-moves", "false",
                  "--shard-timeout", str(SHARD_TIMEOUT))
    proc.shards = request.param
    yield proc
    proc.stop()


def restarted(node, shard: int, old: int) -> int:
    """Wait until the supervisor started shard `shard` again (its pid was `old`); the new pid."""
    return wait_for(lambda: pid_of_shard(node, shard, node.shards) not in (None, old)
                    and pid_of_shard(node, shard, node.shards), 30, what="shard %d started again" % shard)


def fill(channel, queue: str, count: int, prefix: bytes) -> None:
    channel.confirm_delivery()
    for i in range(count):
        channel.basic_publish("", queue, prefix + b"%d" % i, PERSISTENT)


def messages_in(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_a_stale_ack_after_the_owner_restarted_settles_nothing_of_its_new_deliveries(node):
    """A channel of shard 0 holds five unacked gets of queue A (shard 1); shard 1 is killed and
    comes back; the channel gets five of queue B (shard 1) and acks the five stale tags with
    `multiple`. B's five were never acked: they are all in B again once the channel closes,
    and A keeps its five too (their acks reached no owner that held them)."""
    setup = on_shard(node.port, 0)
    publisher = setup.channel()
    a, b = queue_on(node, publisher, 1, shards=node.shards), queue_on(node, publisher, 1, shards=node.shards)
    fill(publisher, a, 5, b"a")
    client = on_shard(node.port, 0)
    channel = client.channel()
    stale = [channel.basic_get(a)[0].delivery_tag for _ in range(5)]
    assert stale == [1, 2, 3, 4, 5]
    victim = pid_of_shard(node, 1, node.shards)
    os.kill(victim, signal.SIGKILL)
    restarted(node, 1, victim)
    wait_for(lambda: messages_in(publisher, a) == 5, 20, what="queue A recovered")
    fill(publisher, b, 5, b"b")
    fresh = [channel.basic_get(b) for _ in range(5)]
    assert [body for _method, _props, body in fresh] == [b"b%d" % i for i in range(5)]
    channel.basic_ack(stale[-1], multiple=True)
    client.close()
    wait_for(lambda: messages_in(publisher, b) == 5, 10, what="queue B's unacked messages back")
    assert messages_in(publisher, a) == 5
    got = publisher.basic_get(b, auto_ack=True)
    assert got[2] == b"b0" and got[0].redelivered
    setup.close()


def test_a_stopped_shard_is_killed_and_restarted_and_the_others_serve_meanwhile(node):
    """Shard 1 stops (SIGSTOP, as on a hung disk): a client of shard 0 is answered a declare
    and serves its own queue within the shard timeout, shard 1 is taken for stalled, killed
    and started again, and its queue's confirmed messages are all there."""
    setup = on_shard(node.port, 0)
    channel = setup.channel()
    theirs, ours = queue_on(node, channel, 1, shards=node.shards), queue_on(node, channel, 0, shards=node.shards)
    fill(channel, theirs, 10, b"t")
    victim = pid_of_shard(node, 1, node.shards)
    os.kill(victim, signal.SIGSTOP)
    try:
        started = time.monotonic()
        declared = unique("while-stopped")
        channel.queue_declare(declared, durable=True)  # answered without shard 1
        answered = time.monotonic() - started
        channel.basic_publish("", ours, b"still served", PERSISTENT)
        assert channel.basic_get(ours, auto_ack=True)[2] == b"still served"
        restarted(node, 1, victim)
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert answered < SHARD_TIMEOUT * 4, "the declare waited %.1f s for the stopped shard" % answered
    assert "has stalled: killing it" in node.log
    count = wait_for(lambda: messages_in(channel, theirs) == 10 or None, 20, what="shard 1's queue back")
    assert count
    assert [channel.basic_get(theirs, auto_ack=True)[2] for _ in range(10)] == [b"t%d" % i for i in range(10)]
    # shard 1 synced before it served: it knows what was declared while it was stopped
    on_one = on_shard(node.port, 1)
    on_one.channel().queue_declare(declared, passive=True)
    on_one.close()
    setup.close()


@pytest.mark.timeout(120)
def test_a_burst_larger_than_a_frame_crosses_and_deletes_nothing_of_a_live_shard(tmp_path):
    """300 transient 1 MiB messages of a queue on shard 1, consumed from shard 0 with prefetch
    300 (one loop turn of the owner hands them all over): every one arrives, the link stays
    up, and an exclusive queue of a live connection on shard 1 is still there."""
    node = launch(tmp_path, "--shards", "2", "--shard-moves", "false")
    node.shards = 2
    try:
        _burst(node)
    finally:
        node.stop()


def _burst(node) -> None:
    owner = on_shard(node.port, 1)
    owned = owner.channel()
    exclusive = owned.queue_declare("", exclusive=True).method.queue
    queue = queue_on(node, owned, 1, shards=node.shards)
    body = b"x" * (1024 * 1024)
    for i in range(300):
        owned.basic_publish("", queue, b"%03d" % i + body)
    consumer = on_shard(node.port, 0)
    channel = consumer.channel()
    channel.basic_qos(prefetch_count=300)
    got = []
    deadline = time.monotonic() + 60
    for method, _props, message in channel.consume(queue, inactivity_timeout=5):
        if method is not None:
            got.append(message[:3])
            channel.basic_ack(method.delivery_tag)
        if len(got) == 300 or time.monotonic() > deadline:
            break
    channel.cancel()
    assert got == [b"%03d" % i for i in range(300)]
    assert "the link to shard 1 is lost" not in node.log
    owned.queue_declare(exclusive, passive=True)  # still there: its connection lives
    consumer.close()
    owner.close()


def test_a_queue_whose_shard_stays_down_answers_rabbitmqs_404_and_is_kept(node):
    """Shard 1 ends and cannot come back for a while (its supervisor is stopped): a declare or
    delete of its queue from shard 0 is answered within the shard timeout with RabbitMQ's 404
    for a queue whose node is down, the queue is not deleted, and once shard 1 is back every
    confirmed message is there."""
    setup = on_shard(node.port, 0)
    channel = setup.channel()
    theirs = queue_on(node, channel, 1, shards=node.shards)
    fill(channel, theirs, 10, b"k")
    victim = pid_of_shard(node, 1, node.shards)
    node.process.send_signal(signal.SIGSTOP)  # the supervisor: nothing starts shard 1 again
    try:
        os.kill(victim, signal.SIGKILL)
        for attempt in (lambda c: c.queue_declare(theirs, passive=True),
                        lambda c: c.queue_declare(theirs, durable=True),
                        lambda c: c.queue_delete(theirs)):
            started = time.monotonic()
            code, text = channel_error(attempt, setup.channel())
            assert (code, text) == (404, "NOT_FOUND - home node '%s' of durable queue '%s' in vhost '/' is down or "
                                         "inaccessible" % (NODE, theirs))
            assert time.monotonic() - started < SHARD_TIMEOUT * 3
        # the other shards' queues are served meanwhile
        ours = setup.channel().queue_declare(unique("meanwhile"), durable=True).method.queue
        assert placement(node, ours) != 1
    finally:
        node.process.send_signal(signal.SIGCONT)
    restarted(node, 1, victim)
    again = setup.channel()
    assert wait_for(lambda: messages_in(again, theirs) == 10, 20, what="shard 1's queue back")
    assert [again.basic_get(theirs, auto_ack=True)[2] for _ in range(10)] == [b"k%d" % i for i in range(10)]
    setup.close()


def _rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for pid %d" % pid)


@pytest.mark.timeout(120)
def test_a_link_to_a_shard_that_reads_nothing_bounds_what_its_senders_buffer(tmp_path):
    """Shard 1 stops reading (SIGSTOP, within a long shard timeout): a publisher on shard 0
    into shard 1's queue is slowed (credit flow) once the link holds a bounded number of bytes,
    instead of shard 0 buffering all it sends; once shard 1 reads again every message is there."""
    node = launch(tmp_path, "--shards", "2", "--shard-moves", "false", "--shard-timeout", "60")
    node.shards = 2
    try:
        setup = on_shard(node.port, 0)
        queue = queue_on(node, setup.channel(), 1, shards=2)
        publisher = on_shard(node.port, 0).channel()
        shard0, shard1 = pid_of_shard(node, 0), pid_of_shard(node, 1)
        before = _rss(shard0)
        sent = []
        body = b"x" * 65536
        count = 2000  # 125 MiB
        thread = threading.Thread(target=lambda: [publisher.basic_publish("", queue, body) or sent.append(1)
                                                 for _ in range(count)], daemon=True)
        os.kill(shard1, signal.SIGSTOP)
        try:
            thread.start()
            time.sleep(4)  # the publisher writes as fast as it may
            grown = _rss(shard0) - before
            held_back = len(sent) < count
        finally:
            os.kill(shard1, signal.SIGCONT)
        thread.join(60)
        assert held_back, "the publisher was never slowed (shard 0 grew by %d MiB)" % (grown >> 20)
        assert grown < 48 * 1024 * 1024, "shard 0 grew by %d MiB while shard 1 read nothing" % (grown >> 20)
        assert wait_for(lambda: messages_in(setup.channel(), queue) == count, 30, what="every message in the queue")
    finally:
        node.stop()
