"""Transactions on a node of several shards (docs/scaling.md, "Transactions
across shards"): real pika clients on brokers started with --shards 1, 2 and
3, the client on shard 0 and the queues on every shard. A commit ends as on
one process, which answers as RabbitMQ 3.10.8 does: commit-ok once every
queue has its messages, or, when a queue refused one (reject-publish) or its
shard ended before it answered, the rest applied and the channel closed with
406 "partial tx completion".
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest
from pamqp import commands

from amqp_raw import TIMEOUT, RawClient
from conftest import launch
from helpers import channel_error, connect, unique, wait_for
from shard_kit import on_shard, pid_of_shard, queue_on

PARTIAL = (406, "PRECONDITION_FAILED - partial tx completion")
REFUSING = {"x-max-length": 1, "x-overflow": "reject-publish"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
SHARD_TIMEOUT = 2.0  # how long work waits for a shard that is down (shard_timeout), short for the tests


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: "%d-shards" % n)
def node(request, tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("tx"), "--shards", str(request.param), "--shard-timeout", str(SHARD_TIMEOUT))
    proc.shards = request.param
    yield proc
    proc.stop()


def client(node, shard: int = 0) -> pika.BlockingConnection:
    """A connection served by `shard` (one process has no `shard` property: any connection)."""
    return connect(node.port) if node.shards == 1 else on_shard(node.port, shard)


def placed(node, channel, shard: int, arguments: dict | None = None) -> str:
    return queue_on(node, channel, shard, arguments, shards=node.shards)


def count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def drain(channel, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def raw_on_shard_0(node) -> RawClient:
    """A raw client through the handshake, served by shard 0."""
    for _ in range(200):
        raw = RawClient.connected(node.port)
        if raw.start.server_properties["shard"] == 0:
            return raw
        raw.close()
    raise AssertionError("no connection landed on shard 0")


def ended(pid: int) -> bool:
    """The process is gone, or a zombie its stopped supervisor has not reaped (its
    last threads may still be closing its sockets: the links may be lost a moment later)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def needs_two_shards(node) -> None:
    if node.shards == 1:
        pytest.skip("one process has no other shard to stop")


@pytest.mark.parametrize("refusing_on", ["last", "first"])
def test_a_commit_a_queue_refused_part_of_applies_the_rest_and_closes_the_channel(node, refusing_on):
    """A full reject-publish queue refuses a transaction's publish: the other
    publishes and the ack are applied, the channel closes with 406 "partial tx
    completion" (RabbitMQ 3.10.8's answer), and the connection serves on; the
    same at one shard and at several, with the refusing queue on the client's
    shard or on the last one."""
    connection = client(node)
    setup = connection.channel()
    refusing = placed(node, setup, node.shards - 1 if refusing_on == "last" else 0, REFUSING)
    taking = [placed(node, setup, shard) for shard in range(node.shards)]
    acked = taking[-1]
    setup.confirm_delivery()
    setup.basic_publish("", refusing, b"held", PERSISTENT)
    setup.basic_publish("", acked, b"acked in the tx", PERSISTENT)
    tx = connection.channel()
    tx.tx_select()
    method, _props, _body = tx.basic_get(acked)
    tx.basic_ack(method.delivery_tag)
    tx.basic_publish("", refusing, b"refused", PERSISTENT)
    for queue in taking:
        tx.basic_publish("", queue, b"taken", PERSISTENT)
    assert channel_error(tx.tx_commit) == PARTIAL
    check = connection.channel()
    assert drain(check, refusing) == [b"held"]
    assert [drain(check, queue) for queue in taking] == [[b"taken"]] * node.shards  # the ack applied too
    again = connection.channel()
    again.tx_select()
    again.basic_publish("", taking[0], b"next")
    again.tx_commit()
    assert count(check, taking[0]) == 1
    connection.close()


@pytest.mark.timeout(90)
def test_a_commit_whose_queues_shard_is_killed_is_answered_and_loses_nothing_answered(node):
    """The last shard is stopped (SIGSTOP) while a transaction publishes into
    its queue and the others', commits, and is then SIGKILLed: the commit is
    answered within bounded time with 406 "partial tx completion" (RabbitMQ's
    answer when a queue's node goes down during a commit), the other shards'
    queues keep what they took, the connection serves on, and once the shard
    is back its queue holds every message of the commit answered before."""
    needs_two_shards(node)
    connection = client(node)
    setup = connection.channel()
    last = node.shards - 1
    far = placed(node, setup, last)
    others = [placed(node, setup, shard) for shard in range(last)]
    tx = connection.channel()
    tx.tx_select()
    committed = [b"committed %d" % i for i in range(10)]
    for body in committed:
        tx.basic_publish("", far, body, PERSISTENT)
    tx.tx_commit()  # answered: the last shard has them on disk
    victim = pid_of_shard(node, last, of=node.shards)
    os.kill(victim, signal.SIGSTOP)
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
    try:
        tx.basic_publish("", far, b"never answered", PERSISTENT)
        for queue in others:
            tx.basic_publish("", queue, b"taken", PERSISTENT)
        killer.start()
        started = time.monotonic()
        assert channel_error(tx.tx_commit) == PARTIAL
        waited = time.monotonic() - started
    finally:
        killer.cancel()
        if not killer.finished.is_set() or killer.is_alive():
            os.kill(victim, signal.SIGKILL)
    assert 0.4 < waited < 10  # it waited for the stopped shard, and not for its restart
    check = connection.channel()
    assert [drain(check, queue) for queue in others] == [[b"taken"]] * last
    wait_for(lambda: pid_of_shard(node, last, of=node.shards) not in (None, victim), 20,
             what="the last shard started again")
    back = on_shard(node.port, last).channel()
    wait_for(lambda: count(back, far) or None, 20, what="its queue back")
    # what the shard had answered survived its SIGKILL; what it never read is not made up
    assert drain(back, far) == committed
    after = connection.channel()
    after.tx_select()
    for queue in [far, *others]:
        after.basic_publish("", queue, b"after", PERSISTENT)
    after.tx_commit()
    assert [drain(check, queue) for queue in [far, *others]] == [[b"after"]] * node.shards
    back.connection.close()
    connection.close()


@pytest.mark.timeout(90)
def test_a_commit_for_a_shard_that_stays_down_is_answered_after_the_shard_timeout(node):
    """The last shard SIGKILLed and kept down (its supervisor stopped): a
    commit into its queue and the others' waits for it at most shard_timeout,
    as a confirm does, and is then answered 406 "partial tx completion"; once
    the shard is back its queue holds nothing of that commit."""
    needs_two_shards(node)
    connection = client(node)
    setup = connection.channel()
    last = node.shards - 1
    far = placed(node, setup, last)
    others = [placed(node, setup, shard) for shard in range(last)]
    tx = connection.channel()
    tx.tx_select()
    victim = pid_of_shard(node, last, of=node.shards)
    lost = "shard 0: the link to shard %d is lost" % last
    losses, serving = node.log.count(lost), node.log.count("listening for AMQP")
    node.process.send_signal(signal.SIGSTOP)  # the supervisor starts the shard again only once it runs again
    try:
        os.kill(victim, signal.SIGKILL)
        # shard 0 knows: a commit sent before would be answered at the link's loss, not wait
        wait_for(lambda: ended(victim) and node.log.count(lost) > losses, 10, what="the shard ended")
        for queue in [far, *others]:
            tx.basic_publish("", queue, b"while down", PERSISTENT)
        started = time.monotonic()
        assert channel_error(tx.tx_commit) == PARTIAL
        waited = time.monotonic() - started
    finally:
        node.process.send_signal(signal.SIGCONT)
    assert waited < SHARD_TIMEOUT + 3
    check = connection.channel()
    assert [drain(check, queue) for queue in others] == [[b"while down"]] * last
    wait_for(lambda: node.log.count("listening for AMQP") > serving, 20, what="the last shard serving again")
    back = on_shard(node.port, last).channel()
    assert drain(back, far) == []
    back.connection.close()
    connection.close()


def test_a_commit_across_every_shards_queues_is_answered_once_all_have_them(node):
    """Publishes (direct and through a fanout) and acks on queues of every
    shard: rollback undoes them all, commit-ok comes once every queue has its
    messages, and a transactional channel refuses confirm mode (and a
    confirming one tx mode) as one process does."""
    connection = client(node)
    setup = connection.channel()
    queues = [placed(node, setup, shard) for shard in range(node.shards)]
    fanout = unique("tx-fanout")
    setup.exchange_declare(fanout, "fanout")
    for queue in queues:
        setup.queue_bind(queue, fanout)
    setup.confirm_delivery()
    for queue in queues:
        setup.basic_publish("", queue, b"old", PERSISTENT)
    tx = connection.channel()
    tx.tx_select()
    tags = [tx.basic_get(queue)[0].delivery_tag for queue in queues]
    for attempt in ("rolled back", "committed"):
        for tag in tags:
            tx.basic_ack(tag)
        for queue in queues:
            tx.basic_publish("", queue, b"direct", PERSISTENT)
        tx.basic_publish(fanout, "", b"fanned", PERSISTENT)
        if attempt == "rolled back":
            tx.tx_rollback()
            assert [count(setup, queue) for queue in queues] == [0] * node.shards  # "old" still unacked
    tx.tx_commit()
    assert [count(setup, queue) for queue in queues] == [2] * node.shards
    assert [drain(setup, queue) for queue in queues] == [[b"direct", b"fanned"]] * node.shards
    assert channel_error(tx.confirm_delivery) == (406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
    assert channel_error(setup.tx_select) == (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
    connection.close()


def test_a_commit_of_a_channel_closed_meanwhile_answers_nothing_on_its_number(node):
    """A channel closed while its commit waits for another shard's queue, and
    opened again under the same number: the old commit's answer does not
    reach the new channel, whose own commit is answered once."""
    needs_two_shards(node)
    setup = client(node).channel()
    far = placed(node, setup, node.shards - 1)
    raw = raw_on_shard_0(node)
    try:
        raw.open_channel(1)
        raw.send_frame(commands.Tx.Select(), 1)
        raw.expect(commands.Tx.SelectOk, 1)
        raw.publish(far, b"in the closed channel's tx")
        victim = pid_of_shard(node, node.shards - 1, of=node.shards)
        os.kill(victim, signal.SIGSTOP)
        try:
            raw.send_frame(commands.Tx.Commit(), 1)
            raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1)
            raw.expect(commands.Channel.CloseOk, 1)
            raw.open_channel(1)
            raw.send_frame(commands.Tx.Select(), 1)
            raw.expect(commands.Tx.SelectOk, 1)
        finally:
            os.kill(victim, signal.SIGCONT)
        wait_for(lambda: count(setup, far) == 1, 10, what="the old commit's message in the queue")
        raw.send_frame(commands.Tx.Commit(), 1)
        raw.expect(commands.Tx.CommitOk, 1)
        assert raw.collect(timeout=0.5) == [TIMEOUT]
    finally:
        raw.close()
    setup.connection.close()
