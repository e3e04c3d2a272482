"""Differential delivery semantics: basic.get / consume, ack, nack, reject,
requeue order and redelivered flags, recover, purge and delete counts, the
queue-name shortcut and transactions, compared between hutch and RabbitMQ."""
from __future__ import annotations

import pytest

from .diffkit import op

pytestmark = pytest.mark.differential


def _publish(queue: str, *bodies: str, **extra) -> list:
    return [op("basic.publish", exchange="", routing_key=queue, body=b, **extra) for b in bodies]


def _same(differ, scenario):
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
    return rabbit


def test_get_counts_and_properties(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.get", queue="{q}"),
        *_publish("{q}", "m1", "m2"),
        op("basic.publish", exchange="", routing_key="{q}", body="m3",
           properties={"content_type": "text/plain", "delivery_mode": 2, "headers": {"a": 1, "b": [1, "x"]},
                       "priority": 4, "message_id": "id3", "timestamp": 1700000001}),
        op("basic.publish", exchange="", routing_key="{q}", body=b"\x00\xff binary"),
        op("basic.publish", exchange="", routing_key="{q}", body=""),
        op("queue.declare", queue="{q}", passive=True),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}", auto_ack=True),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("queue.declare", queue="{q}", passive=True),
    ])
    assert rabbit[1] == ("Basic.GetEmpty",)


def test_nack_and_reject_requeue_order_and_redelivered(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3", "m4", "m5"),
        op("basic.get", queue="{q}"),  # tag 1: m1
        op("basic.get", queue="{q}"),  # tag 2: m2
        op("basic.get", queue="{q}"),  # tag 3: m3
        op("basic.nack", delivery_tag=2),  # m2 back, before m4
        op("basic.reject", delivery_tag=1),  # m1 back, at the head
        op("basic.get", queue="{q}"),  # tag 4
        op("basic.get", queue="{q}"),  # tag 5
        op("basic.get", queue="{q}"),  # tag 6
        op("basic.reject", delivery_tag=3, requeue=False),  # m3 dropped
        op("basic.nack", delivery_tag=6, multiple=True),  # tags 4..6 back in order
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
    ])


def test_ack_multiple_and_nack_multiple(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", *["m%d" % i for i in range(1, 9)]),
        *[op("basic.get", queue="{q}") for _ in range(6)],  # tags 1..6
        op("basic.ack", delivery_tag=2, multiple=True),  # 1, 2
        op("basic.ack", delivery_tag=4),  # 4
        op("basic.nack", delivery_tag=5, multiple=True, requeue=False),  # 3, 5 dropped
        op("basic.nack", delivery_tag=0, multiple=True),  # 6 back
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
    ])


def test_recover_requeues_everything_unacked(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.ack", delivery_tag=1),
        op("basic.recover", requeue=True),
        op("basic.ack", delivery_tag=2),  # gone with the recover
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
    ])


def test_closing_a_channel_requeues_its_unacked(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3"),
        op("basic.get", queue="{q}", on="1.2"),
        op("basic.get", queue="{q}", on="1.2"),
        op("basic.ack", delivery_tag=1, on="1.2"),
        op("channel.open", on="1.2"),  # closes the old channel 2: m2 goes back
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
    ])


def test_purge_and_delete_count_ready_messages_only(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        op("queue.purge", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3", "m4"),
        op("basic.get", queue="{q}"),  # tag 1 unacked
        op("queue.purge", queue="{q}"),  # 3 ready
        op("queue.purge", queue="{q}"),
        op("basic.nack", delivery_tag=1),  # comes back
        op("queue.declare", queue="{q}", passive=True),
        *_publish("{q}", "m5", "m6"),
        op("basic.get", queue="{q}"),  # tag 2 unacked
        op("queue.delete", queue="{q}"),  # 2 ready
        op("basic.ack", delivery_tag=2),  # the queue is gone, the ack is still fine
        op("queue.delete", queue="{q}"),
    ])


def test_queue_name_shortcut(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        op("queue.declare", queue="{q1}"),
        op("queue.declare", queue="{q2}"),  # the last declared on this channel
        op("queue.declare", queue="{q1}", on="1.2"),  # another channel has its own
        op("queue.bind", queue="", exchange="{x}", routing_key="k"),
        op("queue.bind", queue="", exchange="{x}", routing_key=""),  # key "" too: the queue's name
        op("basic.publish", exchange="{x}", routing_key="k", body="via k"),
        op("basic.publish", exchange="{x}", routing_key="{q2}", body="via name"),
        op("basic.publish", exchange="", routing_key="", body="default exchange, empty key", mandatory=True),
        op("queue.declare", queue="", passive=True),
        op("basic.get", queue=""),
        op("queue.purge", queue=""),
        op("queue.unbind", queue="", exchange="{x}", routing_key="k"),
        op("basic.publish", exchange="{x}", routing_key="k", body="unbound", mandatory=True),
        op("queue.declare", queue="{q1}", passive=True),  # passive declares count too
        op("basic.publish", exchange="", routing_key="{q1}", body="to q1"),
        op("basic.get", queue=""),
        op("queue.delete", queue=""),
        op("queue.declare", queue="{q2}", passive=True),
    ])


def test_server_named_queue_and_shortcut(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("queue.declare", queue="", exclusive=True),
        op("queue.bind", queue="", exchange="{x}"),
        op("basic.publish", exchange="{x}", routing_key="", body="to the server-named queue"),
        op("basic.get", queue=""),
        op("queue.declare", queue="", exclusive=True),
        op("basic.get", queue=""),
    ])


def test_consumer_deliveries_prefetch_and_requeue(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3", "m4"),
        op("basic.qos", prefetch_count=2),
        op("basic.consume", queue="{q}", consumer_tag="{c}"),
        op("deliveries", count=2),
        op("queue.declare", queue="{q}", passive=True),  # 2 ready, 1 consumer
        op("basic.nack", delivery_tag=1),  # m1 back at the head, redelivered
        op("deliveries", count=1),
        op("basic.ack", delivery_tag=3),
        op("deliveries", count=1),
        op("basic.ack", delivery_tag=0, multiple=True),
        op("deliveries", count=1),
        op("basic.ack", delivery_tag=5),
        op("basic.cancel", consumer_tag="{c}"),
        op("queue.declare", queue="{q}", passive=True),
    ])


def test_cancel_returns_nothing_to_the_queue_until_close(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2"),
        op("basic.qos", prefetch_count=1, on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{c}", on="1.2"),
        op("deliveries", count=1, on="1.2"),
        op("basic.cancel", consumer_tag="{c}", on="1.2"),
        op("queue.declare", queue="{q}", passive=True),  # m1 is still unacked
        op("basic.ack", delivery_tag=1, on="1.2"),  # acking after cancel works
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
    ])


def test_auto_ack_consumer_and_no_local_redelivery(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2", "m3"),
        op("basic.consume", queue="{q}", consumer_tag="{c}", auto_ack=True),
        op("deliveries", count=3),
        op("queue.declare", queue="{q}", passive=True),
        op("basic.ack", delivery_tag=1),  # auto-acked: unknown
    ])


def test_deleting_a_consumed_queue_cancels_the_consumer(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.consume", queue="{q}", consumer_tag="{c}", on="1.2"),
        op("queue.delete", queue="{q}"),
        op("cancels", count=1, on="1.2"),
    ])


def test_auto_delete_queue_goes_with_its_last_consumer(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", auto_delete=True),
        op("basic.consume", queue="{q}", consumer_tag="{c1}"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}"),
        op("queue.declare", queue="{q}", passive=True, on="1.2"),
        op("basic.cancel", consumer_tag="{c1}"),
        op("queue.declare", queue="{q}", passive=True, on="1.2"),
        op("basic.cancel", consumer_tag="{c2}"),
        op("queue.declare", queue="{q}", passive=True, on="1.2"),
    ])


def test_transactions_publish_and_ack_on_commit(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        *_publish("{q}", "m1", "m2"),
        op("tx.select"),
        op("basic.get", queue="{q}"),
        op("basic.ack", delivery_tag=1),
        *_publish("{q}", "t1"),
        op("queue.declare", queue="{q}", passive=True),  # nothing applied yet
        op("tx.rollback"),
        op("queue.declare", queue="{q}", passive=True),  # t1 dropped, m1 still unacked
        op("basic.ack", delivery_tag=1),
        *_publish("{q}", "t2"),
        op("tx.commit"),
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
    ])


def test_a_commit_a_full_reject_publish_queue_refused_part_of(differ):
    """The refused publish is dropped, the other publish and the ack are
    applied, and the commit closes the channel: 406 "partial tx completion"."""
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}),
        op("queue.declare", queue="{q2}"),
        *_publish("{q}", "held"),
        *_publish("{q2}", "m1"),
        op("tx.select"),
        op("basic.get", queue="{q2}"),
        op("basic.ack", delivery_tag=1),
        *_publish("{q}", "refused"),
        *_publish("{q2}", "taken"),
        op("tx.commit"),
        op("drain", queue="{q}", on="1.2"),
        op("drain", queue="{q2}", on="1.2"),
        op("tx.select"),
        *_publish("{q}", "refused again"),
        op("tx.rollback"),  # nothing was applied: nothing refused
        op("tx.commit"),
    ])


def test_exclusive_queue_goes_with_its_connection(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", exclusive=True, on="2.1"),
        *_publish("{q}", "m1", on="2.1"),
        op("queue.declare", queue="{q}", passive=True, on="2.1"),
        op("channel.open", on="2.1"),  # closing a channel keeps it
        op("queue.declare", queue="{q}", passive=True, on="2.1"),
    ])
