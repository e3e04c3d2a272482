"""The firehose (RabbitMQ's trace_on) on a broker process: turned on and off
over the management API, what trace messages carry (the exact wire form is
compared with RabbitMQ's in tests/differential/test_diff_firehose.py), and
the predeclared, internal amq.rabbitmq.trace exchange."""
from __future__ import annotations

import re

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

import firehose_scenario
from helpers import connect, unique, wait_for
from http_api import Api, segment


def test_publishes_and_deliveries_are_traced(broker):
    found = firehose_scenario.run(broker.port, broker.ports["HTTP"])
    assert [(key, body) for key, body, _headers in found] == [
        ("publish.fh-x", b"hello"), ("publish.", b"plain"), ("publish.fh-x", b"unroutable"),
        ("deliver.fh-q", b"hello"), ("deliver.fh-q", b"hello"), ("deliver.fh-q", b"plain"),
        ("publish.", b"consumed"), ("deliver.fh-q", b"consumed"), ("publish.", b"handed"), ("deliver.fh-q", b"handed")]
    published = {name: value for name, _kind, value in found[0][2]}
    assert published["routing_keys"] == [("S", "a.b"), ("S", "a.c")]
    assert published["routed_queues"] == [("S", "fh-q")]
    assert published["user"] == "guest" and published["channel"] == 1
    assert re.fullmatch(r"127\.0\.0\.1:\d+ -> 127\.0\.0\.1:%d" % broker.port, published["connection"])
    assert published["node"] == Api(broker.ports["HTTP"]).get("/api/overview").body["node"]
    assert {name: value for name, _kind, value in found[2][2]}["routed_queues"] == []
    redelivered = [{name: value for name, _kind, value in headers}["redelivered"]
                   for key, _body, headers in found if key.startswith("deliver.")]
    assert redelivered == [0, 1, 0, 0, 0]


def trace_queue(channel) -> str:
    name = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(name, "amq.rabbitmq.trace", "#")
    return name


def test_hutch_trace_route_turns_tracing_on_and_off(api, broker, vhost):
    path = "/api/hutch/trace/" + segment(vhost)
    assert api.get("/api/vhosts/" + segment(vhost)).body["tracing"] is False
    with connect(broker.port, virtual_host=vhost) as connection:
        channel = connection.channel()
        traces = trace_queue(channel)
        channel.queue_declare("work")
        channel.basic_publish("", "work", b"untraced")
        assert api.put(path, {"enabled": True}).status == 204
        assert api.get("/api/vhosts/" + segment(vhost)).body["tracing"] is True
        channel.basic_publish("", "work", b"traced")
        wait_for(lambda: channel.queue_declare(traces, passive=True).method.message_count == 1)
        channel.queue_purge(traces)
        assert api.put(path, {"enabled": False}).status == 204
        channel.basic_publish("", "work", b"untraced again")
        assert channel.queue_declare("work", passive=True).method.message_count == 3
        assert channel.queue_declare(traces, passive=True).method.message_count == 0
    assert api.put(path, {}).status == 400
    assert api.put(path, {"enabled": "yes"}).status == 400
    assert api.put("/api/hutch/trace/" + unique("nov"), {"enabled": True}).status == 404


def test_the_trace_exchange_is_predeclared_internal_and_not_exported(api, broker, vhost):
    shown = api.get("/api/exchanges/%s/amq.rabbitmq.trace" % segment(vhost)).body
    assert (shown["type"], shown["durable"], shown["internal"], shown["auto_delete"]) == ("topic", True, True, False)
    names = [x["name"] for x in api.get("/api/definitions").body["exchanges"]]
    assert "amq.rabbitmq.trace" not in names
    with connect(broker.port, virtual_host=vhost) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.basic_publish("amq.rabbitmq.trace", "publish.x", b"forged")
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == (
            "ACCESS_REFUSED - cannot publish to internal exchange 'amq.rabbitmq.trace' in vhost '%s'" % vhost)
        channel = connection.channel()
        channel.exchange_declare("amq.rabbitmq.trace", "topic", passive=True)


def test_consuming_trace_messages_does_not_feed_the_firehose(api, broker, vhost):
    api.put("/api/hutch/trace/" + segment(vhost), {"enabled": True})
    with connect(broker.port, virtual_host=vhost) as connection:
        channel = connection.channel()
        traces = trace_queue(channel)
        channel.basic_publish("", "nowhere", b"m", pika.BasicProperties(message_id="one"))
        wait_for(lambda: channel.queue_declare(traces, passive=True).method.message_count == 1)
        method, _props, _body = channel.basic_get(traces, auto_ack=True)
        assert method.routing_key == "publish."
        # getting it was a delivery, of a message of the trace exchange: not traced
        assert channel.queue_declare(traces, passive=True).method.message_count == 0


def test_api_publishes_and_gets_are_traced_as_rabbitmq_traces_them(api, broker, vhost):
    """RabbitMQ runs them on an internal connection named by its pid, channel 1."""
    api.put("/api/hutch/trace/" + segment(vhost), {"enabled": True})
    with connect(broker.port, virtual_host=vhost) as connection:
        channel = connection.channel()
        traces = trace_queue(channel)
        channel.queue_declare("q")
        assert api.post("/api/exchanges/%s/amq.default/publish" % segment(vhost),
                        {"routing_key": "q", "properties": {}, "payload": "x", "payload_encoding": "string"}
                        ).body == {"routed": True}
        assert len(api.post("/api/queues/%s/q/get" % segment(vhost),
                            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}).body) == 1
        wait_for(lambda: channel.queue_declare(traces, passive=True).method.message_count == 2)
        seen = [channel.basic_get(traces, auto_ack=True) for _ in range(2)]
    assert [method.routing_key for method, _props, _body in seen] == ["publish.", "deliver.q"]
    published, delivered = (props.headers for _method, props, _body in seen)
    assert re.fullmatch(r"<hutch@.+\.1\.\d+\.0>", published["connection"])
    assert (published["channel"], published["user"], published["routed_queues"]) == (1, "guest", ["q"])
    assert (delivered["redelivered"], delivered["routing_keys"], delivered["user"]) == (0, ["q"], "guest")
