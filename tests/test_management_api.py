"""Management HTTP API against a running broker: authentication, error
bodies, and the objects (overview, vhosts, users, permissions, exchanges,
queues, bindings) in RabbitMQ's shapes, seen from AMQP clients too."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError, ProbableAuthenticationError

from helpers import confirm_channel, connect, publish_n, unique, wait_for
from http_api import Api, call, segment

NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


@pytest.fixture
def vhost(api):
    """A fresh vhost where guest has every permission."""
    name = unique("vh")
    assert api.put("/api/vhosts/" + segment(name)).status == 201
    assert api.put("/api/permissions/%s/guest" % segment(name),  # the creator has them already
                   {"configure": ".*", "write": ".*", "read": ".*"}).status == 204
    yield name
    api.delete("/api/vhosts/" + segment(name))


# -- authentication and errors -------------------------------------------------


def test_no_credentials_is_401_with_a_basic_challenge(broker):
    reply = call(broker.ports["HTTP"], "GET", "/api/overview", auth=None)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_wrong_password_is_401_login_failed(broker):
    reply = call(broker.ports["HTTP"], "GET", "/api/overview", auth=("guest", "nope"))
    assert (reply.status, reply.body) == (401, {"error": "not_authorized", "reason": "Login failed"})
    reply = call(broker.ports["HTTP"], "GET", "/api/overview", auth=("nobody", "guest"))
    assert (reply.status, reply.body) == (401, {"error": "not_authorized", "reason": "Login failed"})


def test_unknown_paths_and_objects_are_404_json(api):
    for path in ("/api/nonsense", "/api/queues/%2F/" + unique("missing"), "/api/exchanges/%2F/" + unique("x"),
                 "/api/vhosts/" + unique("v"), "/api/users/" + unique("u"), "/api/queues/" + unique("v")):
        reply = api.get(path)
        assert (reply.status, reply.body) == (404, NOT_FOUND), path
        assert reply.headers["content-type"].startswith("application/json")


def test_wrong_method_is_405_with_allow(api):
    reply = api.post("/api/overview", {})
    assert reply.status == 405
    assert "GET" in reply.headers["allow"]


def test_a_body_that_is_not_json_is_400(api):
    reply = api.put("/api/users/" + unique("u"), raw=b"{nope")
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "not_json"})


# -- overview, whoami, nodes -----------------------------------------------------


def test_overview_and_whoami(api):
    overview = api.get("/api/overview").body
    assert overview["rabbitmq_version"] and overview["management_version"]
    assert {t["name"] for t in overview["exchange_types"]} == {"direct", "fanout", "headers", "topic"}
    assert set(overview["object_totals"]) == {"channels", "connections", "consumers", "exchanges", "queues"}
    assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(overview["queue_totals"])
    protocols = {listener["protocol"] for listener in overview["listeners"]}
    assert {"amqp", "http", "http/prometheus"} <= protocols
    assert api.get("/api/whoami").body == {"name": "guest", "tags": ["administrator"]}


def test_nodes_lists_this_node(api):
    (node,) = api.get("/api/nodes").body
    assert node["running"] is True and node["mem_limit"] > 0 and node["uptime"] >= 0
    assert node["fd_used"] > 0 and node["fd_total"] >= node["fd_used"] and node["disk_free"] > 0
    assert node["sockets_used"] >= 0 and node["connection_created"] >= node["connection_closed"]
    assert "rate" in node["queue_declared_details"] and node["contexts"][0]["port"] == str(api.port)
    assert api.get("/api/nodes/" + segment(node["name"])).body["name"] == node["name"]


# -- vhosts, users, permissions ---------------------------------------------------


def test_vhost_lifecycle(api, broker):
    name = unique("vh")
    path = "/api/vhosts/" + segment(name)
    assert api.put(path).status == 201
    assert api.put(path).status == 204
    shown = api.get(path).body
    assert shown["name"] == name and shown["messages"] == 0 and shown["tracing"] is False
    assert (shown["recv_oct"], shown["send_oct"]) == (0, 0)
    assert name in [v["name"] for v in api.get("/api/vhosts").body]
    # guest created it, so guest has full permissions in it (as on RabbitMQ); without them AMQP refuses
    assert api.get(path + "/permissions").body == [{"vhost": name, "user": "guest", "configure": ".*",
                                                    "write": ".*", "read": ".*"}]
    url = "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(name))
    pika.BlockingConnection(pika.URLParameters(url)).close()
    assert api.delete("/api/permissions/%s/guest" % segment(name)).status == 204
    with pytest.raises(ProbableAccessDeniedError):
        pika.BlockingConnection(pika.URLParameters(url))
    assert api.delete(path).status == 204
    assert api.get(path).status == 404
    assert api.delete(path).status == 404


def _metadata(shown: dict) -> dict:
    return {key: shown[key] for key in ("name", "description", "tags", "default_queue_type", "metadata", "tracing")}


def test_vhost_description_and_tags_are_kept_and_shown_as_rabbitmq_does(api):
    name = unique("vh")
    path = "/api/vhosts/" + segment(name)
    assert api.put(path, {"description": "orders", "tags": "a, b,", "default_queue_type": "quorum"}).status == 201
    try:
        expected = {"name": name, "description": "orders", "tags": ["a", "b"], "default_queue_type": "undefined",
                    "metadata": {"description": "orders", "tags": ["a", "b"]}, "tracing": False}
        assert _metadata(api.get(path).body) == expected
        assert expected in [_metadata(v) for v in api.get("/api/vhosts").body]
        # a PUT replaces the metadata: tags as a list are trimmed, what is absent is cleared
        assert api.put(path, {"tags": ["c", " d"], "tracing": True}).status == 204
        assert _metadata(api.get(path).body) == {
            "name": name, "description": "", "tags": ["c", "d"], "default_queue_type": "undefined",
            "metadata": {"description": "", "tags": ["c", "d"]}, "tracing": True}
        for bad in ({"description": 5}, {"tags": 7}, {"tags": ["x", 1]}):
            reply = api.put(path, bad)
            assert reply.status == 400 and reply.body["error"] == "bad_request", bad
        assert api.get(path).body["tags"] == ["c", "d"]
    finally:
        api.delete(path)


def test_vhost_description_and_tags_survive_a_restart(start_broker):
    first = start_broker(expect=("AMQP", "HTTP"))
    api = Api(first.ports["HTTP"])
    assert api.put("/api/vhosts/kept", {"description": "durable one", "tags": "x,y"}).status == 201
    assert api.put("/api/vhosts/%2F", {"description": "the default"}).status == 204
    first.stop()
    second = start_broker("--data-dir", str(first.data_dir), expect=("AMQP", "HTTP"))
    shown = {v["name"]: (v["description"], v["tags"]) for v in Api(second.ports["HTTP"]).get("/api/vhosts").body}
    assert shown == {"/": ("the default", []), "kept": ("durable one", ["x", "y"])}


def test_user_created_through_the_api_logs_in_over_amqp(api, broker, vhost):
    user = unique("user")
    assert api.put("/api/users/" + user, {"password": "pw1", "tags": "management"}).status == 201
    shown = api.get("/api/users/" + user).body
    assert shown["tags"] == ["management"]
    assert shown["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert api.put("/api/permissions/%s/%s" % (segment(vhost), user),
                   {"configure": ".*", "write": ".*", "read": ".*"}).status == 201
    assert api.get("/api/permissions/%s/%s" % (segment(vhost), user)).body == {
        "user": user, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}
    params = pika.ConnectionParameters("127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, "pw1"))
    pika.BlockingConnection(params).close()
    # tags only: the password stays
    assert api.put("/api/users/" + user, {"tags": ["monitoring", "management"]}).status == 204
    assert api.get("/api/users/" + user).body["tags"] == ["monitoring", "management"]
    pika.BlockingConnection(params).close()
    assert api.delete("/api/permissions/%s/%s" % (segment(vhost), user)).status == 204
    with pytest.raises(ProbableAccessDeniedError):
        pika.BlockingConnection(params)
    assert api.delete("/api/users/" + user).status == 204
    with pytest.raises(ProbableAuthenticationError):
        pika.BlockingConnection(params)


def test_user_errors(api, vhost):
    user = unique("user")
    reply = api.put("/api/users/" + user, {"password": "x"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "tags_not_present"})
    reply = api.put("/api/permissions/%s/%s" % (segment(vhost), user), {"configure": ".*", "write": ".*",
                                                                         "read": ".*"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})


def test_user_with_a_password_hash(api, broker, vhost):
    """A hash in RabbitMQ's scheme (what a definitions export carries) works for login."""
    source = unique("src")
    api.put("/api/users/" + source, {"password": "hashed-pw", "tags": ""})
    password_hash = api.get("/api/users/" + source).body["password_hash"]
    user = unique("copy")
    assert api.put("/api/users/" + user, {"password_hash": password_hash, "tags": ""}).status == 201
    api.put("/api/permissions/%s/%s" % (segment(vhost), user), {"configure": ".*", "write": ".*", "read": ".*"})
    pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, "hashed-pw"))).close()
    for name in (source, user):
        api.delete("/api/users/" + name)


def test_permission_listings(api, vhost):
    listed = api.get("/api/vhosts/%s/permissions" % segment(vhost)).body
    assert listed == [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}]
    assert vhost in [p["vhost"] for p in api.get("/api/users/guest/permissions").body]
    assert vhost in [p["vhost"] for p in api.get("/api/permissions").body]


# -- queues, exchanges, bindings --------------------------------------------------


def test_queue_declared_over_http_is_seen_over_amqp(api, broker, vhost):
    name = unique("q")
    path = "/api/queues/%s/%s" % (segment(vhost), name)
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 201
    assert api.put(path, {"durable": True, "arguments": {"x-max-length": 10}}).status == 204
    reply = api.put(path, {"durable": False})
    assert reply.status == 400
    assert reply.body == {"error": "bad_request", "reason": "inequivalent arg 'durable' for queue '%s' in vhost "
                          "'%s': received 'false' but current is 'true'" % (name, vhost)}
    connection = pika.BlockingConnection(pika.URLParameters(
        "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(vhost))))
    channel = confirm_channel(connection)
    ok = channel.queue_declare(name, passive=True)
    publish_n(channel, name, 3)
    shown = api.get(path).body
    assert ok.method.message_count == 0
    assert (shown["name"], shown["vhost"], shown["durable"], shown["arguments"]) == (
        name, vhost, True, {"x-max-length": 10})
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (3, 3, 0)
    assert shown["message_stats"]["publish"] == 3
    assert sum(shown["message_states"].values()) == 3
    # a consumer holding one unacked message
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(name, lambda *args: None, consumer_tag="ctag-api")
    wait_for(lambda: connection.process_data_events(0) or api.get(path).body["messages_unacknowledged"] == 1)
    shown = api.get(path).body
    assert (shown["messages"], shown["messages_ready"], shown["consumers"]) == (3, 2, 1)
    assert (shown["message_bytes"], shown["message_bytes_ready"], shown["message_bytes_unacknowledged"]) == (6, 4, 2)
    (consumer,) = shown["consumer_details"]
    assert consumer["consumer_tag"] == "ctag-api" and consumer["prefetch_count"] == 1
    assert consumer["ack_required"] is True
    listed = api.get("/api/queues/" + segment(vhost)).body
    assert [q["name"] for q in listed] == [name]
    connection.close()
    assert api.delete(path).status == 204
    assert api.get(path).status == 404


def test_queue_delete_conditions_and_reserved_names(api, broker, vhost):
    name = unique("q")
    path = "/api/queues/%s/%s" % (segment(vhost), name)
    api.put(path, {"durable": False})
    api.post("/api/exchanges/%s/amq.default/publish" % segment(vhost),
             {"properties": {}, "routing_key": name, "payload": "x", "payload_encoding": "string"})
    reply = api.delete(path + "?if-empty=true")
    assert reply.status == 400
    assert reply.body == {"error": "bad_request", "reason": "queue '%s' in vhost '%s' not empty" % (name, vhost)}
    assert api.delete(path).status == 204
    reply = api.put("/api/queues/%s/amq.reserved" % segment(vhost), {})
    assert (reply.status, reply.body) == (401, {"error": "not_authorised", "reason": "Access refused."})
    reply = api.put("/api/queues/%s/%s" % (segment(vhost), "q" * 300), {})
    assert (reply.status, reply.body) == (400, {"error": "bad_request",
                                                "reason": "queue should be less than 255 bytes, actually was 300\n"})
    reply = api.put("/api/queues/%s/q" % segment(unique("novhost")), {})
    assert (reply.status, reply.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def test_exchanges_and_bindings(api, broker, vhost):
    v = segment(vhost)
    x, q = unique("x"), unique("q")
    assert api.put("/api/exchanges/%s/%s" % (v, x), {"type": "topic", "durable": True}).status == 201
    reply = api.put("/api/exchanges/%s/%s" % (v, unique("x")), {"type": "nope"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "unknown exchange type 'nope'"})
    api.put("/api/queues/%s/%s" % (v, q), {"durable": True})
    reply = api.post("/api/bindings/%s/e/%s/q/%s" % (v, x, q), {"routing_key": "a.#", "arguments": {}})
    assert reply.status == 201 and reply.headers["location"] == "a.%23"
    exchanges = {e["name"]: e for e in api.get("/api/exchanges/" + v).body}
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match", x} <= set(exchanges)
    assert (exchanges[x]["type"], exchanges[x]["durable"], exchanges[x]["internal"]) == ("topic", True, False)
    bindings = api.get("/api/bindings/" + v).body
    assert {"source": x, "vhost": vhost, "destination": q, "destination_type": "queue", "routing_key": "a.#",
            "arguments": {}, "properties_key": "a.%23"} in bindings
    assert {"source": "", "vhost": vhost, "destination": q, "destination_type": "queue", "routing_key": q,
            "arguments": {}, "properties_key": q} in bindings
    assert [b["routing_key"] for b in api.get("/api/queues/%s/%s/bindings" % (v, q)).body] == [q, "a.#"]
    assert [b["destination"] for b in api.get("/api/exchanges/%s/%s/bindings/source" % (v, x)).body] == [q]
    # the binding routes AMQP publishes
    reply = api.post("/api/exchanges/%s/%s/publish" % (v, x),
                     {"properties": {}, "routing_key": "a.b", "payload": "hi", "payload_encoding": "string"})
    assert reply.body == {"routed": True}
    assert api.get("/api/bindings/%s/e/%s/q/%s/a.%%23" % (v, x, q)).body["routing_key"] == "a.#"
    assert api.delete("/api/bindings/%s/e/%s/q/%s/a.%%23" % (v, x, q)).status == 204
    assert api.get("/api/bindings/%s/e/%s/q/%s" % (v, x, q)).body == []
    reply = api.post("/api/exchanges/%s/%s/publish" % (v, x),
                     {"properties": {}, "routing_key": "a.b", "payload": "hi", "payload_encoding": "string"})
    assert reply.body == {"routed": False}
    missing = unique("missing")
    reply = api.post("/api/bindings/%s/e/%s/q/%s" % (v, x, missing), {})
    assert (reply.status, reply.body) == (404, {"error": "not_found",
                                                "reason": "no queue '%s' in vhost '%s'" % (missing, vhost)})
    reply = api.post("/api/bindings/%s/e/%s/q/%s" % (v, missing, q), {})
    assert (reply.status, reply.body) == (404, {"error": "not_found",
                                                "reason": "no exchange '%s' in vhost '%s'" % (missing, vhost)})
    # exchange-to-exchange
    assert api.post("/api/bindings/%s/e/%s/q/%s" % (v, x, q), {"arguments": {"h": 1}}).headers["location"] \
        .startswith("~")
    y = unique("y")
    api.put("/api/exchanges/%s/%s" % (v, y), {"type": "fanout"})
    assert api.post("/api/bindings/%s/e/%s/e/%s" % (v, x, y), {"routing_key": "k"}).status == 201
    assert [b["source"] for b in api.get("/api/exchanges/%s/%s/bindings/destination" % (v, y)).body] == [x]
    assert api.delete("/api/exchanges/%s/%s" % (v, x)).status == 204
    assert api.get("/api/exchanges/%s/%s" % (v, x)).status == 404
    reply = api.delete("/api/exchanges/%s/amq.direct" % v)
    assert (reply.status, reply.body) == (401, {"error": "not_authorised", "reason": "Access refused."})


def test_exchange_declared_over_amqp_is_listed(api, conn):
    channel = conn.channel()
    x = unique("x")
    channel.exchange_declare(x, "headers", auto_delete=True, arguments={"alternate-exchange": "ae"})
    shown = api.get("/api/exchanges/%2F/" + x).body
    assert (shown["type"], shown["auto_delete"], shown["durable"], shown["arguments"]) == (
        "headers", True, False, {"alternate-exchange": "ae"})
    channel.exchange_delete(x)
    assert api.get("/api/exchanges/%2F/" + x).status == 404


def test_listing_sort_columns_and_pages(api, vhost):
    v = segment(vhost)
    names = sorted(unique("q") for _ in range(3))
    for name in names:
        api.put("/api/queues/%s/%s" % (v, name), {})
    assert [q["name"] for q in api.get("/api/queues/%s?sort=name&sort_reverse=true" % v).body] == names[::-1]
    assert api.get("/api/queues/%s?columns=name,vhost" % v).body == [{"name": n, "vhost": vhost} for n in names]
    page = api.get("/api/queues/%s?page=2&page_size=2&columns=name" % v).body
    assert (page["total_count"], page["page_count"], page["items"]) == (3, 2, [{"name": names[2]}])


def test_vhost_delete_closes_its_connections(api, broker, vhost):
    connection = pika.BlockingConnection(pika.URLParameters(
        "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(vhost))))
    channel = connection.channel()
    channel.queue_declare(unique("q"))
    assert api.delete("/api/vhosts/" + segment(vhost)).status == 204
    with pytest.raises((pika.exceptions.ConnectionClosedByBroker, ChannelClosedByBroker)) as info:
        wait_for(lambda: connection.process_data_events(0.05) or not connection.is_open)
        channel.queue_declare(unique("q"))
    assert info.value.reply_code == 320
    assert connect(broker.port).is_open


def test_message_rates_come_from_samples(start_broker):
    """With a short sample interval the publish rate of a queue and of its
    vhost becomes positive while messages arrive, and falls back to zero."""
    broker = start_broker("--management-sample-interval", "0.2", expect=("AMQP", "HTTP"))
    api = Api(broker.ports["HTTP"])
    connection = connect(broker.port)
    channel = connection.channel()
    queue = channel.queue_declare(unique("rates")).method.queue

    def rate(path: str):
        return api.get(path).body.get("message_stats", {}).get("publish_details", {}).get("rate", 0)

    def publishing_seen():
        channel.basic_publish("", queue, b"m")
        connection.process_data_events(0)
        return rate("/api/queues/%2F/" + queue) > 0 and rate("/api/vhosts/%2F") > 0

    wait_for(publishing_seen)
    assert api.get("/api/overview").body["message_stats"]["publish_details"]["rate"] >= 0
    wait_for(lambda: rate("/api/queues/%2F/" + queue) == 0)
    connection.close()


def test_listeners_can_be_switched_off(start_broker):
    broker = start_broker("--management-enabled", "false", "--prometheus-enabled", "false")
    assert "HTTP" not in broker.ports and "PROMETHEUS" not in broker.ports
    assert "listening for HTTP" not in broker.log
    connect(broker.port).close()


def test_a_busy_http_port_stops_the_broker_with_a_message(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "cli.server", "--bind", "127.0.0.1", "--port", "0", "--data-dir",
             str(tmp_path / "data"), "--management-bind", "127.0.0.1", "--management-port", str(port),
             "--prometheus-enabled", "false", "--mqtt-enabled", "false", "--stream-enabled", "false"],
            cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")},
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "cannot listen for HTTP on 127.0.0.1:%d" % port in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()  # the failed start removed the data directory it created
