"""Differential quorum queues (`x-queue-type: quorum`): the declare rules,
x-delivery-count and x-delivery-limit, and global QoS, compared between
hutch and RabbitMQ 3.10 (including the x-delivery-count headers).

RabbitMQ's quorum queue applies publishes and returns asynchronously, so
every basic.get here waits for the count it expects first (`wait_count`).
"""
from __future__ import annotations

import pytest

from .diffkit import op, without_death_clocks

pytestmark = pytest.mark.differential

QUORUM = {"x-queue-type": "quorum"}


def _same(differ, scenario):
    hutch, rabbit = differ(scenario, delivery_count=True)
    assert without_death_clocks(hutch) == without_death_clocks(rabbit)
    return rabbit


def _declare(queue="{q}", durable=True, **fields):
    arguments = {**QUORUM, **fields.pop("arguments", {})}
    return op("queue.declare", queue=queue, durable=durable, arguments=arguments, **fields)


@pytest.mark.parametrize("fields", [
    {"durable": False},
    {"exclusive": True},
    {"auto_delete": True},
    {"durable": False, "exclusive": True, "auto_delete": True},
    {"durable": False, "exclusive": True},
    {"queue": "", "exclusive": True},
    {"queue": ""},
    {"queue": "", "arguments": {"x-expires": 0}},
])
def test_only_a_durable_shared_queue_can_be_quorum(differ, fields):
    rabbit = _same(differ, [_declare(**fields)])
    assert rabbit[0][:2] == ("channel-error", 406)


@pytest.mark.parametrize("arguments", [
    {"x-max-priority": 5}, {"x-queue-mode": "lazy"}, {"x-queue-master-locator": "min-masters"},
    {"x-queue-version": 2}, {"x-max-age": "1D"}, {"x-stream-max-segment-size-bytes": 5},
    {"x-max-priority": 5, "x-queue-mode": "lazy"}, {"x-queue-mode": "lazy", "x-max-priority": 5},
    {"x-dead-letter-strategy": "bogus"}, {"x-dead-letter-strategy": 5},
    {"x-quorum-initial-group-size": 0}, {"x-quorum-initial-group-size": -1}, {"x-quorum-initial-group-size": "x"},
    {"x-max-in-memory-length": -1}, {"x-max-in-memory-bytes": "a"},
    {"x-max-priority": 5, "x-expires": 0}, {"x-quorum-initial-group-size": 0, "x-max-priority": 5},
    {"x-dead-letter-strategy": "x", "x-expires": 0},
    {"x-queue-type": "bogus"}, {"x-queue-type": 5}, {"x-queue-type": "Quorum"},
    # the leader locator's value is checked before the type's other rules, after the common ones
    {"x-queue-leader-locator": "bogus"}, {"x-queue-leader-locator": 5}, {"x-queue-leader-locator": "min-masters"},
    {"x-queue-leader-locator": "bogus", "x-max-priority": 5},
    {"x-queue-leader-locator": "bogus", "x-quorum-initial-group-size": 0},
])
def test_refused_arguments(differ, arguments):
    rabbit = _same(differ, [_declare(arguments=arguments)])
    assert rabbit[0][:2] == ("channel-error", 406)


def test_refused_arguments_come_before_the_properties(differ):
    _same(differ, [_declare(durable=False, arguments={"x-max-priority": 5}),
                   _declare(durable=False, arguments={"x-expires": 0})])


def test_the_quorum_arguments_are_accepted(differ):
    rabbit = _same(differ, [
        _declare("{a}", arguments={"x-delivery-limit": 3, "x-dead-letter-strategy": "at-least-once",
                                   "x-overflow": "reject-publish", "x-quorum-initial-group-size": 3,
                                   "x-max-in-memory-length": 3, "x-max-in-memory-bytes": 100,
                                   "x-message-ttl": 60000, "x-expires": 60000, "x-max-length": 5,
                                   "x-max-length-bytes": 500, "x-single-active-consumer": True, "x-foo": 1}),
        _declare("{b}", arguments={"x-dead-letter-strategy": "at-most-once", "x-overflow": "reject-publish-dlx"}),
        _declare("{c}", arguments={"x-delivery-limit": -1}),
        _declare("{d}", arguments={"x-delivery-limit": "x"}),
        *(_declare("{e%d}" % n, arguments={"x-queue-leader-locator": locator})
          for n, locator in enumerate(("client-local", "balanced", "random", "least-leaders"))),
    ])
    assert [o[0] for o in rabbit] == ["Queue.DeclareOk"] * 8


def test_redeclaring_with_another_type_or_durability_is_inequivalent(differ):
    _same(differ, [
        _declare("{q}"),
        op("queue.declare", queue="{q}", durable=True),
        op("queue.declare", queue="{q}", durable=True, arguments={"x-queue-type": "classic"}),
        _declare("{q}", durable=False),
        _declare("{q}"),
        op("queue.declare", queue="{c}", durable=True),
        _declare("{c}"),
    ])


def _gets_with_returns(limit, rounds: int, left: int) -> list:
    """Publish one message, basic.get and nack(requeue) it `rounds` times,
    then (once `left` messages are ready) one more basic.get."""
    steps = [_declare(arguments={"x-delivery-limit": limit}),
             op("basic.publish", exchange="", routing_key="{q}", body="m", properties={"headers": {"a": 1}})]
    for tag in range(1, rounds + 1):
        steps += [op("wait_count", queue="{q}", count=1), op("basic.get", queue="{q}"),
                  op("basic.nack", delivery_tag=tag, requeue=True)]
    return steps + [op("wait_count", queue="{q}", count=left), op("basic.get", queue="{q}")]


@pytest.mark.parametrize("limit,rounds,left", [(2, 3, 0), (0, 1, 0), (-1, 1, 0), ("x", 4, 1)])
def test_delivery_count_and_limit(differ, limit, rounds, left):
    """basic.get carries x-delivery-count from 0; a message returned more
    than the limit allows is dropped (no dead-letter exchange)."""
    rabbit = _same(differ, _gets_with_returns(limit, rounds, left))
    assert rabbit[-1][0] == ("Basic.GetOk" if left else "Basic.GetEmpty")


def test_a_consumer_sees_the_count_only_on_redelivery(differ):
    _same(differ, [
        _declare(),
        op("basic.publish", exchange="", routing_key="{q}", body="m"),
        op("wait_count", queue="{q}", count=1),
        op("basic.consume", queue="{q}", consumer_tag="c"),
        op("deliveries", count=1),
        op("basic.reject", delivery_tag=1, requeue=True),
        op("deliveries", count=1),
        op("basic.nack", delivery_tag=2, requeue=True),
        op("deliveries", count=1),
        op("basic.ack", delivery_tag=3),
        op("wait_count", queue="{q}", count=0),
    ])


def test_the_delivery_limit_dead_letters(differ):
    _same(differ, [
        op("queue.declare", queue="{dead}", durable=True),
        _declare(arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                            "x-dead-letter-routing-key": "{dead}"}),
        op("basic.publish", exchange="", routing_key="{q}", body="m"),
        op("wait_count", queue="{q}", count=1), op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=1, requeue=True),
        op("wait_count", queue="{q}", count=1), op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=2, requeue=True),
        op("wait_count", queue="{dead}", count=1),
        op("wait_count", queue="{q}", count=0),
        op("drain", queue="{dead}"),
    ])


def test_a_global_prefetch_cannot_consume_a_quorum_queue(differ):
    rabbit = _same(differ, [
        _declare(),
        op("basic.qos", prefetch_count=5, global_qos=True),
        op("basic.consume", queue="{q}", consumer_tag="c"),
    ])
    assert rabbit[-1][:2] == ("connection-error", 540)
