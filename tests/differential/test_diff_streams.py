"""Stream queues (x-queue-type: stream), differential against RabbitMQ 3.10:
the declaration rules and their texts, the consume rules, what a stream
refuses (basic.get, nack, reject, purge, automatic acks), and reading:
x-stream-offset first / last / next / an offset, the x-stream-offset header,
prefetch as credit, independent consumers, routing through exchanges.

Known differences, left out of the comparisons (docs/streams.md): a
queue.declare-ok of an existing stream counts its messages and consumers
now (RabbitMQ's come from its statistics, seconds late, and count no stream
consumers); hutch answers an x-max-age of "-1s" and an unknown
x-stream-offset with a 406 where RabbitMQ 3.10 fails with 541.
"""
from __future__ import annotations

import pytest

from .diffkit import op

pytestmark = pytest.mark.differential

STREAM = {"x-queue-type": "stream"}


def stream(queue: str = "{s}", **arguments) -> tuple:
    return op("queue.declare", queue=queue, durable=True, arguments={**STREAM, **arguments})


def _same(differ, scenario) -> list:
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
    return rabbit


def test_declaration_rules_and_texts(differ):
    refused_arguments = [
        {"x-max-age": "1x"}, {"x-max-age": 5}, {"x-max-age": "0s"}, {"x-max-age": "1.5h"},
        {"x-max-length-bytes": "a"}, {"x-max-length-bytes": -1},
        {"x-stream-max-segment-size-bytes": "a"}, {"x-stream-max-segment-size-bytes": -1},
        {"x-stream-max-segment-size-bytes": 3000000001},
        {"x-message-ttl": 1000}, {"x-message-ttl": -5}, {"x-max-length": 10}, {"x-max-priority": 5},
        {"x-dead-letter-exchange": "dlx"}, {"x-dead-letter-routing-key": "k"}, {"x-expires": 1000},
        {"x-overflow": "drop-head"}, {"x-single-active-consumer": True}, {"x-queue-mode": "lazy"},
        {"x-delivery-limit": 3}, {"x-quorum-initial-group-size": 3},
        {"x-message-ttl": 5, "x-max-length-bytes": -1}, {"x-message-ttl": 5, "x-max-length": 3},
        {"x-queue-leader-locator": "bogus"}, {"x-queue-leader-locator": 5},
        {"x-queue-leader-locator": "bogus", "x-max-priority": 5}, {"x-queue-master-locator": "min-masters"},
    ]
    rabbit = _same(differ, [
        op("queue.declare", queue="{a}", durable=False, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=True, exclusive=True, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=True, auto_delete=True, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=False, exclusive=True, auto_delete=True, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=False, exclusive=True, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=False, arguments={**STREAM, "x-max-age": "1x"}),
        op("queue.declare", queue="{a}", durable=False, arguments={**STREAM, "x-message-ttl": 5}),
        op("queue.declare", queue="{a}", durable=False,
           arguments={**STREAM, "x-stream-max-segment-size-bytes": 3000000001}),
        op("queue.declare", queue="", durable=True, arguments=STREAM),
        op("queue.declare", queue="{a}", durable=True, arguments={"x-queue-type": "foo"}),
        op("queue.declare", queue="{a}", durable=True, arguments={"x-queue-type": "Stream"}),
        op("queue.declare", queue="{a}", durable=True, arguments={"x-queue-type": 5}),
        *[stream("{a}", **arguments) for arguments in refused_arguments],
        stream("{s}", **{"x-max-age": "10D", "x-max-length-bytes": 0, "x-stream-max-segment-size-bytes": 0,
                         "x-initial-cluster-size": 1, "x-queue-leader-locator": "client-local", "x-foo": "bar"}),
        stream("{b}", **{"x-max-age": "1Y", "x-stream-max-segment-size-bytes": 3000000000}),
        stream("{c}", **{"x-max-age": "000010s"}),
        op("queue.declare", queue="{s}", durable=True, arguments={"x-queue-type": "classic"}),
        op("queue.declare", queue="{s}", durable=True),
        stream("{s}", **{"x-max-age": "2h", "x-max-length-bytes": 0, "x-stream-max-segment-size-bytes": 0}),
        stream("{s}", **{"x-max-age": "10D", "x-max-length-bytes": 100, "x-stream-max-segment-size-bytes": 0}),
        stream("{s}", **{"x-max-age": "10D", "x-max-length-bytes": 0}),
        op("queue.declare", queue="{classic}", arguments={"x-queue-type": "classic"}),
        op("queue.declare", queue="{classic}"),
        op("queue.declare", queue="{quorum}", durable=True, arguments={"x-queue-type": "quorum"}),
        op("queue.delete", queue="{s}"),
    ])
    assert rabbit[0] == ("channel-error", 406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue "
                         "'{a}' in vhost '/'")


def test_what_a_stream_refuses(differ):
    _same(differ, [
        stream(),
        op("basic.consume", queue="{s}", consumer_tag="c0"),
        op("basic.consume", queue="{s}", consumer_tag="c0", arguments={"x-stream-offset": "1x"}),
        op("basic.consume", queue="{s}", consumer_tag="c0", auto_ack=True),
        op("basic.qos", prefetch_count=10, global_qos=True),
        op("basic.consume", queue="{s}", consumer_tag="c0"),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c0", auto_ack=True),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c0", arguments={"x-stream-offset": "0s"}),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c0", arguments={"x-priority": 3}),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c0", arguments={"x-stream-offset": "1x", "x-priority": 2}),
        op("basic.get", queue="{s}"),
        op("basic.get", queue="{s}", auto_ack=True),
        op("queue.purge", queue="{s}"),
        op("confirm.select"),
        op("publish_confirmed", exchange="", routing_key="{s}", body="m0"),
        op("publish_confirmed", exchange="", routing_key="{s}", body="m1"),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c1", arguments={"x-stream-offset": "first"}),
        op("deliveries", count=2),
        op("basic.nack", delivery_tag=1),
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="c2", arguments={"x-stream-offset": "first"}),
        op("deliveries", count=2),
        op("basic.reject", delivery_tag=2, requeue=False),
        op("queue.delete", queue="{s}"),
    ])


def test_reading_from_offsets_with_credit_and_independent_consumers(differ):
    published = [op("publish_confirmed", on="2.1", exchange="", routing_key="{s}", body="m%d" % i,
                    properties={"headers": {"i": i}, "content_type": "text/plain"}) for i in range(5)]
    rabbit = _same(differ, [
        stream(),
        op("confirm.select", on="2.1"),
        *published,
        op("basic.qos", prefetch_count=2),
        op("basic.consume", queue="{s}", consumer_tag="first", arguments={"x-stream-offset": "first"}),
        op("deliveries", count=2),
        op("basic.ack", delivery_tag=1),  # credit for one more
        op("deliveries", count=1),
        op("basic.ack", delivery_tag=3, multiple=True),
        op("deliveries", count=2),
        op("basic.qos", on="1.2", prefetch_count=10),
        op("basic.consume", on="1.2", queue="{s}", consumer_tag="at3", arguments={"x-stream-offset": 3}),
        op("deliveries", on="1.2", count=2),
        op("basic.qos", on="1.3", prefetch_count=10),
        op("basic.consume", on="1.3", queue="{s}", consumer_tag="last", arguments={"x-stream-offset": "last"}),
        op("deliveries", on="1.3", count=1),
        op("basic.qos", on="1.4", prefetch_count=10),
        op("basic.consume", on="1.4", queue="{s}", consumer_tag="next"),
        op("basic.qos", on="1.5", prefetch_count=10),
        op("basic.consume", on="1.5", queue="{s}", consumer_tag="far", exclusive=True,  # shares the stream
           arguments={"x-stream-offset": 100}),
        op("queue.bind", on="2.1", queue="{s}", exchange="amq.direct", routing_key="{rk}"),
        op("publish_confirmed", on="2.1", exchange="amq.direct", routing_key="{rk}", body="routed"),
        op("basic.publish", on="2.2", exchange="amq.direct", routing_key="{nowhere}", body="lost", mandatory=True),
        op("deliveries", on="1.4", count=1),
        op("deliveries", on="1.3", count=1),
        op("deliveries", on="1.2", count=1),
        op("basic.ack", delivery_tag=5, multiple=True),  # "first" had no credit left for "routed"
        op("deliveries", count=1),
        op("deliveries", on="1.5", count=0),
        op("queue.delete", queue="{s}"),
    ])
    delivered = [o for o in rabbit if o[0] == "Basic.Deliver"]
    assert delivered[0][6:] == ("m0", {"content_type": "text/plain", "headers": {"i": 0, "x-stream-offset": 0}})
    assert [o[6] for o in delivered[:5]] == ["m0", "m1", "m2", "m3", "m4"]


def test_an_offset_past_the_end_delivers_from_that_offset(differ):
    """x-stream-offset beyond the last record: the reader attaches at the
    end and delivers nothing below the offset asked for. RabbitMQ 3.11-4.x
    do the same over AMQP 0-9-1 (osiris attaches the reader at `next`,
    rabbit_stream_queue drops records below the consumer's start offset);
    3.10.8 is the reference here."""
    rabbit = _same(differ, [
        stream(),
        op("confirm.select", on="2.1"),
        *[op("publish_confirmed", on="2.1", exchange="", routing_key="{s}", body="m%d" % i) for i in range(3)],
        op("basic.qos", prefetch_count=10),
        op("basic.consume", queue="{s}", consumer_tag="far", arguments={"x-stream-offset": 5}),
        *[op("publish_confirmed", on="2.1", exchange="", routing_key="{s}", body="m%d" % i) for i in range(3, 8)],
        op("deliveries", count=3),
        op("queue.delete", queue="{s}"),
    ])
    assert [o[6] for o in rabbit if o[0] == "Basic.Deliver"] == ["m5", "m6", "m7"]
