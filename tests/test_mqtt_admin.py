"""MQTT sessions for administrators: hutch's `/api/hutch/mqtt/sessions`
endpoints, `hutchctl list_mqtt_sessions`, MQTT connections in `hutchctl
list_connections`, and the `hutch_mqtt_*` metrics, observed with raw MQTT
clients (and paho) against real brokers."""
from __future__ import annotations

import json
import struct

import paho.mqtt.client as paho
import pytest

from conftest import ALL_PERMISSIONS
from helpers import unique, wait_for
from http_api import Api, segment
from hutchctl_targets import hutchctl, rabbitmq_target
from mqtt_raw import DISCONNECT, PINGREQ, RawMQTT, packet, parse_publish, publish_packet, subscribe_packet
from test_management_metrics import scrape

EVERY_PORT = ("AMQP", "MQTT", "HTTP", "PROMETHEUS")


def pubrec(pid: int) -> bytes:
    return packet(0x50, struct.pack(">H", pid))


def pubcomp(pid: int) -> bytes:
    return packet(0x70, struct.pack(">H", pid))


def sessions_path(vhost: str | None = None, client_id: str | None = None) -> str:
    parts = ["/api/hutch/mqtt/sessions"] + [segment(p) for p in (vhost, client_id) if p is not None]
    return "/".join(parts)


def listed(api: Api, vhost: str) -> dict:
    """client id -> session row of the vhost's listing."""
    reply = api.get(sessions_path(vhost))
    assert reply.status == 200, reply
    return {row["client_id"]: row for row in reply.body}


def mqtt(port: int, vhost: str, client_id: str, clean: bool = True, user: str = "guest",
         password: str = "guest") -> RawMQTT:
    raw = RawMQTT(port)
    assert raw.connect(client_id, clean=clean, username="%s:%s" % (vhost, user), password=password)[1] == 0
    return raw


def subscribe(raw: RawMQTT, *filters: tuple[str, int]) -> None:
    raw.send(subscribe_packet(1, *filters))
    kind, _flags, body = raw.read()
    assert kind == 9 and body[2:] == bytes(qos for _f, qos in filters)


def disconnect(raw: RawMQTT) -> None:
    raw.send(DISCONNECT)
    assert raw.closed_by_server()
    raw.sock.close()


def publish_qos1(port: int, vhost: str, topic: str, count: int) -> None:
    with mqtt(port, vhost, unique("pub")) as pub:
        for pid in range(1, count + 1):
            pub.send(publish_packet(topic, b"m%d" % pid, qos=1, pid=pid))
            assert pub.read() == (4, 0, struct.pack(">H", pid))


@pytest.fixture
def mqtt_port(broker) -> int:
    return broker.ports["MQTT"]


@pytest.fixture
def http_url(broker) -> str:
    return "http://127.0.0.1:%d" % broker.ports["HTTP"]


# -- the API -----------------------------------------------------------------------


def test_a_persistent_session_is_listed_connected_and_disconnected(mqtt_port, api, vhost):
    cid, room = unique("dev"), unique("room")
    raw = mqtt(mqtt_port, vhost, cid, clean=False)
    subscribe(raw, (room + "/+/temp", 1), (room + "/#", 0))
    row = wait_for(lambda: listed(api, vhost).get(cid))
    assert (row["vhost"], row["connected"], row["clean_session"], row["user"], row["protocol"]) == \
        (vhost, True, False, "guest", "MQTT 3.1.1")
    assert row["connection"] in [c["name"] for c in api.get("/api/connections").body]
    assert row["subscriptions"] == [{"topic_filter": room + "/#", "qos": 0},
                                    {"topic_filter": room + "/+/temp", "qos": 1}]
    assert [(q["name"], q["qos"], q["durable"], q["consumers"]) for q in row["queues"]] == [
        ("mqtt-subscription-%sqos0" % cid, 0, True, 1), ("mqtt-subscription-%sqos1" % cid, 1, True, 1)]
    assert row["qos2"] == {"received": 0, "sent": 0, "released": 0}
    disconnect(raw)
    publish_qos1(mqtt_port, vhost, room + "/kitchen/temp", 3)
    row = wait_for(lambda: (lambda r: r if r["messages"] == 6 else None)(listed(api, vhost)[cid]))
    assert (row["connected"], row["clean_session"], row["connection"], row["user"]) == (False, False, None, None)
    assert [(q["qos"], q["messages_ready"], q["messages_unacknowledged"], q["consumers"]) for q in row["queues"]] \
        == [(0, 3, 0, 0), (1, 3, 0, 0)]
    assert api.get(sessions_path(vhost, cid)).body == row
    assert [r["client_id"] for r in api.get(sessions_path()).body if r["vhost"] == vhost] == [cid]


def test_unacknowledged_deliveries_count_while_connected(mqtt_port, api, vhost, broker):
    """In the session, and in the queue's API object and metrics as for AMQP consumers."""
    cid, topic = unique("slow"), unique("t")
    queue = "mqtt-subscription-%sqos1" % cid
    with mqtt(mqtt_port, vhost, cid, clean=False) as raw:
        subscribe(raw, (topic, 1))
        publish_qos1(mqtt_port, vhost, topic, 2)
        for _ in range(2):
            assert raw.read()[0] == 3  # PUBLISH, not acknowledged
        row = listed(api, vhost)[cid]
        assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"]) == (2, 0, 2)
        q = api.get("/api/queues/%s/%s" % (segment(vhost), queue)).body
        assert (q["messages"], q["messages_unacknowledged"]) == (2, 2)
        samples = scrape(broker, "/metrics/per-object")[1]
        assert samples['rabbitmq_queue_messages_unacked{vhost="%s",queue="%s"}' % (vhost, queue)] == 2
        disconnect(raw)
    row = wait_for(lambda: (lambda r: r if not r["connected"] else None)(listed(api, vhost)[cid]))
    assert (row["messages"], row["messages_ready"], row["messages_unacknowledged"]) == (2, 2, 0)


def test_a_clean_session_is_listed_only_while_connected(mqtt_port, api, vhost):
    cid = unique("clean")
    raw = mqtt(mqtt_port, vhost, cid)
    subscribe(raw, ("a/b", 1))
    row = listed(api, vhost)[cid]
    assert (row["connected"], row["clean_session"]) == (True, True)
    assert [(q["name"], q["durable"]) for q in row["queues"]] == [("mqtt-subscription-%sqos1" % cid, False)]
    disconnect(raw)
    wait_for(lambda: cid not in listed(api, vhost))
    assert api.get(sessions_path(vhost, cid)).status == 404


def test_a_paho_client_is_listed(mqtt_port, api, vhost):
    cid = unique("paho")
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=cid, clean_session=False)
    client.username_pw_set(vhost + ":guest", "guest")
    client.connect("127.0.0.1", mqtt_port)
    client.loop_start()
    try:
        client.subscribe("sensors/+", qos=1)
        row = wait_for(lambda: (lambda r: r if r and r["subscriptions"] else None)(listed(api, vhost).get(cid)))
        assert (row["connected"], row["clean_session"], row["subscriptions"]) == \
            (True, False, [{"topic_filter": "sensors/+", "qos": 1}])
    finally:
        client.disconnect()
        client.loop_stop()
    wait_for(lambda: not listed(api, vhost)[cid]["connected"])


def test_qos2_in_flight_counts(mqtt_port, api, vhost):
    cid, topic = unique("q2"), unique("t")
    with mqtt(mqtt_port, vhost, cid, clean=False) as raw:
        subscribe(raw, (topic, 2))
        raw.send(publish_packet(topic, b"in", qos=2, pid=7))  # no PUBREL: received stays
        got = {}
        while len(got) < 2:  # our PUBREC and the PUBLISH to our own subscription, either order
            kind, flags, body = raw.read()
            got[kind] = (flags, body)
        assert got[5] == (0, b"\x00\x07")
        out_pid = parse_publish(*got[3])[2]
        assert listed(api, vhost)[cid]["qos2"] == {"received": 1, "sent": 1, "released": 0}
        raw.send(pubrec(out_pid))
        assert raw.read() == (6, 2, struct.pack(">H", out_pid))  # PUBREL
        assert listed(api, vhost)[cid]["qos2"] == {"received": 1, "sent": 0, "released": 1}
        raw.send(pubcomp(out_pid))
        raw.send(PINGREQ)
        assert raw.read() == (13, 0, b"")
        assert listed(api, vhost)[cid]["qos2"] == {"received": 1, "sent": 0, "released": 0}


def test_a_persistent_session_survives_a_restart_still_listed(start_broker):
    first = start_broker(expect=EVERY_PORT)
    vhost, cid, kept_cid, topic = unique("vh"), unique("dev"), unique("q2only"), unique("t")
    api = Api(first.ports["HTTP"])
    assert api.put("/api/vhosts/" + vhost).status == 201
    assert api.put("/api/permissions/%s/guest" % vhost, ALL_PERMISSIONS).status == 204  # the creator has them
    with mqtt(first.ports["MQTT"], vhost, cid, clean=False) as raw:
        subscribe(raw, (topic, 1))
        disconnect(raw)
    publish_qos1(first.ports["MQTT"], vhost, topic, 2)
    # A session without subscriptions whose QoS 2 state is kept (a publish awaiting its PUBREL)
    with mqtt(first.ports["MQTT"], vhost, kept_cid, clean=False) as raw:
        raw.send(publish_packet(unique("nobody"), b"x", qos=2, pid=3))
        assert raw.read() == (5, 0, b"\x00\x03")
    first.stop()
    assert first.process.returncode == 0, first.log
    second = start_broker("--data-dir", str(first.data_dir), expect=EVERY_PORT)
    rows = listed(Api(second.ports["HTTP"]), vhost)
    assert sorted(rows) == sorted([cid, kept_cid])
    assert (rows[cid]["connected"], rows[cid]["clean_session"], rows[cid]["messages"]) == (False, False, 2)
    assert rows[cid]["subscriptions"] == [{"topic_filter": topic, "qos": 1}]
    assert (rows[kept_cid]["queues"], rows[kept_cid]["qos2"]) == ([], {"received": 1, "sent": 0, "released": 0})
    _types, samples = scrape(second)
    assert (samples["hutch_mqtt_sessions"], samples["hutch_mqtt_connections"]) == (2, 0)


def test_unknown_vhosts_and_sessions_are_404(api):
    missing = unique("nowhere")
    assert api.get(sessions_path(missing)).status == 404
    reply = api.get(sessions_path(missing, "c"))
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert api.get(sessions_path("/", unique("nobody"))).status == 404
    assert api.delete(sessions_path("/", unique("nobody"))).status == 404


@pytest.fixture
def user(api):
    """A user with the management tag and no permissions yet: (name, its Api)."""
    name = unique("mgr")
    assert api.put("/api/users/" + name, {"password": "pw", "tags": "management"}).status == 201
    yield name, api.as_user(name, "pw")
    api.delete("/api/users/" + name)


def test_management_users_see_the_sessions_of_their_vhosts_only(mqtt_port, api, vhost, user):
    name, as_user = user
    other = unique("other")
    assert api.put("/api/vhosts/" + other).status == 201
    try:
        assert api.put("/api/permissions/%s/guest" % other, ALL_PERMISSIONS).status == 204  # the creator has them
        assert api.put("/api/permissions/%s/%s" % (vhost, name), ALL_PERMISSIONS).status == 201
        mine, theirs = unique("mine"), unique("theirs")
        with mqtt(mqtt_port, vhost, mine), mqtt(mqtt_port, other, theirs):
            seen = {(r["vhost"], r["client_id"]) for r in as_user.get(sessions_path()).body}
            assert (vhost, mine) in seen and not {row for row in seen if row[0] != vhost}
            assert list(listed(as_user, vhost)) == [mine]
            refused = as_user.get(sessions_path(other))
            assert (refused.status, refused.body["error"]) == (401, "not_authorised")
            assert api.put("/api/users/" + name, {"password": "pw", "tags": "monitoring"}).status == 204
            assert {(other, theirs), (vhost, mine)} <= {(r["vhost"], r["client_id"])
                                                        for r in as_user.get(sessions_path()).body}
            # one vhost's listing needs a permission there or the administrator tag, as RabbitMQ's
            # /api/vhosts/{vhost}/connections does
            assert as_user.get(sessions_path(other)).status == 401
            assert api.put("/api/users/" + name, {"password": "pw", "tags": "administrator"}).status == 204
            assert list(listed(as_user, other)) == [theirs]
            assert api.put("/api/users/" + name, {"password": "pw", "tags": ""}).status == 204
            assert as_user.get(sessions_path()).status == 401
    finally:
        api.delete("/api/vhosts/" + other)


def test_ending_a_disconnected_session_deletes_its_queues_and_state(mqtt_port, api, vhost):
    cid, topic = unique("gone"), unique("t")
    with mqtt(mqtt_port, vhost, cid, clean=False) as raw:
        subscribe(raw, (topic, 1))
        disconnect(raw)
    queue = "/api/queues/%s/%s" % (segment(vhost), segment("mqtt-subscription-%sqos1" % cid))
    assert api.get(queue).status == 200
    assert api.delete(sessions_path(vhost, cid)).status == 204
    assert api.get(queue).status == 404 and cid not in listed(api, vhost)
    with RawMQTT(mqtt_port) as raw:  # no session present any more
        assert raw.connect(cid, clean=False, username=vhost + ":guest", password="guest") == b"\x00\x00"


def test_ending_a_connected_session_closes_its_connection(mqtt_port, api, vhost):
    cid, watch = unique("live"), unique("will")
    with mqtt(mqtt_port, vhost, unique("watcher")) as watcher:
        subscribe(watcher, (watch, 0))
        raw = RawMQTT(mqtt_port)
        raw.connect(cid, clean=False, username=vhost + ":guest", password="guest", will=(watch, b"bye", 0, False))
        subscribe(raw, ("x/y", 2))
        assert api.delete(sessions_path(vhost, cid)).status == 204
        assert raw.closed_by_server()
        raw.sock.close()
        kind, flags, body = watcher.read()
        assert kind == 3 and parse_publish(flags, body)[5] == b"bye"  # the will, as for any lost connection
    assert cid not in listed(api, vhost)
    assert api.get("/api/queues/%s/%s" % (segment(vhost), segment("mqtt-subscription-%sqos2" % cid))).status == 404


def test_ending_a_session_needs_its_connection_and_configure_on_its_queues(mqtt_port, api, vhost, user):
    name, as_user = user
    assert api.put("/api/permissions/%s/%s" % (vhost, name), ALL_PERMISSIONS).status == 201
    cid = unique("guests")
    with mqtt(mqtt_port, vhost, cid, clean=False) as raw:
        subscribe(raw, ("a", 1))
        assert as_user.delete(sessions_path(vhost, cid)).body == {"error": "not_authorised",
                                                                  "reason": "Not administrator user"}
        disconnect(raw)
    assert api.put("/api/permissions/%s/%s" % (vhost, name),
                   {"configure": "^nothing$", "write": ".*", "read": ".*"}).status == 204
    assert as_user.delete(sessions_path(vhost, cid)).status == 401
    assert listed(api, vhost)[cid]["queues"]
    assert api.put("/api/permissions/%s/%s" % (vhost, name), ALL_PERMISSIONS).status == 204
    assert as_user.delete(sessions_path(vhost, cid)).status == 204


# -- metrics -----------------------------------------------------------------------


def test_mqtt_connection_and_session_gauges(start_broker):
    broker = start_broker(expect=("AMQP", "MQTT", "PROMETHEUS"))
    port = broker.ports["MQTT"]

    def gauges():
        return scrape(broker)[1]["hutch_mqtt_connections"], scrape(broker)[1]["hutch_mqtt_sessions"]

    types, _samples = scrape(broker)
    assert types["hutch_mqtt_connections"] == types["hutch_mqtt_sessions"] == "gauge"
    assert gauges() == (0, 0)
    with RawMQTT(port) as clean:
        clean.connect(unique("c"))
        assert gauges() == (1, 0)
        persistent = RawMQTT(port)
        persistent.connect(unique("p"), clean=False)
        assert gauges() == (2, 1)
        disconnect(persistent)
        wait_for(lambda: gauges() == (1, 1))
    wait_for(lambda: gauges() == (0, 1))
    assert scrape(broker)[1]["rabbitmq_connections"] == 0


# -- hutchctl ----------------------------------------------------------------------


def test_list_mqtt_sessions_prints_a_table(mqtt_port, http_url, vhost):
    away, here, topic = unique("away"), unique("here"), unique("t")
    with mqtt(mqtt_port, vhost, away, clean=False) as raw:
        subscribe(raw, (topic, 1))
        disconnect(raw)
    publish_qos1(mqtt_port, vhost, topic, 2)
    with mqtt(mqtt_port, vhost, here):
        result = hutchctl("--url", http_url, "list_mqtt_sessions", "-p", vhost)
        assert result.returncode == 0, result.stderr
        banner, header, *rows = result.stdout.splitlines()
        assert banner == "Listing MQTT sessions for vhost %s ..." % vhost
        assert header.split("\t") == ["client_id", "connected", "clean_session", "subscriptions", "messages",
                                      "qos2_received", "qos2_sent", "qos2_released"]
        assert sorted(rows) == sorted([
            "%s\tfalse\tfalse\t[\"%s\"]\t2\t0\t0\t0" % (away, topic),
            "%s\ttrue\ttrue\t[]\t0\t0\t0\t0" % here])
        chosen = hutchctl("--url", http_url, "-p", vhost, "--formatter", "json", "list_mqtt_sessions",
                          "client_id", "queues", "connection", "user", "vhost")
        assert chosen.returncode == 0, chosen.stderr
        records = {r["client_id"]: r for r in (json.loads(line.lstrip(","))
                                                for line in chosen.stdout.splitlines()[1:-1])}
        assert records[away] == {"client_id": away, "queues": ["mqtt-subscription-%sqos1" % away],
                                 "connection": "", "user": "", "vhost": vhost}
        assert records[here]["user"] == "guest" and " -> " in records[here]["connection"]


def test_list_mqtt_sessions_arguments_and_missing_vhost(http_url):
    bad = hutchctl("--url", http_url, "list_mqtt_sessions", "client_id", "colour")
    assert bad.returncode == 64 and "Info key(s) colour are not supported" in bad.stderr
    missing = hutchctl("--url", http_url, "-p", unique("no-such-vhost"), "list_mqtt_sessions")
    assert missing.returncode == 0 and len(missing.stdout.splitlines()) == 1
    refused = hutchctl("--url", http_url, "--password", "wrong", "list_mqtt_sessions")
    assert refused.returncode == 77


def test_list_connections_shows_mqtt_connections_with_their_protocol(mqtt_port, http_url, vhost):
    cid = unique("shown")
    with mqtt(mqtt_port, vhost, cid), RawMQTT(mqtt_port) as old:
        assert old.connect(unique("old"), name="MQIsdp", level=3, username=vhost + ":guest",
                           password="guest") == b"\x00\x00"
        result = hutchctl("--url", http_url, "-s", "list_connections", "name", "user", "vhost", "protocol",
                          "client_properties")
        assert result.returncode == 0, result.stderr
        rows = [line.split("\t") for line in result.stdout.splitlines() if "\t%s\t" % vhost in line]
        assert sorted(row[3] for row in rows) == ["MQTT 3.1", "MQTT 3.1.1"]
        assert all(row[1] == "guest" and " -> " in row[0] for row in rows)
        assert '[{"client_id","%s"}]' % cid in [row[4] for row in rows]


@pytest.mark.differential
def test_list_mqtt_sessions_against_rabbitmq_says_it_is_a_hutch_extension():
    result = rabbitmq_target().run("list_mqtt_sessions")
    assert result.returncode == 69
    assert "no mqtt/sessions endpoint (a hutch extension that RabbitMQ does not provide)" in result.stderr
