"""A link between two shards lost while both live, and a shard that did end
(docs/scaling.md, "When a shard ends"): a link broken by a frame that does
not decode (shard_kit.break_link) fails what was in flight on it and
nothing more: the peer's queues stay, its clients serve on, and what shard
0 sends the peer on the next link keeps its order (consumers, acks,
cancels, publishes); a shard SIGKILLed loses its transient and exclusive
queues at once, and one that stalls without its link is fenced once
shard_timeout passed, and only then loses them. Real broker processes,
pika clients; connections stay where the kernel landed them (moves off)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest

from conftest import launch
from helpers import channel_error, unique, wait_for
from shard_kit import break_link, on_shard, pid_of_shard, queue_on

PERSISTENT = pika.BasicProperties(delivery_mode=2)
SHARD_TIMEOUT = 2.0
LOCAL = {"x-queue-master-locator": "client-local"}  # placed on the declaring connection's shard


@pytest.fixture(scope="module", params=[2, 3], ids=["2-shards", "3-shards"])
def node(request, tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("shard-link-loss"), "--shards", str(request.param), "--shard-moves",
                  "false", "--shard-timeout", str(SHARD_TIMEOUT))
    proc.shards = request.param
    yield proc
    proc.stop()


def relinked(node, breaking, shard: int, peer: int) -> None:
    """Run `breaking`, then wait until shard `shard` linked to `peer` again."""
    said = "shard %d: linked to shard %d" % (shard, peer)
    linked = node.log.count(said)
    breaking()
    wait_for(lambda: node.log.count(said) > linked, 10, what="shard %d linked to shard %d again" % (shard, peer))


def messages_in(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_a_link_lost_while_its_peer_lives_deletes_none_of_its_queues(node):
    """Shard 0 reads a frame that does not decode on its link with shard 1 and closes it: shard 1's
    exclusive and transient queues are still known to shard 0 (and the others) and usable from
    there, and shard 1's client connection serves on, as do both processes. On three shards a
    consumer on shard 2 of shard 1's transient queue, whose link never broke, is not cancelled
    and gets what follows (it was, while shard 0 took the loss for shard 1's end and dropped the
    queue everywhere, even once shard 1's sync gave it back)."""
    pids = pid_of_shard(node, 0, node.shards), pid_of_shard(node, 1, node.shards)
    owner = on_shard(node.port, 1)
    mine = owner.channel()
    exclusive = mine.queue_declare("", exclusive=True).method.queue
    transient = mine.queue_declare(unique("transient"), arguments=LOCAL).method.queue
    mine.basic_publish("", transient, b"before")
    third = None
    if node.shards > 2:
        consumed = mine.queue_declare(unique("consumed"), arguments=LOCAL).method.queue
        third = Consumer(on_shard(node.port, 2).channel(), consumed)
    refused = node.log.count("an undecodable frame; closing the link")
    relinked(node, lambda: break_link(pids[1], pids[0]), 1, 0)
    assert node.log.count("an undecodable frame; closing the link") == refused + 1
    if third is not None:
        mine.basic_publish("", consumed, b"to the third")
        third.until(lambda: third.got or third.cancelled, "a delivery on shard 2")
        assert not third.cancelled and [body for _method, body in third.got] == [b"to the third"]
        third.channel.connection.close()
    client = on_shard(node.port, 0)
    theirs = client.channel()
    assert messages_in(theirs, transient) == 1
    theirs.basic_publish("", transient, b"after")
    code, _text = channel_error(client.channel().queue_declare, exclusive, passive=True)
    assert code == 405  # still there, and still its connection's
    for shard in range(2, node.shards):  # the others too
        elsewhere = on_shard(node.port, shard)
        assert messages_in(elsewhere.channel(), transient) in (1, 2)
        elsewhere.close()
    assert wait_for(lambda: mine.basic_get(transient, auto_ack=True)[2], 5, what="the first message") == b"before"
    assert wait_for(lambda: mine.basic_get(transient, auto_ack=True)[2], 5, what="the second message") == b"after"
    mine.basic_publish("", exclusive, b"mine")
    assert wait_for(lambda: mine.basic_get(exclusive, auto_ack=True)[2], 5, what="the exclusive queue's") == b"mine"
    assert (pid_of_shard(node, 0, node.shards), pid_of_shard(node, 1, node.shards)) == pids
    assert "started again" not in node.log and "killing it" not in node.log
    client.close()
    owner.close()


class Consumer:
    """A pika consumer whose deliveries and the broker's cancel are kept."""

    def __init__(self, channel, queue: str) -> None:
        self.channel = channel
        self.got: list = []
        self.cancelled = False
        channel.add_on_cancel_callback(lambda _frame: setattr(self, "cancelled", True))
        self.tag = channel.basic_consume(queue, lambda _ch, method, _props, body: self.got.append((method, body)))

    def until(self, predicate, what: str):
        connection = self.channel.connection

        def events():
            connection.process_data_events(time_limit=0.05)
            return predicate()
        return wait_for(events, 10, what=what)


@pytest.mark.parametrize("single_active", [False, True], ids=["plain", "single-active"])
def test_after_a_lost_link_what_shard_0_sends_its_peer_keeps_its_order(node, single_active):
    """A consumer on shard 0 of shard 1's queue; the link is lost (shard 1 reads a frame that does
    not decode from shard 0's end) and made again: the consumer is cancelled by the broker, and
    one consuming again gets every message published after, in order and none redelivered (no
    stand-in of the lost link takes any), acks them for good, and its cancel ends it; with single
    active consumer, the next consumer then gets what follows."""
    setup = on_shard(node.port, 0)
    publisher = setup.channel()
    publisher.confirm_delivery()
    queue = queue_on(node, publisher, 1, arguments={"x-single-active-consumer": True} if single_active else None,
                     shards=node.shards)
    client = on_shard(node.port, 0)
    channel = client.channel()
    channel.basic_qos(prefetch_count=50)
    first = Consumer(channel, queue)
    pids = pid_of_shard(node, 0, node.shards), pid_of_shard(node, 1, node.shards)
    relinked(node, lambda: break_link(pids[0], pids[1]), 0, 1)
    first.until(lambda: first.cancelled, "the consumer cancelled by the broker")
    again = Consumer(channel, queue)
    waiting = Consumer(client.channel(), queue) if single_active else None
    for i in range(30):
        publisher.basic_publish("", queue, b"%d" % i, PERSISTENT)
    again.until(lambda: len(again.got) >= 30, "30 deliveries")
    assert [body for _method, body in again.got] == [b"%d" % i for i in range(30)]
    assert not any(method.redelivered for method, _body in again.got)
    for method, _body in again.got:
        channel.basic_ack(method.delivery_tag)
    channel.basic_cancel(again.tag)  # answered once the owner stopped it, behind the acks
    publisher.basic_publish("", queue, b"last", PERSISTENT)
    if waiting is not None:
        waiting.until(lambda: waiting.got, "the waiting single active consumer's delivery")
        assert [body for _method, body in waiting.got] == [b"last"]
        waiting.channel.basic_ack(waiting.got[0][0].delivery_tag)
        waiting.channel.basic_cancel(waiting.tag)
        assert messages_in(publisher, queue) == 0
    else:
        assert messages_in(publisher, queue) == 1  # the acked 30 are gone, the last one waits
    client.close()
    assert wait_for(lambda: messages_in(publisher, queue) == (0 if single_active else 1) or None, 5,
                    what="the acks kept after the close")
    assert len(again.got) == 30
    publisher.queue_delete(queue)
    setup.close()


def test_confirmed_publishes_across_a_lost_link_arrive_in_their_order(node):
    """A publisher on shard 0 confirms into shard 1's queue while their link is lost and made again:
    every confirmed message is in the queue, in the order confirmed (one nacked with the link is
    published again, and may be there twice, never out of order)."""
    setup = on_shard(node.port, 0)
    channel = setup.channel()
    queue = queue_on(node, channel, 1, shards=node.shards)
    confirmed: list[int] = []
    stop = threading.Event()

    def publish() -> None:
        connection = on_shard(node.port, 0)
        out = connection.channel()
        out.confirm_delivery()
        number = 0
        while not stop.is_set() or number < 50:
            try:
                out.basic_publish("", queue, b"%d" % number, PERSISTENT)
                confirmed.append(number)
                number += 1
            except pika.exceptions.NackError:
                pass  # the link was lost before its answer: published again
        connection.close()

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    wait_for(lambda: len(confirmed) > 20, 10, what="publishes confirmed")
    pids = pid_of_shard(node, 0, node.shards), pid_of_shard(node, 1, node.shards)
    relinked(node, lambda: break_link(pids[0], pids[1]), 0, 1)
    at_loss = len(confirmed)
    wait_for(lambda: len(confirmed) > at_loss + 20, 10, what="publishes confirmed after the loss")
    stop.set()
    thread.join(20)
    bodies = []
    while True:
        got = channel.basic_get(queue, auto_ack=True)
        if got[0] is None:
            break
        bodies.append(int(got[2]))
    firsts = list(dict.fromkeys(bodies))  # a message nacked with the link and then published again
    assert firsts == sorted(firsts)
    assert set(confirmed) <= set(firsts)
    channel.queue_delete(queue)
    setup.close()


def test_a_sigkilled_shard_loses_its_transient_and_exclusive_queues_at_once(tmp_path):
    """Shard 1 is SIGKILLed while the supervisor is stopped, within a long shard timeout: its
    process's end is its end (shard 0 sees it through a pidfd), so its transient and exclusive
    queues are gone at once, and still once it is back; its durable queue stays with its message."""
    node = launch(tmp_path, "--shards", "2", "--shard-moves", "false", "--shard-timeout", "60")
    try:
        owner = on_shard(node.port, 1)
        mine = owner.channel()
        exclusive = mine.queue_declare("", exclusive=True).method.queue
        transient = mine.queue_declare(unique("transient"), arguments=LOCAL).method.queue
        durable = queue_on(node, mine, 1)
        mine.confirm_delivery()
        mine.basic_publish("", durable, b"kept", PERSISTENT)
        client = on_shard(node.port, 0)
        victim = pid_of_shard(node, 1)
        node.process.send_signal(signal.SIGSTOP)  # the supervisor: nothing starts shard 1 again
        try:
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: "shard 0: shard 1 (pid %d) ended" % victim in node.log, 10, what="its end seen")
            assert _gone(client, transient) and _gone(client, exclusive)
        finally:
            node.process.send_signal(signal.SIGCONT)
        wait_for(lambda: node.log.count("listening for AMQP") > 2, 30, what="shard 1 serving again")
        again = on_shard(node.port, 1)
        assert _gone(again, transient) and _gone(again, exclusive)
        assert wait_for(lambda: messages_in(client.channel(), durable) == 1 or None, 10, what="the durable queue")
        client.close()
        again.close()
    finally:
        node.stop()


def test_a_shard_that_stalls_without_its_link_is_fenced_and_then_ends(tmp_path):
    """Shard 1 stops (SIGSTOP) and its link is lost (shard 0 reads a frame that does not decode on
    it), so no heartbeat can tell the stall: once shard_timeout passed without a link, shard 0
    kills it; only then are its transient queues gone, and the supervisor starts it again."""
    node = launch(tmp_path, "--shards", "2", "--shard-moves", "false", "--shard-timeout", str(SHARD_TIMEOUT))
    try:
        owner = on_shard(node.port, 1)
        transient = owner.channel().queue_declare(unique("transient"), arguments=LOCAL).method.queue
        client = on_shard(node.port, 0)
        pids = pid_of_shard(node, 0), pid_of_shard(node, 1)
        os.kill(pids[1], signal.SIGSTOP)
        try:
            break_link(pids[1], pids[0])
            started = time.monotonic()
            wait_for(lambda: "shard 0: shard 1 (pid %d) ended" % pids[1] in node.log, SHARD_TIMEOUT * 5,
                     what="shard 1 fenced")
            assert time.monotonic() - started >= SHARD_TIMEOUT * 0.9  # not at the link's loss
            assert "shard 0: shard 1 (pid %d) has not linked again" % pids[1] in node.log
            assert _gone(client, transient)
        finally:
            try:
                os.kill(pids[1], signal.SIGCONT)
            except ProcessLookupError:
                pass
        wait_for(lambda: pid_of_shard(node, 1) not in (None, pids[1]), 30, what="shard 1 started again")
        client.close()
    finally:
        node.stop()


def _gone(connection, queue: str) -> bool:
    """Whether the shard of `connection` knows `queue` no more (404 "no queue", not "home node
    is down", which may take shard_timeout to come)."""
    try:
        connection.channel().queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_text.startswith("NOT_FOUND - no queue")
    return False
