"""The dead-letter log as clients of a real broker see it: every message
that dies (rejected, nacked, expired, dropped by a length limit, over its
delivery limit), with or without a dead letter exchange, is one record in
GET /api/hutch/dead-letters/{vhost}, and survives kill -9 once its message
has left its queue."""
from __future__ import annotations

import base64
import signal
import time

import pika
import pytest

from conftest import launch
from dead_letter_clients import delete_vhost, new_vhost
from helpers import connect, drain, ready, wait_for
from http_api import Api, segment

PATH = "/api/hutch/dead-letters/"


@pytest.fixture
def vhost(broker):
    """A vhost of its own, so offsets start at 0 and counts are exact."""
    name = new_vhost(broker)
    yield name
    delete_vhost(broker, name)


def records(port: int, vhost: str, start: int = 0, limit: int = 1000) -> dict:
    reply = Api(port).get("%s%s?start=%d&limit=%d" % (PATH, segment(vhost), start, limit))
    assert reply.status == 200, reply.body
    return reply.body


def wait_records(port: int, vhost: str, n: int) -> list[dict]:
    return wait_for(lambda: (lambda got: got if len(got) >= n else None)(records(port, vhost)["records"]))


def channel_in(broker, vhost: str):
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, vhost))
    return connection, connection.channel()


def test_every_way_to_die_is_one_record(broker, vhost):
    connection, ch = channel_in(broker, vhost)
    try:
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("parked")
        ch.queue_bind("parked", "dlx")
        ch.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "again"})
        ch.queue_declare("short", arguments={"x-message-ttl": 1})
        ch.queue_declare("small", arguments={"x-max-length": 2})
        ch.queue_declare("limited", arguments={"x-delivery-limit": 1})
        ch.confirm_delivery()
        props = pika.BasicProperties(content_type="application/json", message_id="m-1", correlation_id="c-1",
                                     app_id="billing", timestamp=1700000000, headers={"tenant": "acme"})
        ch.basic_publish("", "work", b'{"n": 1}', props)
        ch.basic_publish("", "work", b"two")
        method, _p, _b = ch.basic_get("work")
        ch.basic_reject(method.delivery_tag, requeue=False)
        method, _p, _b = ch.basic_get("work")
        ch.basic_nack(method.delivery_tag, requeue=False)
        ch.basic_publish("", "short", b"late")
        for i in range(5):
            ch.basic_publish("", "small", b"s%d" % i)
        ch.basic_publish("", "limited", b"retry")
        for _ in range(2):
            method, _p, _b = ch.basic_get("limited")
            ch.basic_nack(method.delivery_tag, requeue=True)
        got = wait_records(broker.ports["HTTP"], vhost, 7)
    finally:
        connection.close()
    assert [r["offset"] for r in got] == list(range(7))
    summary = sorted((r["queue"], r["reason"], base64.b64decode(r["body"])) for r in got)
    assert summary == [("limited", "delivery_limit", b"retry"), ("short", "expired", b"late"),
                       ("small", "maxlen", b"s0"), ("small", "maxlen", b"s1"), ("small", "maxlen", b"s2"),
                       ("work", "rejected", b"two"), ("work", "rejected", b'{"n": 1}')]
    first = got[0]
    assert first["vhost"] == vhost and abs(first["time"] - time.time()) < 60
    assert (first["exchange"], first["routing_keys"], first["dead_letter_exchange"],
            first["dead_letter_routing_key"], first["death_count"], first["delivery_count"], first["body_size"]) == \
        ("", ["work"], "dlx", "again", 1, 0, 8)
    assert [r["delivery_count"] for r in got if r["reason"] == "delivery_limit"] == [2]
    assert first["properties"] == {"content_type": "application/json", "message_id": "m-1",
                                   "correlation_id": "c-1", "app_id": "billing", "timestamp": 1700000000,
                                   "headers": {"tenant": "acme"}}
    no_dlx = [r for r in got if r["queue"] != "work"]
    assert all(r["dead_letter_exchange"] is None and r["dead_letter_routing_key"] is None for r in no_dlx)
    assert records(broker.ports["HTTP"], vhost, start=5, limit=1)["records"][0]["offset"] == 5
    assert records(broker.ports["HTTP"], vhost)["next_offset"] == 7


def test_death_count_follows_x_death(broker, vhost):
    """A queue that dead-letters into itself: the same message dies there
    three times, and each record counts its deaths so far."""
    connection, ch = channel_in(broker, vhost)
    try:
        ch.queue_declare("loop", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "loop"})
        ch.basic_publish("", "loop", b"again and again")
        for _ in range(3):
            method = wait_for(lambda: ch.basic_get("loop")[0])
            ch.basic_reject(method.delivery_tag, requeue=False)
        got = wait_records(broker.ports["HTTP"], vhost, 3)
    finally:
        connection.close()
    assert [r["death_count"] for r in got] == [1, 2, 3]
    assert got[2]["properties"]["headers"]["x-death"][0]["count"] == 2  # as the message was when it died


def test_bodies_can_be_left_out(start_broker):
    broker = start_broker("--dead-letter-log-include-bodies", "false", expect=("AMQP", "HTTP"))
    with connect(broker.port) as connection:
        ch = connection.channel()
        ch.queue_declare("small", arguments={"x-max-length": 1})
        ch.basic_publish("", "small", b"12345")
        ch.basic_publish("", "small", b"x")
        (record,) = wait_records(broker.ports["HTTP"], "/", 1)
    assert (record["body"], record["body_size"]) == (None, 5)


def test_records_of_messages_that_left_their_queue_survive_kill_9(tmp_path):
    """Persistent messages pushed out of a durable length-limited queue: after
    SIGKILL, every record a reader saw is still there, every message that is
    no longer in the queue has its record (the queue lets each go only once
    its record is on disk), and offsets carry on after the restart."""
    broker = launch(tmp_path, expect=("AMQP", "HTTP"))
    data_dir = broker.data_dir
    sent = [b"p%03d" % i for i in range(200)]
    try:
        with connect(broker.port) as connection:
            ch = connection.channel()
            ch.queue_declare("bounded", durable=True, arguments={"x-max-length": 50})
            ch.confirm_delivery()
            for body in sent:
                ch.basic_publish("", "bounded", body, pika.BasicProperties(delivery_mode=2))
            assert ready(ch, "bounded") == 50
        # What a reader has seen (on disk) before the kill is what must survive.
        wait_for(lambda: records(broker.ports["HTTP"], "/", limit=0)["next_offset"] == 150)
    finally:
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait()
    again = launch(tmp_path, "--data-dir", str(data_dir), expect=("AMQP", "HTTP"))
    try:
        logged = [base64.b64decode(r["body"]) for r in records(again.ports["HTTP"], "/")["records"]]
        with connect(again.port) as connection:
            ch = connection.channel()
            queued = [body for _m, _p, body in drain(ch, "bounded")]
            assert set(sent) == set(logged) | set(queued)
            assert len(logged) >= 150 and set(sent[:150]) <= set(logged)
            assert len(logged) == len(set(logged))
            ch.queue_declare("one", arguments={"x-max-length": 0})
            ch.basic_publish("", "one", b"after")
            after = wait_records(again.ports["HTTP"], "/", len(logged) + 1)[-1]
        assert after["offset"] == len(logged) and base64.b64decode(after["body"]) == b"after"
    finally:
        again.stop()
