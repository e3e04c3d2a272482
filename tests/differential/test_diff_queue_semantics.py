"""Differential queue semantics: argument validation, message TTL, length
limits and overflow modes, dead-lettering and the exact x-death headers,
compared between hutch and RabbitMQ 3.10.

Normalised before comparing: x-death `time` values (seconds on two clocks),
and the x-last-death-* headers hutch adds (RabbitMQ 3.13 behaviour, absent
from 3.10).
"""
from __future__ import annotations

import pytest

from .diffkit import op, without_death_clocks

pytestmark = pytest.mark.differential


def _same(differ, scenario):
    hutch, rabbit = differ(scenario)
    assert without_death_clocks(hutch) == without_death_clocks(rabbit)
    return rabbit


def _declare(queue: str, **arguments):
    return op("queue.declare", queue=queue, arguments=arguments)


@pytest.mark.parametrize("arguments", [
    {"x-message-ttl": -1}, {"x-message-ttl": "10"}, {"x-message-ttl": 315360000001}, {"x-expires": 0},
    {"x-expires": "x"}, {"x-max-length": -2}, {"x-max-length-bytes": True}, {"x-overflow": "drop-tail"},
    {"x-overflow": 7}, {"x-dead-letter-exchange": 5}, {"x-dead-letter-routing-key": "k"},
    {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": 3}, {"x-message-ttl": None},
    {"x-max-length": -1, "x-expires": -1},
    # a classic queue has no leader locator, whatever its value (its own is x-queue-master-locator)
    {"x-queue-leader-locator": "client-local"}, {"x-queue-leader-locator": 5},
    {"x-queue-master-locator": "min-masters", "x-queue-leader-locator": "balanced"},
    {"x-expires": 0, "x-queue-leader-locator": "client-local"},
])
def test_argument_validation(differ, arguments):
    rabbit = _same(differ, [_declare("{q}", **arguments)])
    assert rabbit[0][:2] == ("channel-error", 406)


def test_redeclaring_with_an_invalid_argument_reports_inequivalence(differ):
    _same(differ, [
        _declare("{q}", **{"x-max-length": 1}),
        _declare("{q}", **{"x-max-length": -1}),
        _declare("{q}", **{"x-max-length": 1, "x-message-ttl": -1}),
    ])


def test_ttl_zero_and_expiration_zero_expire_without_a_consumer(differ):
    _same(differ, [
        _declare("{dead}"),
        _declare("{q}", **{"x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "{dead}"}),
        op("basic.publish", exchange="", routing_key="{q}", body="m1"),
        op("basic.publish", exchange="", routing_key="{q}", body="m2", properties={"expiration": "0"}),
        op("wait_count", queue="{dead}", count=2),
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{dead}"),
    ])


def test_message_ttl_dead_letters_with_x_death(differ):
    _same(differ, [
        op("exchange.declare", exchange="{dlx}", exchange_type="fanout"),
        _declare("{dead}"),
        op("queue.bind", queue="{dead}", exchange="{dlx}"),
        _declare("{q}", **{"x-message-ttl": 50, "x-dead-letter-exchange": "{dlx}"}),
        op("basic.publish", exchange="", routing_key="{q}", body="m1",
           properties={"headers": {"CC": ["{other}"], "h": "v"}, "content_type": "text/plain"}),
        op("basic.publish", exchange="", routing_key="{q}", body="m2", properties={"expiration": "100"}),
        op("wait_count", queue="{dead}", count=2),
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{dead}"),
    ])


def test_rejections_and_repeated_deaths_build_the_same_x_death(differ):
    scenario = [
        _declare("{b}", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "{a}", "x-message-ttl": 30}),
        _declare("{a}", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "{b}"}),
        op("basic.publish", exchange="", routing_key="{a}", body="m", properties={"expiration": "100000"}),
    ]
    for tag in (1, 2, 3):
        scenario += [
            op("wait_count", queue="{a}", count=1),
            op("basic.get", queue="{a}"),
            op("basic.reject", delivery_tag=tag, requeue=False),
        ]
    scenario += [op("wait_count", queue="{a}", count=1), op("drain", queue="{a}")]
    _same(differ, scenario)


def test_nack_without_requeue_and_dead_letter_routing_key(differ):
    _same(differ, [
        op("exchange.declare", exchange="{dlx}", exchange_type="direct"),
        _declare("{dead}"),
        op("queue.bind", queue="{dead}", exchange="{dlx}", routing_key="dead-key"),
        _declare("{q}", **{"x-dead-letter-exchange": "{dlx}", "x-dead-letter-routing-key": "dead-key"}),
        op("basic.publish", exchange="", routing_key="{q}", body="m1", properties={"headers": {"CC": ["x"]}}),
        op("basic.publish", exchange="", routing_key="{q}", body="m2"),
        op("basic.get", queue="{q}"),
        op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=2, multiple=True, requeue=False),
        op("wait_count", queue="{dead}", count=2),
        op("drain", queue="{dead}"),
    ])


def test_self_dead_lettering_cycles(differ):
    _same(differ, [
        _declare("{w}"),
        _declare("{loop}", **{"x-dead-letter-exchange": "", "x-message-ttl": 30}),
        op("basic.publish", exchange="", routing_key="{loop}", body="m", properties={"headers": {"CC": ["{w}"]}}),
        op("wait_count", queue="{w}", count=2),
        op("queue.declare", queue="{loop}", passive=True),
        op("drain", queue="{w}"),
        # rejections are not cycles: it comes back
        _declare("{r}", **{"x-dead-letter-exchange": ""}),
        op("basic.publish", exchange="", routing_key="{r}", body="again"),
        op("basic.get", queue="{r}", on="1.2"),
        op("basic.reject", delivery_tag=1, requeue=False, on="1.2"),
        op("wait_count", queue="{r}", count=1),
        op("drain", queue="{r}"),
    ])


def test_drop_head_and_max_length_bytes(differ):
    _same(differ, [
        _declare("{dead}"),
        _declare("{q}", **{"x-max-length": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "{dead}"}),
        *[op("basic.publish", exchange="", routing_key="{q}", body="m%d" % i) for i in range(5)],
        op("queue.declare", queue="{q}", passive=True),
        op("drain", queue="{q}"),
        op("wait_count", queue="{dead}", count=3),
        op("drain", queue="{dead}"),
        _declare("{bytes}", **{"x-max-length-bytes": 5}),
        *[op("basic.publish", exchange="", routing_key="{bytes}", body=b) for b in ("aa", "bbb", "c", "dddd")],
        op("drain", queue="{bytes}"),
    ])


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_reject_publish_nacks_and_dead_letters(differ, overflow):
    _same(differ, [
        _declare("{dead}"),
        _declare("{q}", **{"x-max-length": 1, "x-overflow": overflow, "x-dead-letter-exchange": "",
                           "x-dead-letter-routing-key": "{dead}"}),
        op("confirm_select"),
        op("publish_confirmed", exchange="", routing_key="{q}", body="kept"),
        op("publish_confirmed", exchange="", routing_key="{q}", body="refused"),
        op("basic.get", queue="{q}", auto_ack=True),
        op("publish_confirmed", exchange="", routing_key="{q}", body="fits"),
        op("wait_count", queue="{dead}", count=1 if overflow.endswith("dlx") else 0),
        op("drain", queue="{dead}"),
        op("drain", queue="{q}"),
    ])
