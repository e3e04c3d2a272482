"""Differential routing tables: the same bindings and publishes on hutch and on
RabbitMQ, then every queue drained with basic.get; the observations (bodies,
exchange, routing key, properties, message counts, returns) must be equal."""
from __future__ import annotations

from decimal import Decimal

import pytest

from .diffkit import op

pytestmark = pytest.mark.differential


def _queues(*names: str) -> list:
    return [op("queue.declare", queue="{%s}" % n) for n in names]


def _drain(*names: str) -> list:
    return [op("drain", queue="{%s}" % n) for n in names]


def _publish_all(exchange: str, keys: list, **extra) -> list:
    return [op("basic.publish", exchange=exchange, routing_key=k, body="key=%r" % k, **extra) for k in keys]


def test_direct_exchange_routing_table(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        *_queues("q1", "q2", "q3", "q4"),
        op("queue.bind", queue="{q1}", exchange="{x}", routing_key="a"),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="a"),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="b"),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="b"),  # duplicate binding
        op("queue.bind", queue="{q3}", exchange="{x}", routing_key=""),
        op("queue.bind", queue="{q4}", exchange="{x}", routing_key="A"),
        op("queue.bind", queue="{q4}", exchange="{x}", routing_key="c"),
        op("queue.unbind", queue="{q4}", exchange="{x}", routing_key="c"),
        op("queue.unbind", queue="{q4}", exchange="{x}", routing_key="never-bound"),
        *_publish_all("{x}", ["a", "b", "", "A", "c", "a.b", "z"], mandatory=True),
        *_drain("q1", "q2", "q3", "q4"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_default_exchange_routes_by_queue_name(differ):
    scenario = [
        *_queues("q1", "q2"),
        op("basic.publish", exchange="", routing_key="{q1}", body="one"),
        op("basic.publish", exchange="", routing_key="{q2}", body="two", properties={"content_type": "text/plain"}),
        op("basic.publish", exchange="", routing_key="{nowhere}", body="lost", mandatory=True),
        op("basic.publish", exchange="amq.default", routing_key="{q1}", body="via amq.default"),
        *_drain("q1", "q2"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_fanout_exchange_ignores_routing_key(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        *_queues("q1", "q2", "q3"),
        op("queue.bind", queue="{q1}", exchange="{x}", routing_key=""),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="anything"),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="other"),  # two bindings, one copy
        op("queue.bind", queue="{q3}", exchange="{x}", routing_key="x"),
        op("queue.unbind", queue="{q3}", exchange="{x}", routing_key="x"),
        *_publish_all("{x}", ["", "k", "a.b.c"], mandatory=True),
        *_drain("q1", "q2", "q3"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_fanout_without_bindings_returns_mandatory(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("basic.publish", exchange="{x}", routing_key="k", body="m", mandatory=True,
           properties={"message_id": "id-1", "headers": {"h": 1}}),
        op("basic.publish", exchange="{x}", routing_key="k", body="not mandatory"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


TOPIC_PATTERNS = ["*", "#", "a.*", "a.#", "#.b", "*.b", "a.*.c", "*.*", "a..b", "", "#.#", "a.#.b", "#.a.#",
                  "a.*.#", "*.#", "a.b", ".", "a."]
TOPIC_KEYS = ["", "a", "b", "a.b", "a.b.c", "a..b", ".", "a.", ".a", "a.x.b", "a.b.b", "x.a.y", "a.x.c", "a.b.c.d"]


def test_topic_exchange_routing_table(differ):
    names = ["q%d" % i for i in range(len(TOPIC_PATTERNS))]
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="topic"),
        *_queues(*names),
        *[op("queue.bind", queue="{%s}" % n, exchange="{x}", routing_key=p) for n, p in zip(names, TOPIC_PATTERNS)],
        *_publish_all("{x}", TOPIC_KEYS + ["zzz.yyy"], mandatory=True),
        *_drain(*names),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_topic_unbind_and_rebind(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="topic"),
        *_queues("q1", "q2"),
        op("queue.bind", queue="{q1}", exchange="{x}", routing_key="a.#"),
        op("queue.bind", queue="{q1}", exchange="{x}", routing_key="a.*"),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="#"),
        op("queue.unbind", queue="{q1}", exchange="{x}", routing_key="a.#"),
        op("queue.unbind", queue="{q2}", exchange="{x}", routing_key="#"),
        *_publish_all("{x}", ["a", "a.b", "a.b.c"], mandatory=True),
        op("queue.bind", queue="{q2}", exchange="{x}", routing_key="#.c"),
        *_publish_all("{x}", ["a.b.c", "c"]),
        *_drain("q1", "q2"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


HEADER_BINDINGS = [
    {"x-match": "all", "a": 1, "b": "two"},
    {"x-match": "any", "a": 1, "b": "two"},
    {"a": 1, "b": "two"},  # x-match defaults to all
    {"x-match": "all"},  # no headers to match: everything
    {"x-match": "any"},  # nothing to match any of: nothing
    {"x-match": "all", "x-tag": "t", "a": 1},  # x- keys are ignored by all
    {"x-match": "any", "x-tag": "t"},
    {"x-match": "all-with-x", "x-tag": "t", "a": 1},
    {"x-match": "any-with-x", "x-tag": "t", "c": True},
    {"x-match": "all", "a": None},  # void: the header must be present
    {"x-match": "any", "a": "1"},  # a string never equals a number
    {"x-match": "all", "n": {"k": "v"}},
    {"x-match": "all", "l": ["x", 1]},
    {"x-match": "all", "f": Decimal("1.5")},
]
HEADER_MESSAGES = [
    None,
    {},
    {"a": 1},
    {"a": 1, "b": "two"},
    {"a": 1, "b": "two", "c": True},
    {"a": 2, "b": "two"},
    {"b": "two"},
    {"a": "1"},
    {"a": 1, "x-tag": "t"},
    {"x-tag": "t"},
    {"x-tag": "u", "c": True},
    {"a": None},
    {"n": {"k": "v"}},
    {"l": ["x", 1]},
    {"f": Decimal("1.5")},
    {"a": 1, "b": "two", "x-match": "any"},
]


def test_headers_exchange_routing_table(differ):
    names = ["q%d" % i for i in range(len(HEADER_BINDINGS))]
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="headers"),
        *_queues(*names),
        *[op("queue.bind", queue="{%s}" % n, exchange="{x}", routing_key="ignored", arguments=args)
          for n, args in zip(names, HEADER_BINDINGS)],
        *[op("basic.publish", exchange="{x}", routing_key="rk", body="message %d" % i, mandatory=True,
             properties={"headers": headers} if headers is not None else None)
          for i, headers in enumerate(HEADER_MESSAGES)],
        *_drain(*names),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_headers_unbind_needs_the_same_arguments(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="headers"),
        *_queues("q1"),
        op("queue.bind", queue="{q1}", exchange="{x}", arguments={"x-match": "any", "a": 1}),
        op("queue.bind", queue="{q1}", exchange="{x}", arguments={"x-match": "any", "b": 2}),
        op("queue.unbind", queue="{q1}", exchange="{x}", arguments={"x-match": "any", "a": 2}),  # no such binding
        op("queue.unbind", queue="{q1}", exchange="{x}", arguments={"x-match": "any", "b": 2}),
        op("basic.publish", exchange="{x}", routing_key="", body="a", properties={"headers": {"a": 1}}),
        op("basic.publish", exchange="{x}", routing_key="", body="b", properties={"headers": {"b": 2}},
           mandatory=True),
        *_drain("q1"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_headers_binding_with_bad_x_match(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="headers"),
        *_queues("q1"),
        op("queue.bind", queue="{q1}", exchange="{x}", arguments={"x-match": "some"}),
        op("queue.bind", queue="{q1}", exchange="{x}", arguments={"x-match": 1}),
        op("queue.bind", queue="{q1}", exchange="{x}", arguments={"x-match": "any-with-x"}),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_alternate_exchange(differ):
    scenario = [
        op("exchange.declare", exchange="{ae}", exchange_type="fanout"),
        op("exchange.declare", exchange="{x}", exchange_type="direct", arguments={"alternate-exchange": "{ae}"}),
        op("exchange.declare", exchange="{y}", exchange_type="direct",
           arguments={"alternate-exchange": "{missing}"}),
        *_queues("q1", "qae"),
        op("queue.bind", queue="{q1}", exchange="{x}", routing_key="a"),
        op("queue.bind", queue="{qae}", exchange="{ae}"),
        op("basic.publish", exchange="{x}", routing_key="a", body="routed", mandatory=True),
        op("basic.publish", exchange="{x}", routing_key="b", body="to the AE", mandatory=True),
        op("basic.publish", exchange="{y}", routing_key="b", body="AE is missing", mandatory=True),
        op("queue.unbind", queue="{qae}", exchange="{ae}"),
        op("basic.publish", exchange="{x}", routing_key="c", body="AE routes nowhere", mandatory=True),
        *_drain("q1", "qae"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_alternate_exchange_chain_and_cycle(differ):
    scenario = [
        op("exchange.declare", exchange="{a}", exchange_type="direct", arguments={"alternate-exchange": "{b}"}),
        op("exchange.declare", exchange="{b}", exchange_type="direct", arguments={"alternate-exchange": "{a}"}),
        op("exchange.declare", exchange="{c}", exchange_type="topic", arguments={"alternate-exchange": "{a}"}),
        *_queues("qa", "qb"),
        op("queue.bind", queue="{qa}", exchange="{a}", routing_key="ka"),
        op("queue.bind", queue="{qb}", exchange="{b}", routing_key="kb"),
        op("basic.publish", exchange="{a}", routing_key="kb", body="a->b", mandatory=True),
        op("basic.publish", exchange="{b}", routing_key="ka", body="b->a", mandatory=True),
        op("basic.publish", exchange="{c}", routing_key="kb", body="c->a->b", mandatory=True),
        op("basic.publish", exchange="{a}", routing_key="none", body="a<->b cycle", mandatory=True),
        *_drain("qa", "qb"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_exchange_to_exchange_chain_with_cycle(differ):
    scenario = [
        op("exchange.declare", exchange="{x1}", exchange_type="direct"),
        op("exchange.declare", exchange="{x2}", exchange_type="topic"),
        op("exchange.declare", exchange="{x3}", exchange_type="fanout"),
        *_queues("q1", "q2", "q3"),
        op("exchange.bind", destination="{x2}", source="{x1}", routing_key="k.a"),
        op("exchange.bind", destination="{x3}", source="{x2}", routing_key="k.*"),
        op("exchange.bind", destination="{x1}", source="{x3}", routing_key="k.a"),  # x1 -> x2 -> x3 -> x1
        op("exchange.bind", destination="{x1}", source="{x1}", routing_key="k.a"),  # self loop
        op("queue.bind", queue="{q1}", exchange="{x1}", routing_key="k.a"),
        op("queue.bind", queue="{q2}", exchange="{x2}", routing_key="#"),
        op("queue.bind", queue="{q3}", exchange="{x3}"),
        op("basic.publish", exchange="{x1}", routing_key="k.a", body="from x1", mandatory=True),
        op("basic.publish", exchange="{x2}", routing_key="k.a", body="from x2", mandatory=True),
        op("basic.publish", exchange="{x3}", routing_key="k.a", body="from x3", mandatory=True),
        op("basic.publish", exchange="{x1}", routing_key="k.b", body="no route", mandatory=True),
        op("exchange.unbind", destination="{x3}", source="{x2}", routing_key="k.*"),
        op("exchange.unbind", destination="{x3}", source="{x2}", routing_key="k.*"),  # again: still Ok
        op("basic.publish", exchange="{x1}", routing_key="k.a", body="after unbind", mandatory=True),
        *_drain("q1", "q2", "q3"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_exchange_delete_drops_its_bindings(differ):
    scenario = [
        op("exchange.declare", exchange="{x1}", exchange_type="fanout"),
        op("exchange.declare", exchange="{x2}", exchange_type="fanout"),
        *_queues("q1"),
        op("exchange.bind", destination="{x2}", source="{x1}"),
        op("queue.bind", queue="{q1}", exchange="{x2}"),
        op("exchange.delete", exchange="{x2}"),
        op("basic.publish", exchange="{x1}", routing_key="", body="x2 is gone", mandatory=True),
        op("exchange.declare", exchange="{x2}", exchange_type="fanout"),
        op("basic.publish", exchange="{x1}", routing_key="", body="x2 is back, unbound", mandatory=True),
        op("basic.publish", exchange="{x2}", routing_key="", body="direct to x2", mandatory=True),
        *_drain("q1"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_internal_exchange_routes_only_from_exchanges(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="fanout"),
        op("exchange.declare", exchange="{inner}", exchange_type="fanout", internal=True),
        *_queues("q1"),
        op("exchange.bind", destination="{inner}", source="{x}"),
        op("queue.bind", queue="{q1}", exchange="{inner}"),
        op("basic.publish", exchange="{x}", routing_key="", body="through x"),
        op("drain", queue="{q1}"),
        op("basic.publish", exchange="{inner}", routing_key="", body="direct"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_cc_and_bcc_headers(differ):
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="direct"),
        op("exchange.declare", exchange="{t}", exchange_type="topic"),
        *_queues("qa", "qb", "qc", "qd"),
        op("queue.bind", queue="{qa}", exchange="{x}", routing_key="a"),
        op("queue.bind", queue="{qb}", exchange="{x}", routing_key="b"),
        op("queue.bind", queue="{qc}", exchange="{x}", routing_key="c"),
        op("queue.bind", queue="{qd}", exchange="{t}", routing_key="d.*"),
        op("basic.publish", exchange="{x}", routing_key="a", body="cc",
           properties={"headers": {"CC": ["b", "c"], "other": 1}}),
        op("basic.publish", exchange="{x}", routing_key="a", body="bcc",
           properties={"headers": {"BCC": ["c"], "CC": ["a"]}}),
        op("basic.publish", exchange="{x}", routing_key="none", body="only cc routes", mandatory=True,
           properties={"headers": {"CC": ["b"]}}),
        op("basic.publish", exchange="{x}", routing_key="none", body="cc routes nowhere", mandatory=True,
           properties={"headers": {"CC": ["zz"], "BCC": ["yy"]}}),
        op("basic.publish", exchange="{t}", routing_key="x", body="topic cc", properties={"headers": {"CC": ["d.e"]}}),
        op("basic.publish", exchange="", routing_key="{qa}", body="default exchange cc",
           properties={"headers": {"CC": ["{qb}"], "BCC": ["{qc}"]}}),
        op("basic.publish", exchange="{x}", routing_key="a", body="mixed array", properties={"headers": {"CC": ["b", 7]}}),
        op("basic.publish", exchange="{x}", routing_key="a", body="empty", properties={"headers": {"CC": []}}),
        *_drain("qa", "qb", "qc", "qd"),
        op("basic.publish", exchange="{x}", routing_key="a", body="bad cc", properties={"headers": {"CC": "b"}}),
        op("basic.publish", exchange="{x}", routing_key="a", body="bad bcc", properties={"headers": {"BCC": 5}}),
        *_drain("qa", "qb", "qc"),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit


def test_mandatory_returns_keep_the_message(differ):
    props = {"content_type": "application/json", "delivery_mode": 2, "priority": 3, "correlation_id": "c",
             "reply_to": "r", "expiration": "60000", "message_id": "m", "timestamp": 1700000000, "type": "t",
             "user_id": "guest", "app_id": "a", "headers": {"k": "v", "n": 5, "l": [1, "x"], "t": {"a": True}}}
    scenario = [
        op("exchange.declare", exchange="{x}", exchange_type="topic"),
        op("basic.publish", exchange="{x}", routing_key="r.k", body="full properties", properties=props,
           mandatory=True),
        op("basic.publish", exchange="{x}", routing_key="", body="", mandatory=True),
        op("basic.publish", exchange="", routing_key="{absent}", body="default", mandatory=True),
    ]
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
