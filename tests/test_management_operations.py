"""Queue get and purge, exchange publish, aliveness test and health checks
through the management API, checked against what AMQP clients see."""
from __future__ import annotations

import base64

import pika
import pytest

from helpers import confirm_channel, drain, publish_n, ready, unique
from http_api import Api, segment


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


@pytest.fixture
def queue(conn):
    """A durable queue in / (deleted afterwards) and a confirm channel."""
    channel = confirm_channel(conn)
    name = unique("q")
    channel.queue_declare(name, durable=True)
    yield name, channel
    conn.channel().queue_delete(name)


def publish(api, exchange: str, routing_key: str, payload: str = "hello", encoding: str = "string",
            properties: dict | None = None, vhost: str = "/"):
    return api.post("/api/exchanges/%s/%s/publish" % (segment(vhost), segment(exchange)),
                    {"properties": properties or {}, "routing_key": routing_key, "payload": payload,
                     "payload_encoding": encoding})


def get(api, queue: str, count: int, ackmode: str = "ack_requeue_true", encoding: str = "auto", **extra):
    return api.post("/api/queues/%%2F/%s/get" % segment(queue),
                    {"count": count, "ackmode": ackmode, "encoding": encoding, **extra})


def test_publish_reports_routed_and_the_message_arrives_with_its_properties(api, queue):
    name, channel = queue
    reply = publish(api, "amq.default", name, properties={"delivery_mode": 2, "headers": {"h": 1},
                                                          "content_type": "text/plain", "type": "kind"})
    assert (reply.status, reply.body) == (200, {"routed": True})
    assert publish(api, "amq.default", unique("nowhere")).body == {"routed": False}
    reply = publish(api, "amq.direct", name, payload=base64.b64encode(b"\x00\xffbin").decode(), encoding="base64")
    assert reply.body == {"routed": False}  # amq.direct has no binding to the queue
    channel.queue_bind(name, "amq.direct", name)
    assert publish(api, "amq.direct", name, payload=base64.b64encode(b"\x00\xffbin").decode(),
                   encoding="base64").body == {"routed": True}
    (first, props, body), (second, _props2, body2) = drain(channel, name)
    assert (first.exchange, first.routing_key, body) == ("", name, b"hello")
    assert (props.delivery_mode, props.headers, props.content_type, props.type) == (2, {"h": 1}, "text/plain",
                                                                                     "kind")
    assert (second.exchange, body2) == ("amq.direct", b"\x00\xffbin")


def test_publish_errors(api, queue):
    name, _channel = queue
    reply = api.post("/api/exchanges/%2F/amq.default/publish", {"routing_key": name})
    assert (reply.status, reply.body) == (400, {
        "error": "bad_request", "reason": "[{key_missing,properties},{key_missing,payload},"
                                          "{key_missing,payload_encoding}]"})
    missing = unique("x")
    reply = publish(api, missing, "k")
    assert (reply.status, reply.body) == (400, {
        "error": "bad_request", "reason": "404 NOT_FOUND - no exchange '%s' in vhost '/'" % missing})
    assert publish(api, "amq.default", name, properties={"nonsense": 1}).status == 400


def test_get_requeue_and_ack_modes(api, queue):
    name, channel = queue
    publish_n(channel, name, 3)
    got = get(api, name, 2).body
    assert [(m["payload"], m["payload_encoding"], m["redelivered"], m["message_count"]) for m in got] == [
        ("m0", "string", False, 2), ("m1", "string", False, 1)]
    assert got[0]["payload_bytes"] == 2 and got[0]["properties"] == []
    assert ready(channel, name) == 3
    got = get(api, name, 5, ackmode="ack_requeue_false").body
    assert [(m["payload"], m["redelivered"]) for m in got] == [("m0", True), ("m1", True), ("m2", False)]
    assert ready(channel, name) == 0
    assert get(api, name, 1).body == []


def test_get_encodings_and_truncation(api, queue):
    name, channel = queue
    channel.basic_publish("", name, b"\xff\xfe binary")
    channel.basic_publish("", name, b"a long text payload")
    got = get(api, name, 2, truncate=6).body
    assert got[0]["payload_encoding"] == "base64"
    assert base64.b64decode(got[0]["payload"]) == b"\xff\xfe bin"
    assert (got[1]["payload"], got[1]["payload_bytes"]) == ("a long", 19)
    got = get(api, name, 1, encoding="base64").body
    assert base64.b64decode(got[0]["payload"]) == b"\xff\xfe binary"


def test_get_errors(api, queue):
    name, _channel = queue
    reply = api.post("/api/queues/%%2F/%s/get" % name, {"count": 5})
    assert (reply.status, reply.body) == (400, {"error": "bad_request",
                                                "reason": "[{key_missing,ackmode},{key_missing,encoding}]"})
    missing = unique("q")
    reply = get(api, missing, 1)
    assert (reply.status, reply.body) == (404, {"error": "not_found",
                                                "reason": "NOT_FOUND - no queue '%s' in vhost '/'" % missing})
    assert get(api, name, 1, ackmode="sometimes").status == 400


def test_purge(api, queue):
    name, channel = queue
    publish_n(channel, name, 4)
    assert api.delete("/api/queues/%%2F/%s/contents" % name).status == 204
    assert ready(channel, name) == 0
    assert api.delete("/api/queues/%%2F/%s/contents" % unique("q")).status == 404


def test_get_reaches_messages_paged_to_disk(start_broker):
    """A queue whose messages live on disk (delta) still answers get."""
    broker = start_broker("--storage-vm-memory-high-watermark-absolute", "1000000",
                          "--storage-paging-ratio", "0.1", expect=("AMQP", "HTTP"))
    api = Api(broker.ports["HTTP"])
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = confirm_channel(connection)
    channel.queue_declare("paged", durable=True)
    for i in range(600):  # more than a queue keeps in RAM at its head
        channel.basic_publish("", "paged", b"%04d" % i + b"x" * 2000, pika.BasicProperties(delivery_mode=2))
    shown = api.get("/api/queues/%2F/paged").body
    assert shown["messages_ready"] == 600 and shown["message_states"]["delta"] > 0
    got = get(api, "paged", 600, ackmode="ack_requeue_false", truncate=4).body
    assert [m["payload"] for m in got] == ["%04d" % i for i in range(600)]
    connection.close()


def test_health_checks(api, broker):
    for path in ("/api/health/checks/alarms", "/api/health/checks/local-alarms",
                 "/api/health/checks/virtual-hosts", "/api/health/checks/certificate-expiration/1/months"):
        assert api.get(path).body == {"status": "ok"}, path
    assert api.get("/api/health/checks/node-is-quorum-critical").body == {"status": "ok",
                                                                          "reason": "single node cluster"}
    assert api.get("/api/health/checks/port-listener/%d" % broker.port).body == {"status": "ok",
                                                                                 "port": broker.port}
    reply = api.get("/api/health/checks/port-listener/1")
    assert reply.status == 503
    assert (reply.body["status"], reply.body["reason"], reply.body["missing"]) == ("failed", "No active listener", 1)
    assert broker.port in reply.body["ports"] and broker.ports["HTTP"] in reply.body["ports"]
    assert api.get("/api/health/checks/protocol-listener/amqp").body == {"status": "ok", "protocol": "amqp"}
    assert api.get("/api/health/checks/protocol-listener/mqtt").status == 503


def test_aliveness_test(api):
    vhost = unique("alive")
    api.put("/api/vhosts/" + vhost)
    api.put("/api/permissions/%s/guest" % vhost, {"configure": ".*", "write": ".*", "read": ".*"})
    assert api.get("/api/aliveness-test/" + vhost).body == {"status": "ok"}
    assert api.get("/api/queues/%s/aliveness-test" % vhost).body["messages"] == 0
    api.delete("/api/vhosts/" + vhost)
    reply = api.get("/api/aliveness-test/" + vhost)
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
