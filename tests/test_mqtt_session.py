"""MQTT session life: wills, client-id takeover, keepalive, permissions, and
MQTT connections in the management API and metrics."""
from __future__ import annotations

import pytest

from helpers import unique, wait_for
from http_api import segment
from mqtt_raw import DISCONNECT, PINGREQ, RawMQTT, parse_publish, publish_packet, subscribe_packet
from test_management_metrics import scrape


@pytest.fixture
def mqtt_port(broker) -> int:
    return broker.ports["MQTT"]


def subscribed(port: int, topic: str) -> RawMQTT:
    raw = RawMQTT(port)
    raw.connect(unique("watch"))
    raw.send(subscribe_packet(1, (topic, 0)))
    assert raw.read()[0] == 9
    return raw


def next_publish(raw: RawMQTT) -> tuple:
    kind, flags, body = raw.read()
    assert kind == 3
    return parse_publish(flags, body)


def test_will_is_published_when_the_socket_drops(mqtt_port):
    topic = unique("will")
    with subscribed(mqtt_port, topic) as watcher:
        dying = RawMQTT(mqtt_port)
        dying.connect(unique("dying"), will=(topic, b"gone", 0, False))
        dying.sock.close()
        assert next_publish(watcher)[5] == b"gone"


def test_no_will_after_disconnect(mqtt_port):
    topic = unique("will")
    with subscribed(mqtt_port, topic) as watcher:
        with RawMQTT(mqtt_port) as leaving:
            leaving.connect(unique("polite"), will=(topic, b"gone", 0, False))
            leaving.send(DISCONNECT)
            assert leaving.closed_by_server()
        with RawMQTT(mqtt_port) as other:
            other.connect(unique("marker"))
            other.send(publish_packet(topic, b"marker"))
        assert next_publish(watcher)[5] == b"marker"


def test_keepalive_expiry_closes_the_connection_and_publishes_the_will(mqtt_port):
    topic = unique("will")
    with subscribed(mqtt_port, topic) as watcher, RawMQTT(mqtt_port, timeout=10) as silent:
        silent.connect(unique("silent"), keepalive=1, will=(topic, b"timed out", 0, False))
        assert silent.closed_by_server()
        assert next_publish(watcher)[5] == b"timed out"


def test_a_client_that_pings_stays_connected(mqtt_port):
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("pinger"), keepalive=1)
        for _ in range(4):  # 4 round trips of at most a second each outlive 1.5 s
            raw.send(PINGREQ)
            assert raw.read() == (13, 0, b"")


def test_a_second_connect_with_the_client_id_takes_over(mqtt_port):
    cid, topic = unique("dup"), unique("t")
    with RawMQTT(mqtt_port) as first, RawMQTT(mqtt_port) as second:
        first.connect(cid, clean=False)
        first.send(subscribe_packet(1, (topic, 1)))
        first.read()
        assert second.connect(cid, clean=False) == b"\x01\x00"
        assert first.closed_by_server()
        second.send(publish_packet(topic, b"to the new owner", qos=1, pid=5))
        got = [second.read(), second.read()]
        assert (4, 0, b"\x00\x05") in got
        publish = next(p for p in got if p[0] == 3)
        assert parse_publish(publish[1], publish[2])[5] == b"to the new owner"
        second.send(DISCONNECT)
    with RawMQTT(mqtt_port) as cleanup:
        cleanup.connect(cid, clean=True)


# -- permissions ---------------------------------------------------------------


@pytest.fixture
def limited_user(api):
    user = unique("mu")
    assert api.put("/api/users/" + user, {"password": "pw", "tags": ""}).status == 201
    yield user
    api.delete("/api/users/" + user)


def grant(api, user, configure=".*", write=".*", read=".*"):
    assert api.put("/api/permissions/%2F/" + user,
                   {"configure": configure, "write": write, "read": read}).status in (201, 204)


def test_publish_without_write_on_amq_topic_closes_the_connection(mqtt_port, api, limited_user):
    grant(api, limited_user, write="^mqtt-subscription-.*")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("w"), username=limited_user, password="pw")
        raw.send(publish_packet("x/y", b"denied", qos=1, pid=1))
        assert raw.closed_by_server()


def test_topic_permission_limits_publish_routing_keys(mqtt_port, api, limited_user, broker):
    grant(api, limited_user)
    assert api.put("/api/topic-permissions/%2F/" + limited_user,
                   {"exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"}).status in (201, 204)
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("tp"), username=limited_user, password="pw")
        raw.send(publish_packet("allowed/x", b"ok", qos=1, pid=1))
        assert raw.read() == (4, 0, b"\x00\x01")
        raw.send(publish_packet("forbidden/x", b"no", qos=1, pid=2))
        assert raw.closed_by_server()


def test_subscribe_without_read_on_amq_topic_is_refused_per_filter(mqtt_port, api, limited_user):
    grant(api, limited_user, read="^mqtt-subscription-.*")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("r"), username=limited_user, password="pw")
        raw.send(subscribe_packet(3, ("a/b", 1)))
        assert raw.read() == (9, 0, b"\x00\x03\x80")
        raw.send(PINGREQ)  # still connected
        assert raw.read() == (13, 0, b"")


def test_subscribe_without_configure_on_the_queue_is_refused(mqtt_port, api, limited_user):
    grant(api, limited_user, configure="^nothing$")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(unique("c"), username=limited_user, password="pw")
        raw.send(subscribe_packet(4, ("a/b", 0)))
        assert raw.read() == (9, 0, b"\x00\x04\x80")


# -- management API and metrics -------------------------------------------------


def test_mqtt_connections_are_listed_closed_and_counted(mqtt_port, api, broker):
    cid = unique("listed")
    with RawMQTT(mqtt_port) as raw:
        raw.connect(cid)
        rows = wait_for(lambda: [c for c in api.get("/api/connections").body
                                 if c["client_properties"].get("client_id") == cid])
        row = rows[0]
        assert (row["protocol"], row["user"], row["vhost"]) == ("MQTT 3.1.1", "guest", "/")
        assert row["recv_oct"] > 0
        assert api.delete("/api/connections/" + segment(row["name"])).status == 204
        assert raw.closed_by_server()
    wait_for(lambda: not [c for c in api.get("/api/connections").body
                          if c["client_properties"].get("client_id") == cid])


def test_mqtt_3_1_connections_say_so(mqtt_port, api):
    cid = unique("old")
    with RawMQTT(mqtt_port) as raw:
        assert raw.connect(cid, name="MQIsdp", level=3) == b"\x00\x00"
        rows = wait_for(lambda: [c for c in api.get("/api/connections").body
                                 if c["client_properties"].get("client_id") == cid])
        assert rows[0]["protocol"] == "MQTT 3.1"


def test_mqtt_connections_and_consumers_are_in_the_metrics(start_broker):
    broker = start_broker(expect=("AMQP", "MQTT", "PROMETHEUS"))
    with RawMQTT(broker.ports["MQTT"]) as raw:
        raw.connect(unique("m"))
        raw.send(subscribe_packet(1, ("a/b", 1)))
        raw.read()
        _types, samples = scrape(broker)
        assert (samples["rabbitmq_connections"], samples["rabbitmq_consumers"], samples["rabbitmq_queues"]) == (1, 1, 1)


def test_mqtt_can_be_disabled(start_broker):
    broker = start_broker("--mqtt-enabled", "false", expect=("AMQP", "HTTP"))
    assert "MQTT" not in broker.ports and "listening for MQTT" not in broker.log


def test_the_user_connection_limit_counts_mqtt_connections(mqtt_port, api, limited_user):
    grant(api, limited_user)
    assert api.put("/api/user-limits/%s/max-connections" % limited_user, {"value": 1}).status == 204
    with RawMQTT(mqtt_port) as first, RawMQTT(mqtt_port) as second:
        assert first.connect(unique("l1"), username=limited_user, password="pw") == b"\x00\x00"
        assert second.connect(unique("l2"), username=limited_user, password="pw") == b"\x00\x05"


def test_deleting_the_vhost_closes_its_mqtt_connections(mqtt_port, api):
    vhost = unique("gone")
    assert api.put("/api/vhosts/" + vhost).status == 201
    assert api.put("/api/permissions/%s/guest" % vhost, {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    with RawMQTT(mqtt_port) as raw:
        assert raw.connect(unique("v"), username=vhost + ":guest", password="guest") == b"\x00\x00"
        raw.send(subscribe_packet(1, ("a/b", 1)))
        raw.read()
        assert api.delete("/api/vhosts/" + vhost).status == 204
        assert raw.closed_by_server()
