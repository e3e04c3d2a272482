"""Connections, channels and consumers in the management API, and closing
a connection from it (the client sees connection.close 320 as from RabbitMQ)."""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from helpers import connect, unique, wait_for
from http_api import Api, segment


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


def open_client(broker, product: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", broker.port, client_properties={"product": product})
    return pika.BlockingConnection(params)


def listed(api, product: str) -> dict:
    found = [c for c in api.get("/api/connections").body if c["client_properties"].get("product") == product]
    assert len(found) == 1, found
    return found[0]


def test_connection_channel_and_consumer_are_listed(api, broker):
    product = unique("client")
    connection = open_client(broker, product)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare(unique("q"), exclusive=True).method.queue
        channel.basic_qos(prefetch_count=7)
        channel.basic_consume(queue, lambda *args: None, consumer_tag="listed-tag")
        shown = listed(api, product)
        local = connection._impl._transport._sock.getsockname()
        assert shown["name"] == "%s:%d -> 127.0.0.1:%d" % (local[0], local[1], broker.port)
        assert (shown["user"], shown["vhost"], shown["protocol"], shown["state"]) == (
            "guest", "/", "AMQP 0-9-1", "running")
        assert (shown["peer_host"], shown["peer_port"], shown["port"]) == (local[0], local[1], broker.port)
        assert shown["auth_mechanism"] == "PLAIN" and shown["channels"] == 1
        assert shown["recv_oct"] > 0 and shown["send_oct"] > 0 and shown["recv_cnt"] > 0
        owner = api.get("/api/queues/%2F/" + segment(queue)).body["owner_pid_details"]
        assert owner == {"name": shown["name"], "peer_host": local[0], "peer_port": local[1]}
        assert api.get("/api/connections/" + segment(shown["name"])).body["name"] == shown["name"]
        (ch,) = api.get("/api/connections/%s/channels" % segment(shown["name"])).body
        assert ch["name"] == shown["name"] + " (1)"
        assert (ch["number"], ch["confirm"], ch["prefetch_count"], ch["consumer_count"]) == (1, True, 7, 1)
        assert api.get("/api/channels/" + segment(ch["name"])).body["consumer_details"][0]["consumer_tag"] \
            == "listed-tag"
        assert ch["name"] in [c["name"] for c in api.get("/api/channels").body]
        consumers = [c for c in api.get("/api/consumers/%2F").body if c["consumer_tag"] == "listed-tag"]
        assert consumers[0]["queue"] == {"name": queue, "vhost": "/"}
        assert consumers[0]["channel_details"]["connection_name"] == shown["name"]
        assert shown["name"] in [c["name"] for c in api.get("/api/vhosts/%2F/connections").body]
    finally:
        connection.close()
    wait_for(lambda: not [c for c in api.get("/api/connections").body
                          if c["client_properties"].get("product") == product])


def test_closing_a_connection_from_the_api(api, broker):
    product = unique("client")
    connection = open_client(broker, product)
    name = listed(api, product)["name"]
    assert api.delete("/api/connections/" + segment(name)).status == 204
    with pytest.raises(ConnectionClosedByBroker) as info:
        wait_for(lambda: connection.process_data_events(0.05) or not connection.is_open)
        connection.channel()
    assert (info.value.reply_code, info.value.reply_text) == (320, "CONNECTION_FORCED - Closed via management plugin")
    assert api.get("/api/connections/" + segment(name)).status == 404
    assert connect(broker.port).is_open


def test_closing_with_a_reason(api, broker):
    product = unique("client")
    connection = open_client(broker, product)
    name = listed(api, product)["name"]
    assert api.delete("/api/connections/" + segment(name), headers={"X-Reason": "maintenance"}).status == 204
    with pytest.raises(ConnectionClosedByBroker) as info:
        wait_for(lambda: connection.process_data_events(0.05) or not connection.is_open)
        connection.channel()
    assert (info.value.reply_code, info.value.reply_text) == (320, "CONNECTION_FORCED - maintenance")


def test_unknown_connection_is_404(api):
    assert api.delete("/api/connections/" + segment("127.0.0.1:1 -> 127.0.0.1:2")).status == 404
