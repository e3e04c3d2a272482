"""Differential priorities: consumer priorities with prefetch, single active
consumer failover (cancel, channel close) and priority queues (delivery
order with mixed message priorities, with and without prefetch), compared
between hutch and RabbitMQ."""
from __future__ import annotations

import pytest

from .diffkit import op

pytestmark = pytest.mark.differential


def _same(differ, scenario):
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
    return rabbit


def _publish(queue: str, *bodies: str, on: str = "1.1") -> list:
    return [op("basic.publish", exchange="", routing_key=queue, body=b, on=on) for b in bodies]


# -- consumer priorities -------------------------------------------------------


def test_consumer_priorities_with_prefetch(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.qos", prefetch_count=2, on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{high}", arguments={"x-priority": 10}, on="1.1"),
        op("basic.qos", prefetch_count=10, on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{low}", arguments={"x-priority": 1}, on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{none}", on="1.3"),
        *_publish("{q}", "m1", "m2", "m3", "m4", "m5", on="1.4"),
        op("deliveries", count=2, on="1.1"),
        op("deliveries", count=3, on="1.2"),
        op("queue.declare", queue="{q}", passive=True),
        op("basic.ack", delivery_tag=2, multiple=True, on="1.1"),  # high has room again
        *_publish("{q}", "m6", "m7", "m8", on="1.4"),
        op("deliveries", count=2, on="1.1"),
        op("deliveries", count=1, on="1.2"),
        op("basic.cancel", consumer_tag="{high}", on="1.1"),
        op("basic.cancel", consumer_tag="{low}", on="1.2"),
        op("basic.recover", on="1.2"),  # low's unacked go back: only the priority-0 consumer is left
        op("deliveries", count=4, on="1.3"),
    ])
    assert ("timeout waiting for deliveries", 2, 0) not in rabbit


def test_consumer_priority_argument_must_be_an_integer(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.consume", queue="{q}", consumer_tag="{c}", arguments={"x-priority": "high"}),
        op("basic.consume", queue="{q}", consumer_tag="{c}", arguments={"x-priority": -3}),
        op("queue.declare", queue="{q}", passive=True),
    ])


# -- single active consumer ------------------------------------------------------


def test_single_active_consumer_failover_on_cancel(differ):
    # (Cancelling the active consumer while it holds unacked messages makes
    # RabbitMQ 3.10's queue process fail and lose its messages, so the
    # consumers here settle first.)
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-single-active-consumer": True}),
        op("basic.qos", prefetch_count=2, on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c1}", on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}", on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{c3}", on="1.3"),
        *_publish("{q}", "m1", "m2", "m3", "m4", on="1.4"),
        op("deliveries", count=2, on="1.1"),
        op("queue.declare", queue="{q}", passive=True),  # 2 ready: c2, c3 wait
        op("basic.ack", delivery_tag=2, multiple=True, on="1.1"),
        op("deliveries", count=2, on="1.1"),
        op("basic.ack", delivery_tag=4, multiple=True, on="1.1"),
        op("basic.cancel", consumer_tag="{c1}", on="1.1"),
        *_publish("{q}", "m5", "m6", on="1.4"),
        op("deliveries", count=2, on="1.2"),
        op("basic.cancel", consumer_tag="{c2}", on="1.2"),
        op("basic.recover", on="1.2"),  # m5, m6 back: the new active consumer gets them
        op("deliveries", count=2, on="1.3"),
        op("queue.declare", queue="{q}", passive=True),
    ])


def test_single_active_consumer_failover_on_channel_close(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-single-active-consumer": True}),
        op("basic.qos", prefetch_count=3, on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c1}", on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}", on="1.2"),
        *_publish("{q}", "m1", "m2", "m3", "m4", "m5", on="1.3"),
        op("deliveries", count=3, on="1.1"),
        op("basic.ack", delivery_tag=1, on="1.1"),
        op("deliveries", count=1, on="1.1"),
        op("channel.open", on="1.1"),  # closes the active consumer's channel: m2, m3, m4 requeued
        op("deliveries", count=4, on="1.2"),
        op("queue.declare", queue="{q}", passive=True),
    ])


def test_single_active_consumer_exclusive_and_argument_types(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-single-active-consumer": True}),
        op("basic.consume", queue="{q}", consumer_tag="{c}", exclusive=True),
        op("queue.declare", queue="{q2}", arguments={"x-single-active-consumer": 1}),
        op("queue.declare", queue="{q2}", arguments={"x-single-active-consumer": "yes"}),
        op("queue.declare", queue="{q}", arguments={"x-single-active-consumer": False}),
    ])


# -- priority queues ------------------------------------------------------------------


def _prio(queue: str, body: str, priority: int | None, on: str = "1.1") -> tuple:
    properties = {"priority": priority} if priority is not None else None
    return op("basic.publish", exchange="", routing_key=queue, body=body, properties=properties, on=on)


MIXED = [("a0", 0), ("b5", 5), ("c1", 1), ("d5", 5), ("e", None), ("f9", 9), ("g1", 1), ("h200", 200), ("i3", 3)]


def test_priority_queue_delivery_order(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-max-priority": 5}),
        *[_prio("{q}", body, priority) for body, priority in MIXED],
        op("queue.declare", queue="{q}", passive=True),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=3, multiple=True),  # back to their places
        _prio("{q}", "j4", 4),
        op("drain", queue="{q}"),
    ])


def test_priority_queue_with_prefetch(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-max-priority": 10}),
        op("basic.qos", prefetch_count=2),
        op("basic.consume", queue="{q}", consumer_tag="{c}"),
        *[_prio("{q}", body, priority, on="1.2") for body, priority in MIXED],
        op("deliveries", count=2),  # the first two published go straight out
        op("basic.ack", delivery_tag=1),
        op("deliveries", count=1),  # then the highest waiting
        op("basic.ack", delivery_tag=3, multiple=True),
        op("deliveries", count=2),
        op("basic.nack", delivery_tag=5, multiple=True),  # requeued by priority
        op("deliveries", count=2),
        op("basic.ack", delivery_tag=7, multiple=True),
        op("deliveries", count=2),
        op("queue.declare", queue="{q}", passive=True),
        op("basic.ack", delivery_tag=9, multiple=True),
        op("deliveries", count=2),
        op("queue.declare", queue="{q}", passive=True),
    ])


def test_priority_queue_argument_validation(differ):
    _same(differ, [
        op("queue.declare", queue="{q1}", arguments={"x-max-priority": 256}),
        op("queue.declare", queue="{q1}", arguments={"x-max-priority": -1}),
        op("queue.declare", queue="{q1}", arguments={"x-max-priority": "5"}),
        op("queue.declare", queue="{q1}", arguments={"x-max-priority": 255}),
        op("queue.declare", queue="{q1}", arguments={"x-max-priority": 254}),
        op("queue.declare", queue="{q2}", arguments={"x-max-priority": 0}),
        _prio("{q2}", "x", 0),
        _prio("{q2}", "y", 7),
        op("drain", queue="{q2}"),
    ])


def test_single_active_consumer_with_consumer_priorities(differ):
    # The first consumer stays active when a higher-priority one registers;
    # when it goes, the highest-priority one takes over.
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-single-active-consumer": True}),
        op("basic.consume", queue="{q}", consumer_tag="{c1}", on="1.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}", on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{c3}", arguments={"x-priority": 5}, on="1.3"),
        *_publish("{q}", "m1", on="1.4"),
        op("deliveries", count=1, on="1.1"),
        op("basic.ack", delivery_tag=1, on="1.1"),
        op("basic.cancel", consumer_tag="{c1}", on="1.1"),
        *_publish("{q}", "m2", on="1.4"),
        op("deliveries", count=1, on="1.3"),
        op("queue.declare", queue="{q}", passive=True),
    ])
