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
    # names RabbitMQ does not know are ignored, wrong types refused in its words
    assert publish(api, "amq.default", name, properties={"nonsense": 1}).body == {"routed": True}
    reply = publish(api, "amq.default", name, properties={"delivery_mode": "x"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": ["not_int", "delivery_mode"]})
    reply = publish(api, "amq.default", name, encoding="zzz")
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": ["unsupported_encoding", "zzz"]})
    # the checks basic.publish makes, answered as RabbitMQ's channel close
    reply = publish(api, "amq.default", name, properties={"user_id": "bob"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "406 PRECONDITION_FAILED - "
                                                "user_id property set to 'bob' but authenticated user was 'guest'"})
    reply = publish(api, "amq.default", name, properties={"expiration": "abc"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request",
                                                "reason": "406 PRECONDITION_FAILED - invalid expiration 'abc': "
                                                          "no_integer"})


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


def test_exclusive_queues_of_other_connections_are_locked(api, conn):
    name = conn.channel().queue_declare(unique("excl"), exclusive=True).method.queue
    locked = ("cannot obtain exclusive access to locked queue '%s' in vhost '/'. It could be originally declared "
              "on another connection or the exclusive property value does not match that of the original "
              "declaration." % name)
    reply = get(api, name, 1)
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "405 RESOURCE_LOCKED - " + locked})
    for reply in (api.delete("/api/queues/%%2F/%s/contents" % name), api.delete("/api/queues/%%2F/%s" % name),
                  api.put("/api/queues/%%2F/%s" % name, {})):
        assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": locked})
    assert api.get("/api/queues/%%2F/%s" % name).body["exclusive"] is True


def test_purge(api, queue):
    name, channel = queue
    publish_n(channel, name, 4)
    assert api.delete("/api/queues/%%2F/%s/contents" % name).status == 204
    assert ready(channel, name) == 0
    assert api.delete("/api/queues/%%2F/%s/contents" % unique("q")).status == 404


def test_get_reaches_messages_paged_to_disk(start_broker):
    """A queue whose messages live on disk (delta) still answers get."""
    # A 100 kB paging budget under a watermark the process stays below (a
    # watermark under its memory would raise the memory alarm and block publishing).
    broker = start_broker("--storage-vm-memory-high-watermark-absolute", "1000000000",
                          "--storage-paging-ratio", "0.0001", expect=("AMQP", "HTTP"))
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
    assert api.get("/api/health/checks/protocol-listener/mqtt").body == {"status": "ok", "protocol": "mqtt"}
    assert api.get("/api/health/checks/protocol-listener/stomp").status == 503


def test_aliveness_test(api):
    vhost = unique("alive")
    api.put("/api/vhosts/" + vhost)
    api.put("/api/permissions/%s/guest" % vhost, {"configure": ".*", "write": ".*", "read": ".*"})
    assert api.get("/api/aliveness-test/" + vhost).body == {"status": "ok"}
    assert api.get("/api/queues/%s/aliveness-test" % vhost).body["messages"] == 0
    api.delete("/api/vhosts/" + vhost)
    reply = api.get("/api/aliveness-test/" + vhost)
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_memory_watermark_extension_changes_the_paging_budget(start_broker):
    broker = start_broker("--storage-paging-ratio", "0.0005", expect=("AMQP", "HTTP", "PROMETHEUS"))
    api = Api(broker.ports["HTTP"])
    path = "/api/hutch/vm-memory-high-watermark"
    assert api.put(path, {"value": "2GB"}).status == 204
    (node,) = api.get("/api/nodes").body
    assert node["mem_limit"] == 2000000000 and not node["mem_alarm"]
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = confirm_channel(connection)
    channel.queue_declare("budget", durable=True)
    for _ in range(600):  # 1.2 MB: over the 1 MB paging budget (the watermark x 0.0005)
        channel.basic_publish("", "budget", b"x" * 2000, pika.BasicProperties(delivery_mode=2))
    assert api.get("/api/queues/%2F/budget").body["message_states"]["delta"] > 0
    assert api.put(path, {"value": 0.4}).status == 204
    assert api.get("/api/nodes").body[0]["mem_limit"] != 2000000000
    for bad in ({"value": "2 parsecs"}, {"value": 1.5}, {}):
        assert api.put(path, bad).status == 400
    assert Api(broker.ports["HTTP"], ("nobody", "x")).put(path, {"value": 0.4}).status == 401
    connection.close()


def test_vhost_put_turns_tracing_on_and_off_and_absent_leaves_it(api):
    vhost = unique("trace")
    assert api.put("/api/vhosts/" + vhost, {"tracing": True}).status == 201
    assert api.get("/api/vhosts/" + vhost).body["tracing"] is True
    assert api.put("/api/vhosts/" + vhost, {"description": "d"}).status == 204
    assert api.get("/api/vhosts/" + vhost).body["tracing"] is True
    assert api.put("/api/vhosts/" + vhost, {"tracing": False}).status == 204
    assert api.get("/api/vhosts/" + vhost).body["tracing"] is False
    assert api.put("/api/vhosts/" + vhost, {"tracing": "maybe"}).status == 400
    api.delete("/api/vhosts/" + vhost)
