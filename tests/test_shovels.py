"""Dynamic shovels on hutch: messages move as RabbitMQ's shovel moves them.

Most tests shovel between two vhosts of the session broker (a shovel is an
AMQP client: a vhost on the same node is as remote as another broker);
tests/test_shovel_crash.py kills whole brokers.
"""
from __future__ import annotations

import json
import time

import pika
import pytest

from helpers import confirm_channel_in, wait_for
from http_api import Api, segment
from hutchctl_targets import hutch_target

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def hutchctl(broker):
    """hutchctl(*args) against the session broker."""
    return hutch_target(broker).run


def uri(broker, vhost: str) -> str:
    return "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(vhost))


@pytest.fixture
def two_vhosts(make_vhost):
    """(source vhost, destination vhost) on the session broker."""
    return make_vhost(), make_vhost()


def drain(channel, queue: str, count: int, timeout: float = 30.0) -> list:
    """`count` messages (method, properties, body) got from `queue`."""
    got = []

    def more():
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return len(got) >= count
            got.append((method, properties, body))
    wait_for(more, timeout)
    return got


def put_shovel(api, vhost: str, name: str, value: dict) -> None:
    reply = api.put("/api/parameters/shovel/%s/%s" % (segment(vhost), name), {"value": value})
    assert reply.status == 201, reply.body


def status_of(api, vhost: str, name: str) -> dict | None:
    return next((s for s in api.get("/api/shovels/" + segment(vhost)).body if s["name"] == name), None)


def running(api, vhost: str, name: str) -> dict:
    return wait_for(lambda: (lambda s: s if s and s["state"] == "running" else None)(status_of(api, vhost, name)),
                    30)


def test_queue_to_queue_keeps_every_message_and_its_properties(broker, api, two_vhosts):
    src, dest = two_vhosts
    connection, channel = confirm_channel_in(broker, src)
    props = pika.BasicProperties(delivery_mode=2, content_type="text/plain", headers={"n": 1, "s": "x"},
                                 priority=3, correlation_id="c", expiration="60000")
    channel.queue_declare("src-q", durable=True)
    for i in range(200):
        channel.basic_publish("", "src-q", b"m%d" % i, props)
    put_shovel(api, src, "s", {"src-uri": uri(broker, src), "src-queue": "src-q", "dest-uri": uri(broker, dest),
                               "dest-queue": "dest-q"})
    status = running(api, src, "s")
    assert status["src_uri"] == "amqp://guest@127.0.0.1:%d/%s" % (broker.port, segment(src))  # no password
    assert (status["type"], status["src_queue"], status["dest_queue"]) == ("dynamic", "src-q", "dest-q")
    dest_connection, dest_channel = confirm_channel_in(broker, dest)
    got = drain(dest_channel, "dest-q", 200)
    assert [body for _m, _p, body in got] == [b"m%d" % i for i in range(200)]
    _method, properties, _body = got[0]
    assert (properties.delivery_mode, properties.content_type, properties.headers, properties.priority,
            properties.correlation_id, properties.message_id) == (2, "text/plain", {"n": 1, "s": "x"}, 3, "c", None)
    declared = dest_channel.queue_declare("dest-q", passive=True)  # the shovel declared it, durable
    assert declared.method.message_count == 0
    assert api.get("/api/queues/%s/dest-q" % segment(dest)).body["durable"] is True
    wait_for(lambda: channel.queue_declare("src-q", passive=True).method.message_count == 0)
    connection.close()
    dest_connection.close()


def test_exchange_to_exchange_with_headers_and_properties(broker, api, two_vhosts):
    src, dest = two_vhosts
    connection, channel = confirm_channel_in(broker, src)
    channel.exchange_declare("in", "topic")
    dest_connection, dest_channel = confirm_channel_in(broker, dest)
    dest_channel.exchange_declare("out", "direct")
    dest_channel.queue_declare("landed")
    dest_channel.queue_bind("landed", "out", "fixed")
    put_shovel(api, src, "x", {
        "src-uri": uri(broker, src), "src-exchange": "in", "src-exchange-key": "orders.#",
        "dest-uri": [uri(broker, dest)], "dest-exchange": "out", "dest-exchange-key": "fixed",
        "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
        "dest-publish-properties": {"delivery_mode": 2, "app_id": "shovelled"}, "ack-mode": "on-publish"})
    running(api, src, "x")
    before = int(time.time())
    for key in ("orders.eu", "other", "orders.us"):
        channel.basic_publish("in", key, key.encode())
    got = drain(dest_channel, "landed", 2)
    assert [body for _m, _p, body in got] == [b"orders.eu", b"orders.us"]
    properties = got[0][1]
    assert (properties.delivery_mode, properties.app_id) == (2, "shovelled")
    assert properties.headers["x-shovelled-timestamp"] >= before
    (record,) = properties.headers["x-shovelled"]
    assert (record["shovel-name"], record["shovel-vhost"], record["src-exchange"], record["dest-exchange"]) == \
        ("x", src, "in", "out")
    assert dest_channel.basic_get("landed")[0] is None
    connection.close()
    dest_connection.close()


def test_delete_after_queue_length_moves_what_was_there_then_deletes_itself(broker, api, two_vhosts):
    src, dest = two_vhosts
    connection, channel = confirm_channel_in(broker, src)
    channel.queue_declare("batch", durable=True)
    for i in range(50):
        channel.basic_publish("", "batch", b"%d" % i)
    put_shovel(api, src, "once", {"src-uri": uri(broker, src), "src-queue": "batch", "dest-uri": uri(broker, dest),
                                  "dest-queue": "batch", "src-delete-after": "queue-length", "ack-mode": "on-confirm"})
    wait_for(lambda: api.get("/api/parameters/shovel/%s/once" % segment(src)).status == 404, 30)
    wait_for(lambda: status_of(api, src, "once") is None)
    dest_connection, dest_channel = confirm_channel_in(broker, dest)
    assert len(drain(dest_channel, "batch", 50)) == 50
    channel.basic_publish("", "batch", b"after")  # the shovel is gone: this one stays
    assert channel.queue_declare("batch", passive=True).method.message_count == 1
    connection.close()
    dest_connection.close()


def test_unreachable_end_is_terminated_with_a_reason_then_restarted_and_deleted(broker, api, two_vhosts, hutchctl):
    src, dest = two_vhosts
    put_shovel(api, src, "far", {"src-uri": uri(broker, src), "src-queue": "far-q",
                                 "dest-uri": "amqp://guest:guest@127.0.0.1:1/", "reconnect-delay": 0.2})
    status = wait_for(lambda: (lambda s: s if s and s["state"] == "terminated" else None)(status_of(api, src, "far")),
                      30)
    assert "cannot connect to the destination" in status["reason"] and "guest@127.0.0.1:1" in status["reason"]
    assert "guest:guest" not in status["reason"]

    def listed_terminated():
        """hutchctl's row, once it shows the shovel terminated: it starts again every
        reconnect-delay (doubled each time), so a listing may catch it starting."""
        listed = hutchctl("shovel_status", "--formatter", "json")
        assert listed.returncode == 0, listed.stderr
        (row,) = [row for row in json.loads(listed.stdout) if row["vhost"] == src]
        assert (row["name"], row["type"]) == ("far", "dynamic")
        return row if row["state"] == "terminated" else None

    row = wait_for(listed_terminated, 30, what="hutchctl listing the shovel terminated")
    assert row["termination_reason"].startswith("cannot connect to the destination")
    restarted = hutchctl("restart_shovel", "-p", src, "far")
    assert restarted.returncode == 0, restarted.stderr
    assert api.delete("/api/shovels/vhost/%s/nosuch/restart" % segment(src)).status == 404
    deleted = hutchctl("delete_shovel", "-p", src, "far")
    assert deleted.returncode == 0, deleted.stderr
    assert api.get("/api/parameters/shovel/%s/far" % segment(src)).status == 404
    wait_for(lambda: status_of(api, src, "far") is None)
    put_shovel(api, src, "nowhere", {"src-uri": [], "src-queue": "q", "dest-uri": []})  # RabbitMQ takes it too
    status = wait_for(lambda: (lambda s: s if s and s["state"] == "terminated" else None)(
        status_of(api, src, "nowhere")), 30)
    assert status["reason"] == "cannot connect to the source: no URI given"
    again = hutchctl("delete_shovel", "-p", src, "far")
    assert again.returncode == 69 and "Shovel with the given name was not found" in again.stderr


def test_shovels_restart_with_the_broker(start_broker, tmp_path):
    node = start_broker(expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    value = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}
    put_shovel(api, "/", "local", value)  # "amqp://" is this node, as the default user
    running(api, "/", "local")
    node.stop()
    node = start_broker("--data-dir", str(node.data_dir), expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    running(api, "/", "local")  # the new port: "amqp://" follows the node
    connection = pika.BlockingConnection(pika.URLParameters(node.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "a", b"through")
    assert drain(channel, "b", 1)[0][2] == b"through"
    connection.close()


def test_no_ack_from_a_fanout_exchange_and_a_shovel_imported_with_definitions(broker, api, two_vhosts):
    """A shovel in an imported definitions document starts; with no
    src-exchange-key it is bound as RabbitMQ binds it, which a fanout
    exchange ignores; no-ack moves each message once."""
    src, dest = two_vhosts
    connection, channel = confirm_channel_in(broker, src)
    channel.exchange_declare("fan", "fanout")
    value = {"src-uri": uri(broker, src), "src-exchange": "fan", "dest-uri": uri(broker, dest),
             "dest-queue": "from-fan", "ack-mode": "no-ack"}
    document = {"parameters": [{"vhost": src, "component": "shovel", "name": "imported", "value": value}]}
    assert api.post("/api/definitions", document).status == 204
    running(api, src, "imported")
    for i in range(20):
        channel.basic_publish("fan", "any-key", b"%d" % i)
    dest_connection, dest_channel = confirm_channel_in(broker, dest)
    assert [body for _m, _p, body in drain(dest_channel, "from-fan", 20)] == [b"%d" % i for i in range(20)]
    connection.close()
    dest_connection.close()
