"""Three hutch nodes and a real etcd on loopback (tests/cluster_kit.py):
the leader killed (SIGKILL) or stalled (SIGSTOP) under confirmed persistent
publishing and consuming, a follower killed and restarted; every confirmed
message is there at the end. Clients connect to any node (followers forward
to the leader) and reconnect to the next node when their connection ends.
The many-kills version is bench/cluster_failover.py."""
from __future__ import annotations

import os
import signal
import threading
import time

import pika
import pytest

from cluster_kit import (QUEUE, Load, cluster, etcd_get, in_sync, leader_of, new_leader, running,  # noqa: F401
                         until)
from http_api import call

pytestmark = pytest.mark.timeout(150)


def assert_nothing_lost(load: Load) -> int:
    lost, duplicates = load.finish(60)
    assert not lost, "%d confirmed messages lost, e.g. %s" % (len(lost), sorted(lost)[:10])
    return duplicates


def test_the_leader_killed_twice_and_stopped_once_under_load_loses_no_confirmed_message(cluster):
    etcd, nodes = cluster
    load = Load([n.url for n in nodes]).start()
    load.progress(300, 30, "confirms before the first kill")
    for stop in ("kill", "kill", "stop"):  # SIGKILL twice, then a clean stop (SIGTERM)
        leader = leader_of(etcd, nodes)
        getattr(leader, stop)()
        new_leader(etcd, nodes, leader)
        leader.start()
        until(lambda: len(in_sync(etcd)) == 3, 60, "the killed node to be in sync again")
        load.progress(200, 60, "confirms from the new leader")
    assert_nothing_lost(load)
    assert load.reconnects >= 2


def test_a_stalled_leader_is_replaced_and_confirms_nothing_after_its_lease(cluster):
    etcd, nodes = cluster
    stalled = leader_of(etcd, nodes)
    load = Load([n.url for n in nodes if n is not stalled]).start()
    load.progress(200, 30, "confirms before the stall")
    # Two publishers straight to the stalled leader: one into the durable queue (its confirm waits
    # for the disk and the followers), one unroutable (its confirm waits for nothing).
    outcome = {}

    def publish_while_stalled(queue: str, channel) -> None:
        try:
            channel.basic_publish("", queue, b"during", pika.BasicProperties(delivery_mode=2))
            outcome[queue] = "confirmed"
        except Exception as exc:  # noqa: BLE001 - whatever ends the wait: not a confirm
            outcome[queue] = exc

    publishers = []
    for queue in (QUEUE, "no-such-queue"):
        channel = pika.BlockingConnection(pika.URLParameters(stalled.url)).channel()
        channel.confirm_delivery()
        publishers.append(threading.Thread(target=publish_while_stalled, args=(queue, channel)))
    stalled.signal(signal.SIGSTOP)
    stalled_at = time.monotonic()
    for publisher in publishers:
        publisher.start()
    new_leader(etcd, nodes, stalled)
    assert time.monotonic() - stalled_at >= 1.5  # not before the 2 s lease could run out
    load.progress(200, 60, "confirms from the new leader while the old one is frozen")
    stalled.signal(signal.SIGCONT)
    for publisher in publishers:
        publisher.join(30)
        assert not publisher.is_alive()
    assert "confirmed" not in outcome.values(), "a stale leader confirmed a publish: %s" % outcome
    # Whichever notices first fences it: its lease thread ("the etcd lease ran out") or the leader's
    # look at etcd ("etcd no longer names this node leader"); both say the same thing after the reason.
    until(lambda: "stopping at once and rejoining as a follower" in stalled.log, 30,
          "the stalled node to fence itself")
    until(lambda: len(in_sync(etcd)) == 3, 60, "the stalled node to rejoin in sync")
    assert_nothing_lost(load)


def test_a_killed_follower_catches_up_and_can_then_take_over(cluster):
    etcd, nodes = cluster
    leader = leader_of(etcd, nodes)
    follower, other = [n for n in nodes if n is not leader]
    load = Load([leader.url]).start()
    load.progress(200, 30, "confirms before the follower is killed")
    follower.kill()
    until(lambda: follower.name not in in_sync(etcd), 30, "the killed follower to leave the in-sync set")
    load.progress(300, 30, "confirms without it")
    follower.start()
    until(lambda: follower.name in in_sync(etcd), 60, "the restarted follower to catch up")
    load.progress(100, 30, "confirms with it in sync")
    confirmed = load.stop_publishing()
    load.stop_consuming()
    big = os.urandom(3 * 1024 * 1024 + 7)  # records of more than one chunk
    with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("big", durable=True)
        channel.basic_publish("", "big", big, pika.BasicProperties(delivery_mode=2))
    other.kill()  # only the caught-up follower survives
    leader.kill()
    until(lambda: etcd_get(etcd.url, "hutch/leader") == follower.name.encode(), 30, "the follower to lead")
    until(follower.leads, 30, "it to serve")
    with pika.BlockingConnection(pika.URLParameters(follower.url)) as connection:
        channel = connection.channel()
        left = set()
        while True:
            method, _, body = channel.basic_get("cluster-load", auto_ack=True)
            if method is None:
                break
            left.add(int(body))
        assert channel.basic_get("big", auto_ack=True)[2] == big
    missing = confirmed - set(load.received) - left
    assert not missing, "%d confirmed messages missing on the caught-up follower" % len(missing)


def test_replies_wait_for_an_in_sync_follower_until_it_is_dropped(tmp_path):
    """A stalled in-sync follower holds a declare-ok, and a tx.commit-ok,
    back until the leader has removed it from etcd's in-sync set
    (max_lag_seconds 1)."""
    with running(tmp_path, 2, "--cluster-max-lag-seconds", "1") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        (follower,) = [n for n in nodes if n is not leader]
        with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            follower.signal(signal.SIGSTOP)
            stalled_at = time.monotonic()
            channel.queue_declare("held", durable=True)
            assert time.monotonic() - stalled_at >= 0.9
            assert follower.name not in in_sync(etcd), "a reply went out while a stalled follower was in sync"
            channel.basic_publish("", "held", b"m", pika.BasicProperties(delivery_mode=2))
            follower.signal(signal.SIGCONT)
            until(lambda: len(in_sync(etcd)) == 2, 60, "the follower to be in sync again")
            transactional = connection.channel()
            transactional.tx_select()
            transactional.basic_publish("", "held", b"t", pika.BasicProperties(delivery_mode=2))
            follower.signal(signal.SIGSTOP)
            stalled_at = time.monotonic()
            transactional.tx_commit()
            assert time.monotonic() - stalled_at >= 0.9
            assert follower.name not in in_sync(etcd), "a commit-ok went out while a stalled follower was in sync"
        follower.signal(signal.SIGCONT)
        until(lambda: len(in_sync(etcd)) == 2, 60, "the follower to be in sync again")


def test_min_in_sync_replicas_withholds_confirms_while_too_few_followers_are_in_sync(tmp_path):
    with running(tmp_path, 2, "--cluster-min-in-sync-replicas", "1") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        (follower,) = [n for n in nodes if n is not leader]
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("min-isr", durable=True)
        follower.kill()
        until(lambda: follower.name not in in_sync(etcd), 30, "the follower to leave the in-sync set")
        confirmed = threading.Event()

        def publish():
            channel.basic_publish("", "min-isr", b"m", pika.BasicProperties(delivery_mode=2))
            confirmed.set()

        publisher = threading.Thread(target=publish)
        publisher.start()
        assert not confirmed.wait(1.5), "confirmed with no follower in sync"
        follower.start()
        assert confirmed.wait(60), "no confirm once the follower was back in sync"
        publisher.join(10)
        connection.close()


# min_in_sync_replicas 1 on three nodes, a follower stalled for a while: it must not be dropped
# (max_lag_seconds 60, max_lag_bytes 256 MiB), nor lose its lease (lease_ttl 10).
MIN_IN_SYNC_1 = ("--cluster-min-in-sync-replicas", "1", "--cluster-max-lag-seconds", "60",
                 "--cluster-max-lag-bytes", str(256 << 20), "--cluster-lease-ttl", "10")


def confirm_while_stopped(leader, stopped, queue: str) -> int:
    """Publish confirmed 1 MiB persistent messages to `leader` with the
    follower `stopped` stalled (SIGSTOP), until it lacks 48 MiB: more than
    its socket buffers hold, so it cannot have them all when it resumes.
    Every confirm comes (the other follower has it) and `stopped` stays in
    sync; were every in-sync follower waited for, the first confirm would
    wait 60 s. Returns the number confirmed; `stopped` stays stopped."""
    def status() -> dict:
        nodes = call(leader.ports["http"], "GET", "/api/hutch/cluster").body["nodes"]
        return next((n for n in nodes if n["name"] == stopped.name), {})

    body, confirmed = bytes(1 << 20), 0
    with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        until(lambda: status().get("state") == "in sync", 30, "the leader to list %s in sync" % stopped.name)
        stopped.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        while (status()["lag_bytes"] or 0) < 48 << 20:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            confirmed += 1
            stopped_for = time.monotonic() - stopped_at
            assert stopped_for < 5, "%d MiB confirmed in %.1f s with %s stopped: do confirms wait for it?" % (
                confirmed, stopped_for, stopped.name)
    return confirmed


def message_count(node, queue: str) -> int:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


def test_with_min_in_sync_replicas_a_stalled_follower_holds_no_confirm_back_and_the_most_complete_node_leads(
        tmp_path):
    """min_in_sync_replicas 1 on three nodes: a confirm waits for one
    in-sync follower, not both. With one follower (B) stalled, confirms keep
    coming and B stays in the in-sync set (confirm_while_stopped). Then the
    leader is SIGKILLed and B resumed at once. Both followers are in sync,
    so both may lead: C, which holds more of the leader's stream, is
    elected, with every confirmed message. B has the lower name, so it would
    win a tie: C wins on its position. B's stop stays well inside its lease
    (10 s), so it takes part in the election knowing its position."""
    with running(tmp_path, 3, *MIN_IN_SYNC_1) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        behind, ahead = sorted((n for n in nodes if n is not leader), key=lambda n: n.name)
        confirmed = confirm_while_stopped(leader, behind, "complete")
        assert behind.name in in_sync(etcd)
        leader.kill()
        behind.signal(signal.SIGCONT)
        new = new_leader(etcd, nodes, leader)
        posted = {n.name: etcd_get(etcd.url, "hutch/positions/" + n.name) for n in (behind, ahead)}
        assert new is ahead, "%s was elected, not %s; positions: %s" % (new.name, ahead.name, posted)
        assert message_count(ahead, "complete") == confirmed
        assert "the etcd lease ran out" not in behind.log  # B did not restart (and forget its position)


def test_with_min_in_sync_replicas_a_hand_over_waits_until_its_node_has_everything(tmp_path):
    """min_in_sync_replicas 1: the confirms did not wait for the stalled
    follower B, so when the leadership is handed to B the leader waits
    until B has acknowledged everything before it resigns: B, resumed only
    after 1.5 s, leads with every confirmed message."""
    with running(tmp_path, 3, *MIN_IN_SYNC_1) as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        target = next(n for n in nodes if n is not leader)
        confirmed = confirm_while_stopped(leader, target, "handed-over")
        reply = call(leader.ports["http"], "POST", "/api/hutch/cluster/transfer-leadership", {"node": target.name})
        assert reply.status == 204, reply.body
        waited = time.monotonic() + 1.5
        while time.monotonic() < waited:
            assert leader_of(etcd, nodes) is leader, "the leader resigned before %s had everything" % target.name
            time.sleep(0.1)
        target.signal(signal.SIGCONT)
        until(target.leads, 30, "the hand-over")
        assert message_count(target, "handed-over") == confirmed


def test_with_durability_flush_the_follower_still_has_every_confirmed_message(tmp_path):
    with running(tmp_path, 2, "--storage-durability", "flush") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("flushed", durable=True)
            for number in range(50):
                channel.basic_publish("", "flushed", b"%d" % number, pika.BasicProperties(delivery_mode=2))
        leader.kill()
        follower = new_leader(etcd, nodes, leader)
        with pika.BlockingConnection(pika.URLParameters(follower.url)) as connection:
            assert connection.channel().queue_declare("flushed", passive=True).method.message_count == 50


def test_unacked_messages_come_back_redelivered_after_the_leader_is_killed(cluster):
    """A consumer holds deliveries without acking: a first batch long before
    the failover, then a second one during which the leader is SIGKILLed
    (from the consumer's callback, on that batch's first message), so the
    delivered records of those deliveries may not have reached the
    followers (deliveries do not wait for them; docs/cluster.md).
    Reconnected through another node, every message comes back exactly once
    (none was acked), and every one the consumer received has
    redelivered=true. Those it never received may come back either way
    (AMQP: "may have been delivered"); the test does not look at them."""
    etcd, nodes = cluster
    leader = leader_of(etcd, nodes)
    total, prefetch = 300, 100
    with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
        channel = connection.channel()
        channel.queue_declare("unacked", durable=True)
        channel.tx_select()
        for number in range(total):
            channel.basic_publish("", "unacked", b"%d" % number, pika.BasicProperties(delivery_mode=2))
        channel.tx_commit()  # commit-ok: on every in-sync follower
    delivered: set[int] = set()
    connection = pika.BlockingConnection(pika.URLParameters(leader.url))
    first = connection.channel()
    first.basic_qos(prefetch_count=prefetch)
    first.basic_consume("unacked", lambda _ch, _m, _p, body: delivered.add(int(body)))
    until(lambda: connection.process_data_events(0.05) or len(delivered) == prefetch, 30, "the first batch")

    def on_message(_channel, _method, _properties, body):
        delivered.add(int(body))
        if leader.running():
            leader.process.kill()  # at once: the rest of the batch may still be on its way

    second = connection.channel()
    second.basic_qos(prefetch_count=prefetch)
    second.basic_consume("unacked", on_message)
    with pytest.raises(pika.exceptions.AMQPError):
        until(lambda: connection.process_data_events(0.05), 30, "the connection to the killed leader to end")
    leader.process.wait(10)
    assert prefetch < len(delivered) <= 2 * prefetch
    new = new_leader(etcd, nodes, leader)
    (survivor,) = [n for n in nodes if n is not leader and n is not new]

    def reconnected():  # through the other survivor, which forwards to the new leader once it knows it
        try:
            return pika.BlockingConnection(pika.URLParameters(survivor.url))
        except pika.exceptions.AMQPError:
            return None

    connection = until(reconnected, 30, "a connection through %s" % survivor.name, interval=0.2)
    with connection:
        channel = connection.channel()
        assert channel.queue_declare("unacked", passive=True).method.message_count == total
        back: list[tuple[int, bool]] = []
        channel.basic_consume("unacked", lambda _ch, method, _p, body: back.append((int(body), method.redelivered)),
                              auto_ack=True)
        until(lambda: connection.process_data_events(0.05) or len(back) == total, 30, "every message back")
    assert sorted(number for number, _flag in back) == list(range(total))
    redelivered = dict(back)
    not_flagged = sorted(n for n in delivered if not redelivered[n])
    assert not not_flagged, "%d of %d delivered, unacked messages came back without redelivered=true: %s" % (
        len(not_flagged), len(delivered), not_flagged[:10])


def test_a_message_consumed_and_acked_is_confirmed_while_a_follower_holds_the_disk_confirms_back(tmp_path):
    """Every in-sync follower is waited for (no min_in_sync_replicas), and the
    only follower is stalled (SIGSTOP) but kept in sync (max_lag_seconds 60):
    a persistent message nobody consumes gets no confirm meanwhile, while one
    that a consumer acks is confirmed by the ack (docs/storage.md, "Durability
    and confirms"). The held confirm comes once the follower is resumed."""
    with running(tmp_path, 2, "--cluster-max-lag-seconds", "60", "--cluster-lease-ttl", "10") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        follower = next(n for n in nodes if n is not leader)
        consumer_connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        consumer = consumer_connection.channel()
        consumer.queue_declare("acked-first", durable=True)
        acked = []

        def ack(channel, method, _properties, body) -> None:
            channel.basic_ack(method.delivery_tag)
            acked.append(body)

        consumer.basic_consume("acked-first", ack)
        publisher_connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        publisher = publisher_connection.channel()
        publisher.confirm_delivery()
        publisher.queue_declare("unconsumed", durable=True)
        until(lambda: follower.name in in_sync(etcd), 30, "the follower in sync")
        follower.signal(signal.SIGSTOP)
        try:
            held = {}

            def publish_unconsumed() -> None:
                with pika.BlockingConnection(pika.URLParameters(leader.url)) as connection:
                    channel = connection.channel()
                    channel.confirm_delivery()
                    channel.basic_publish("", "unconsumed", b"held", pika.BasicProperties(delivery_mode=2))
                    held["confirmed_at"] = time.monotonic()

            waiting = threading.Thread(target=publish_unconsumed, daemon=True)
            waiting.start()
            # pika's blocking publish returns on the confirm; the consumer acks from the other connection.
            done = threading.Event()
            confirming = threading.Thread(target=lambda: (publisher.basic_publish(
                "", "acked-first", b"consumed", pika.BasicProperties(delivery_mode=2)), done.set()), daemon=True)
            confirming.start()
            deadline = time.monotonic() + 30
            while not done.is_set() and time.monotonic() < deadline:
                consumer_connection.process_data_events(time_limit=0.1)
            assert acked == [b"consumed"]
            assert done.is_set(), "no confirm for a message consumed and acked while the follower is stalled"
            assert "confirmed_at" not in held, "a message nobody consumed was confirmed before the stalled follower had it"
            assert follower.name in in_sync(etcd)
        finally:
            follower.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        waiting.join(30)
        assert held.get("confirmed_at", 0) >= resumed_at, "the held confirm never came"
        publisher_connection.close()
        consumer_connection.close()
