"""Memory and disk alarms (docs/resilience.md): a publishing connection is
blocked (connection.blocked with RabbitMQ's reason), consumers keep
consuming, the alarm shows in /api/nodes, the alarms health check and
Prometheus, and clears by itself when the limit is set back, unblocking the
publisher (connection.unblocked) whose message then arrives."""
from __future__ import annotations

import json
import shutil
import urllib.request

import pika
import pytest

from helpers import confirm_channel, connect, pump, unique, wait_for
from http_api import call
from hutchctl_targets import Target
from mqtt_raw import RawMQTT, publish_packet

FULL = ("AMQP", "HTTP", "PROMETHEUS")


def node(broker) -> dict:
    return call(broker.ports["HTTP"], "GET", "/api/nodes").body[0]


def connection_states(broker) -> dict:
    """client connection_name -> RabbitMQ state, from /api/connections."""
    rows = call(broker.ports["HTTP"], "GET", "/api/connections").body
    return {row["client_properties"].get("connection_name"): row["state"] for row in rows}


def metric(broker, name: str) -> str:
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % broker.ports["PROMETHEUS"], timeout=30) as reply:
        text = reply.read().decode()
    return next(line.split()[1] for line in text.splitlines() if line.startswith(name + " "))


def named(broker, name: str) -> pika.BlockingConnection:
    return connect(broker.port, client_properties={"connection_name": name})


class Notices:
    """connection.blocked / connection.unblocked as a pika client sees them."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self.seen: list = []
        connection.add_on_connection_blocked_callback(lambda _c, frame: self.seen.append(frame.method))
        connection.add_on_connection_unblocked_callback(lambda _c, frame: self.seen.append(frame.method))


def test_memory_alarm_blocks_publishers_and_lets_consumers_consume(start_broker):
    broker = start_broker(expect=FULL)
    http = broker.ports["HTTP"]
    publisher, consumer = named(broker, "publisher"), named(broker, "consumer")
    notices = Notices(publisher)
    pub = confirm_channel(publisher)
    queue = unique("alarm")
    pub.queue_declare(queue)
    for i in range(5):
        pub.basic_publish("", queue, b"before %d" % i)
    assert not node(broker)["mem_alarm"]
    assert call(http, "GET", "/api/health/checks/alarms").status == 200

    # A watermark below what any Python process uses raises the alarm.
    assert call(http, "PUT", "/api/hutch/vm-memory-high-watermark", {"value": "1000"}).status == 204
    info = node(broker)
    assert info["mem_alarm"] and not info["disk_free_alarm"] and info["mem_limit"] == 1000
    health = call(http, "GET", "/api/health/checks/alarms")
    assert health.status == 503 and health.body["alarms"] == [{"node": info["name"], "resource": "memory"}]
    assert metric(broker, "rabbitmq_alarms_memory_used_watermark") == "1"
    assert metric(broker, "rabbitmq_alarms_free_disk_space_watermark") == "0"
    assert connection_states(broker) == {"publisher": "blocking", "consumer": "blocking"}

    pub_plain = publisher.channel()
    pub_plain.basic_publish("", queue, b"during")
    pump(publisher, lambda: notices.seen)
    assert [type(m).__name__ for m in notices.seen] == ["Blocked"]
    assert notices.seen[0].reason == "low on memory"
    wait_for(lambda: connection_states(broker)["publisher"] == "blocked")
    assert connection_states(broker)["consumer"] == "blocking"

    # The consumer is not blocked: it gets everything published before.
    got = []
    consume = consumer.channel()
    consume.basic_consume(queue, lambda ch, method, props, body: got.append(body), auto_ack=True)
    pump(consumer, lambda: len(got) == 5)
    assert got == [b"before %d" % i for i in range(5)]

    # Set back: the alarm clears, the publisher is told and its message lands.
    assert call(http, "PUT", "/api/hutch/vm-memory-high-watermark", {"value": 0.4}).status == 204
    assert not node(broker)["mem_alarm"]
    assert call(http, "GET", "/api/health/checks/alarms").status == 200
    assert metric(broker, "rabbitmq_alarms_memory_used_watermark") == "0"
    pump(publisher, lambda: len(notices.seen) == 2)
    assert type(notices.seen[1]).__name__ == "Unblocked"
    pump(consumer, lambda: len(got) == 6)
    assert got[5] == b"during"
    assert connection_states(broker) == {"publisher": "running", "consumer": "running"}
    publisher.close()
    consumer.close()


def test_disk_alarm_from_the_start_and_cleared_at_runtime(start_broker, tmp_path):
    beyond = shutil.disk_usage(tmp_path).free * 2
    broker = start_broker("--storage-disk-free-limit", str(beyond), expect=FULL)
    http = broker.ports["HTTP"]
    info = node(broker)
    assert info["disk_free_alarm"] and not info["mem_alarm"] and info["disk_free_limit"] == beyond
    assert call(http, "GET", "/api/health/checks/local-alarms").body["alarms"][0]["resource"] == "disk"
    assert metric(broker, "rabbitmq_alarms_free_disk_space_watermark") == "1"
    assert "disk resource limit alarm set" in broker.log

    publisher = named(broker, "publisher")
    notices = Notices(publisher)
    channel = publisher.channel()
    queue = channel.queue_declare(unique("disk")).method.queue
    channel.basic_publish("", queue, b"held")
    pump(publisher, lambda: notices.seen)
    assert notices.seen[0].reason == "low on disk"

    hutchctl = Target("hutch", "http://127.0.0.1:%d" % http, broker.url)
    assert json.loads(hutchctl.ok("status", "--formatter", "json"))["alarms"] == ["disk"]
    hutchctl.ok("set_disk_free_limit", "1MB")
    assert json.loads(hutchctl.ok("status", "--formatter", "json"))["alarms"] == []
    info = node(broker)
    assert not info["disk_free_alarm"] and info["disk_free_limit"] == 1000000
    pump(publisher, lambda: len(notices.seen) == 2)
    wait_for(lambda: call(http, "GET", "/api/queues/%2F/" + queue).body.get("messages") == 1)
    publisher.close()


def test_blocked_client_without_the_capability_is_paused_not_told(start_broker, tmp_path):
    """A client that does not advertise connection.blocked gets no notice
    (it would not understand it); its publish waits for the alarm to clear."""
    beyond = shutil.disk_usage(tmp_path).free * 2
    broker = start_broker("--storage-disk-free-limit", str(beyond), expect=FULL)
    http = broker.ports["HTTP"]
    params = pika.ConnectionParameters("127.0.0.1", broker.port,
                                       client_properties={"connection_name": "old",
                                                          "capabilities": {"connection.blocked": False}})
    old = pika.BlockingConnection(params)
    notices = Notices(old)
    channel = old.channel()
    queue = channel.queue_declare(unique("old")).method.queue
    channel.basic_publish("", queue, b"held")
    wait_for(lambda: connection_states(broker)["old"] == "blocked")
    assert call(http, "GET", "/api/queues/%2F/" + queue).body.get("messages") == 0
    assert call(http, "PUT", "/api/hutch/disk-free-limit", {"mem_relative": 0.0}).status == 204
    wait_for(lambda: call(http, "GET", "/api/queues/%2F/" + queue).body.get("messages") == 1)
    old.process_data_events(time_limit=0)
    assert notices.seen == []
    old.close()


def test_limits_are_validated(start_broker):
    broker = start_broker(expect=FULL)
    http = broker.ports["HTTP"]
    for body in ({"value": "50 parsecs"}, {"value": -1}, {"value": True}, {"mem_relative": "x"}, {}):
        assert call(http, "PUT", "/api/hutch/disk-free-limit", body).status == 400, body
    assert node(broker)["disk_free_limit"] == 50000000


def test_an_mqtt_publisher_is_paused_by_an_alarm_too(start_broker, tmp_path):
    """MQTT has no blocked notification: the broker stops reading the client
    after the publish that met the alarm, and carries on once it clears."""
    beyond = shutil.disk_usage(tmp_path).free * 2
    broker = start_broker("--storage-disk-free-limit", str(beyond), expect=FULL + ("MQTT",))
    with RawMQTT(broker.ports["MQTT"], timeout=1.0) as raw:
        raw.connect(unique("alarmed"))
        raw.send(publish_packet("t", b"first", qos=1, pid=1))
        assert raw.read() == (4, 0, b"\x00\x01")
        raw.send(publish_packet("t", b"second", qos=1, pid=2))
        with pytest.raises(TimeoutError):
            raw.read()  # not read: no PUBACK while the alarm lasts
        assert connection_states(broker) == {None: "blocked"}
        call(broker.ports["HTTP"], "PUT", "/api/hutch/disk-free-limit", {"value": 1000000})
        raw.sock.settimeout(10)
        assert raw.read() == (4, 0, b"\x00\x02")
