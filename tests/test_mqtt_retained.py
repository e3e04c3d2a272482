"""MQTT retained messages: kept per vhost, given to new subscriptions (exact
and wildcard filters), cleared by an empty payload, kept across restarts."""
from __future__ import annotations

import pytest

from helpers import unique
from conftest import ALL_PERMISSIONS
from http_api import Api
from mqtt_raw import DISCONNECT, PINGREQ, RawMQTT, parse_publish, publish_packet, subscribe_packet, until_ping


@pytest.fixture
def mqtt_port(broker) -> int:
    return broker.ports["MQTT"]


def retain(port: int, topic: str, payload: bytes, qos: int = 1, **login) -> None:
    with RawMQTT(port) as raw:
        raw.connect(unique("keeper"), **login)
        raw.send(publish_packet(topic, payload, qos=qos, pid=1, retain=True))
        if qos:
            assert raw.read() == (4, 0, b"\x00\x01")  # PUBACK once stored
        raw.send(DISCONNECT)
        assert raw.closed_by_server()


def retained_for(port: int, topic_filter: str, qos: int = 1, **login) -> list[tuple]:
    """What a new subscription gets at once: (topic, qos, retain, payload), up
    to the PINGRESP that follows it."""
    with RawMQTT(port) as raw:
        raw.connect(unique("late"), **login)
        raw.send(subscribe_packet(1, (topic_filter, qos)))
        assert raw.read()[0] == 9
        return [(topic, qos, retained, payload) for topic, qos, retained, _dup, payload in until_ping(raw)]


def test_a_new_subscription_gets_the_retained_message(mqtt_port):
    topic = unique("r") + "/state"
    retain(mqtt_port, topic, b"first")
    retain(mqtt_port, topic, b"last")
    assert retained_for(mqtt_port, topic) == [(topic, 1, True, b"last")]


def test_wildcard_subscriptions_get_retained_messages_too(mqtt_port):
    root = unique("w")
    retain(mqtt_port, root + "/a/temp", b"1", qos=0)
    retain(mqtt_port, root + "/b/temp", b"2")
    assert sorted(retained_for(mqtt_port, root + "/+/temp")) == [
        (root + "/a/temp", 0, True, b"1"), (root + "/b/temp", 1, True, b"2")]
    assert retained_for(mqtt_port, root + "/#", qos=0) == [
        (root + "/a/temp", 0, True, b"1"), (root + "/b/temp", 0, True, b"2")]


def test_an_empty_retained_payload_clears_the_topic(mqtt_port):
    topic = unique("c")
    retain(mqtt_port, topic, b"there")
    retain(mqtt_port, topic, b"")
    assert retained_for(mqtt_port, topic) == []


def test_live_subscribers_get_retained_publishes_without_the_retain_flag(mqtt_port):
    topic = unique("live")
    with RawMQTT(mqtt_port) as sub:
        sub.connect(unique("s"))
        sub.send(subscribe_packet(1, (topic, 0)))
        sub.read()
        retain(mqtt_port, topic, b"now", qos=0)
        kind, flags, body = sub.read()
        assert parse_publish(flags, body)[3:] == (False, False, b"now")


def test_retained_messages_survive_a_restart(start_broker):
    first = start_broker(expect=("AMQP", "MQTT"))
    topic = unique("durable")
    retain(first.ports["MQTT"], topic, b"kept")
    first.stop()
    second = start_broker("--data-dir", str(first.data_dir), expect=("AMQP", "MQTT"))
    assert retained_for(second.ports["MQTT"], topic) == [(topic, 1, True, b"kept")]


def test_retained_messages_are_per_vhost(mqtt_port, api):
    vhost = unique("rv")
    assert api.put("/api/vhosts/" + vhost).status == 201
    assert api.put("/api/permissions/%s/guest" % vhost, {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    try:
        topic = unique("pv")
        retain(mqtt_port, topic, b"in /")
        with RawMQTT(mqtt_port) as raw:
            raw.connect(unique("v"), username="%s:guest" % vhost, password="guest")
            raw.send(subscribe_packet(1, (topic, 1)))
            assert raw.read()[0] == 9
            raw.send(PINGREQ)
            assert raw.read() == (13, 0, b"")
    finally:
        api.delete("/api/vhosts/" + vhost)


def test_deleting_a_vhost_deletes_its_retained_messages(start_broker):
    """A vhost created again with the same name starts with none, before and
    after a restart."""
    broker = start_broker(expect=("AMQP", "MQTT", "HTTP"))
    data_dir = str(broker.data_dir)
    api, vhost, topic = Api(broker.ports["HTTP"]), unique("gone"), unique("rt")
    login = {"username": "%s:guest" % vhost, "password": "guest"}

    def create() -> None:
        assert api.put("/api/vhosts/" + vhost).status == 201
        assert api.put("/api/permissions/%s/guest" % vhost, ALL_PERMISSIONS).status == 204  # the creator has them

    create()
    retain(broker.ports["MQTT"], topic, b"old", **login)
    assert retained_for(broker.ports["MQTT"], topic, **login) == [(topic, 1, True, b"old")]
    assert api.delete("/api/vhosts/" + vhost).status == 204
    create()
    assert retained_for(broker.ports["MQTT"], topic, **login) == []
    broker.stop()
    broker = start_broker("--data-dir", data_dir, expect=("AMQP", "MQTT", "HTTP"))
    assert retained_for(broker.ports["MQTT"], topic, **login) == []
