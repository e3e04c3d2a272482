"""Differential error replies: what declare, bind, delete, publish, consume,
ack, qos, recover, tx and confirm answer when refused, compared reply code
and reply text between hutch and RabbitMQ (channel and connection closes)."""
from __future__ import annotations

import pytest

from .diffkit import op

pytestmark = pytest.mark.differential


def _same(differ, scenario):
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
    return rabbit


def test_passive_declare_of_missing_queue_and_exchange(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{missing}", passive=True),
        op("exchange.declare", exchange="{missing}", passive=True),
        op("exchange.declare", exchange="{missing}", exchange_type="fanout", passive=True),
        op("exchange.declare", exchange="amq.topic", exchange_type="direct", passive=True),
        op("queue.declare", queue="{q}"),
        op("queue.declare", queue="{q}", passive=True, durable=True, arguments={"x-max-length": 1}),
    ])
    assert rabbit[0][:2] == ("channel-error", 404)


def test_queue_equivalence_errors(differ):
    _same(differ, [
        op("queue.declare", queue="{q}", arguments={"x-max-length": 10, "x-custom": "ignored"}),
        op("queue.declare", queue="{q}", durable=True),
        op("queue.declare", queue="{q}", auto_delete=True),
        op("queue.declare", queue="{q}"),  # x-max-length missing
        op("queue.declare", queue="{q}", arguments={"x-max-length": 11}),
        op("queue.declare", queue="{q}", arguments={"x-max-length": 10, "x-message-ttl": 5}),
        op("queue.declare", queue="{q}", arguments={"x-max-length": 10, "x-custom": "different"}),
        op("queue.declare", queue="{d}", durable=True, auto_delete=True),
        op("queue.declare", queue="{d}", durable=False, auto_delete=True),
        op("queue.declare", queue="{d}", durable=True, auto_delete=False),
    ])


def test_exchange_equivalence_errors(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="topic", arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{x}", exchange_type="direct", arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{x}", exchange_type="topic", durable=True,
           arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{x}", exchange_type="topic", auto_delete=True,
           arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{x}", exchange_type="topic", internal=True,
           arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{x}", exchange_type="topic"),
        op("exchange.declare", exchange="{x}", exchange_type="topic", arguments={"alternate-exchange": "{other}"}),
        op("exchange.declare", exchange="{x}", exchange_type="topic",
           arguments={"alternate-exchange": "{ae}", "x-anything": 1}),
        op("exchange.declare", exchange="{y}", exchange_type="fanout"),
        op("exchange.declare", exchange="{y}", exchange_type="fanout", arguments={"alternate-exchange": "{ae}"}),
    ])


def test_reserved_amq_prefix(differ):
    _same(differ, [
        op("exchange.declare", exchange="amq.{x}", exchange_type="direct"),
        op("queue.declare", queue="amq.{q}"),
        op("exchange.declare", exchange="amq.direct", exchange_type="direct"),  # existing: fine
        op("exchange.declare", exchange="amq.direct", exchange_type="direct", durable=True),
        op("exchange.declare", exchange="amq.direct", exchange_type="fanout", durable=True),
        op("exchange.declare", exchange="amq.fanout", exchange_type="fanout", durable=True, passive=True),
        op("queue.declare", queue="amq.{q}", passive=True),
        op("exchange.delete", exchange="amq.direct"),
        op("exchange.delete", exchange="amq.{x}"),
    ])


def test_default_exchange_is_off_limits(differ):
    _same(differ, [
        op("queue.declare", queue="{q}"),
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("exchange.declare", exchange="", exchange_type="direct"),
        op("exchange.declare", exchange="", exchange_type="direct", passive=True),
        op("exchange.delete", exchange=""),
        op("queue.bind", queue="{q}", exchange="", routing_key="{q}"),
        op("queue.unbind", queue="{q}", exchange="", routing_key="{q}"),
        op("exchange.bind", destination="{x}", source=""),
        op("exchange.bind", destination="", source="{x}"),
        op("exchange.unbind", destination="{x}", source=""),
    ])


def test_unknown_exchange_type_closes_the_connection(differ):
    rabbit = _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="x-hutch-no-such-type"),
        op("exchange.declare", exchange="{x}", exchange_type="topic"),  # on a new connection
        op("exchange.declare", exchange="{x}", exchange_type="x-hutch-no-such-type"),  # type checked first
    ])
    assert rabbit[0][:2] == ("connection-error", 503)


def test_bind_and_unbind_missing_things(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        op("queue.declare", queue="{q}"),
        op("queue.bind", queue="{missing_q}", exchange="{x}", routing_key="k"),
        op("queue.bind", queue="{q}", exchange="{missing_x}", routing_key="k"),
        op("queue.bind", queue="{missing_q}", exchange="{missing_x}", routing_key="k"),
        op("exchange.bind", destination="{missing_x}", source="{x}"),
        op("exchange.bind", destination="{x}", source="{missing_x}"),
        op("exchange.bind", destination="{missing_y}", source="{missing_x}"),
        op("queue.unbind", queue="{q}", exchange="{x}", routing_key="never"),
        op("queue.unbind", queue="{missing_q}", exchange="{x}", routing_key="k"),
        op("queue.unbind", queue="{q}", exchange="{missing_x}", routing_key="k"),
        op("exchange.unbind", destination="{missing_y}", source="{missing_x}"),
        op("exchange.delete", exchange="{missing_x}"),
        op("queue.delete", queue="{missing_q}"),
        op("queue.purge", queue="{missing_q}"),
    ])


def test_exclusive_queue_from_another_connection(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{q}", exclusive=True),
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("queue.declare", queue="{q}", exclusive=True, on="2.1"),
        op("queue.declare", queue="{q}", on="2.1"),
        op("queue.declare", queue="{q}", passive=True, on="2.1"),
        op("queue.bind", queue="{q}", exchange="{x}", on="2.1"),
        op("queue.unbind", queue="{q}", exchange="{x}", on="2.1"),
        op("basic.consume", queue="{q}", consumer_tag="{c}", on="2.1"),
        op("basic.get", queue="{q}", on="2.1"),
        op("queue.purge", queue="{q}", on="2.1"),
        op("queue.delete", queue="{q}", on="2.1"),
        op("basic.publish", exchange="", routing_key="{q}", body="others may publish", on="2.1"),
        op("queue.declare", queue="{q}"),  # the owner redeclares without exclusive
        op("queue.declare", queue="{q}", exclusive=True),
    ])
    assert rabbit[2][:2] == ("channel-error", 405)


def test_delete_if_unused_and_if_empty(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        op("exchange.declare", exchange="{x2}", exchange_type="direct"),
        op("queue.declare", queue="{q}"),
        op("queue.bind", queue="{q}", exchange="{x}", routing_key="k"),
        op("exchange.bind", destination="{x}", source="{x2}"),
        op("exchange.delete", exchange="{x}", if_unused=True),  # bound to q
        op("exchange.delete", exchange="{x2}", if_unused=True),  # bound to x
        op("basic.publish", exchange="", routing_key="{q}", body="m"),
        op("queue.delete", queue="{q}", if_empty=True),
        op("basic.consume", queue="{q}", consumer_tag="{c}", on="1.2"),
        op("queue.delete", queue="{q}", if_unused=True),
        op("basic.cancel", consumer_tag="{c}", on="1.2"),
        op("queue.delete", queue="{q}", if_unused=True),
        op("exchange.delete", exchange="{x}", if_unused=True),  # its only binding went with q
        op("exchange.delete", exchange="{x2}", if_unused=True),
    ])


def test_unknown_delivery_tags(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.ack", delivery_tag=1),
        op("basic.ack", delivery_tag=0),
        op("basic.ack", delivery_tag=0, multiple=True),  # nothing outstanding: fine
        *[op("basic.publish", exchange="", routing_key="{q}", body="m%d" % i) for i in range(3)],
        op("basic.get", queue="{q}"),
        op("basic.ack", delivery_tag=1),
        op("basic.ack", delivery_tag=1),  # twice
        op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=2, multiple=True),
        op("basic.get", queue="{q}"),
        op("basic.reject", delivery_tag=7),
        op("basic.get", queue="{q}"),
        op("basic.nack", delivery_tag=2, multiple=True),
        op("basic.get", queue="{q}", auto_ack=True),
        op("basic.ack", delivery_tag=1),  # auto-acked deliveries cannot be acked
    ])
    assert ("channel-error", 406, "PRECONDITION_FAILED - unknown delivery tag 1") in rabbit


def test_tx_and_confirm_modes_do_not_mix(differ):
    _same(differ, [
        op("tx.commit"),
        op("tx.rollback"),
        op("tx.select"),
        op("tx.select"),  # again: fine
        op("confirm.select"),
        op("confirm.select"),
        op("tx.select"),
        op("channel.open"),
        op("tx.commit"),
    ])


def test_not_implemented_replies_close_the_connection(differ):
    rabbit = _same(differ, [
        op("basic.qos", prefetch_size=4096),
        op("basic.qos", prefetch_size=1, prefetch_count=5, global_qos=True),
        op("basic.qos", prefetch_count=5),
        op("basic.recover", requeue=False),
        op("basic.recover", requeue=True),
    ])
    assert [o[:2] for o in rabbit] == [("connection-error", 540), ("connection-error", 540), ("Basic.QosOk",),
                                       ("connection-error", 540), ("Basic.RecoverOk",)]


def test_consume_errors(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{q}"),
        op("basic.consume", queue="{missing}", consumer_tag="{c}"),
        op("basic.consume", queue="{q}", consumer_tag="{c}"),
        op("basic.consume", queue="{q}", consumer_tag="{c1}", exclusive=True, on="1.2"),  # q has a consumer
        op("basic.cancel", consumer_tag="{c}"),
        op("basic.consume", queue="{q}", consumer_tag="{c1}", exclusive=True, on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}", on="1.3"),  # q is in exclusive use
        op("queue.declare", queue="{q}", passive=True),
        op("basic.cancel", consumer_tag="{c1}", on="1.2"),
        op("basic.consume", queue="{q}", consumer_tag="{c2}", on="1.3"),
        op("queue.declare", queue="{q}", passive=True),
    ])
    assert rabbit[3][:2] == ("channel-error", 403)


def test_publish_errors(differ):
    _same(differ, [
        op("exchange.declare", exchange="{inner}", exchange_type="fanout", internal=True),
        op("basic.publish", exchange="{missing}", routing_key="k", body="m"),
        op("basic.publish", exchange="{missing}", routing_key="k", body="m", mandatory=True),
        op("basic.publish", exchange="{inner}", routing_key="k", body="m"),
        op("basic.publish", exchange="amq.direct", routing_key="k", body="m", properties={"user_id": "someone"}),
        op("basic.publish", exchange="amq.direct", routing_key="k", body="m", properties={"user_id": "guest"}),
    ])


def test_queue_name_shortcut_without_a_declared_queue(differ):
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        op("basic.get", queue=""),
        op("queue.bind", queue="", exchange="{x}", routing_key="k"),
        op("queue.purge", queue=""),
        op("queue.delete", queue=""),
        op("basic.consume", queue="", consumer_tag="{c}"),
        op("queue.unbind", queue="", exchange="{x}", routing_key="k"),
    ])


def test_publish_property_checks(differ):
    expirations = ["abc", "-1", "12x", "", " 5", "+", "1 ", "5.5", '7"\\', "-5x", "é1", "315360000001",
                   "99999999999999", "315360000000", "+5", "-0"]
    _same(differ, [
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("basic.publish", exchange="{x}", routing_key="", body="m", properties={"user_id": ""}),
        op("basic.publish", exchange="{missing}", routing_key="", body="m", properties={"user_id": "bob"}),
        op("basic.publish", exchange="{x}", routing_key="", body="m",
           properties={"user_id": "bob", "expiration": "x"}),
        op("basic.publish", exchange="{x}", routing_key="", body="m",
           properties={"expiration": "x", "headers": {"CC": 1}}),
        op("basic.publish", exchange="{x}", routing_key="", body="m", properties={"headers": {"CC": None}}),
        *[op("basic.publish", exchange="{x}", routing_key="", body="m", properties={"expiration": e})
          for e in expirations],
    ])
