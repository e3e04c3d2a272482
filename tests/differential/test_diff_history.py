"""The management API's history answers, hutch against the reference
RabbitMQ 3.10: the same objects asked with the same age/increment query
parameters (`lengths_age`/`lengths_incr`, `msg_rates_*`, `data_rates_*`,
`node_stats_*`) must give `*_details` objects of the same shape: the same
keys (`rate`, `samples`, `avg`, `avg_rate`), as many samples, each a
`{"sample", "timestamp"}` pair, newest first, one increment apart, on
multiples of the increment; and the same refusals of bad ranges.
"""
from __future__ import annotations

import pika
import pytest

from helpers import unique, wait_for
from http_api import segment

pytestmark = pytest.mark.differential

RANGES = "lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5&data_rates_age=60&data_rates_incr=5"


def shapes(answer, path: str = "") -> dict:
    """path -> shape of every `*_details` object in `answer`."""
    found = {}
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key.endswith("_details") and isinstance(value, dict) and "rate" in value:
                found[path + key] = detail_shape(value)
            else:
                found.update(shapes(value, path + key + "."))
    return found


def detail_shape(details: dict) -> tuple:
    samples = details.get("samples")
    if samples is None:
        return (tuple(sorted(details)),)
    times = [s["timestamp"] for s in samples]
    steps = {a - b for a, b in zip(times, times[1:])}
    return (tuple(sorted(details)), len(samples), {tuple(sorted(s)) for s in samples}, steps,
            {type(s["sample"]) for s in samples} <= {int}, times[0] % 5000 == 0)


def newest(details: dict | None) -> int | None:
    """The newest sample (None while RabbitMQ has not reported the field yet)."""
    return details["samples"][0]["sample"] if details else None


def fill(side, vhost: str, queue: str, url: str):
    """A queue holding 3 messages published through the API, and an open
    AMQP connection (for the data rates)."""
    v = segment(vhost)
    assert side.put("/api/queues/%s/%s" % (v, queue), {"durable": False}).status == 201
    for _ in range(3):
        side.post("/api/exchanges/%s/amq.default/publish" % v,
                  {"routing_key": queue, "payload": "x", "payload_encoding": "string", "properties": {}})
    connection = pika.BlockingConnection(pika.URLParameters(url.rstrip("/") + "/" + v))
    connection.channel()
    return connection


def both(hutch, rabbit, path: str) -> tuple:
    return hutch.get(path).body, rabbit.get(path).body


def test_detail_objects_have_rabbitmqs_shapes(vhost_on_both, broker, rabbitmq_url):
    hutch, rabbit, vhost = vhost_on_both
    v, queue = segment(vhost), unique("history")
    connections = [fill(hutch, vhost, queue, broker.url), fill(rabbit, vhost, queue, rabbitmq_url)]
    try:
        path = "/api/queues/%s/%s?%s" % (v, queue, RANGES)
        # until both have sampled the 3 messages (RabbitMQ every 5 s)
        wait_for(lambda: all(newest(side.get(path).body.get("messages_details")) == 3 for side in (hutch, rabbit)),
                 30, 0.5, "the queue's samples on both brokers")
        ours, theirs = both(hutch, rabbit, path)
        for key in ("messages_details", "messages_ready_details", "messages_unacknowledged_details",
                    "message_stats.publish_details"):
            assert key in shapes(ours), key
        assert {p: s for p, s in shapes(ours).items() if p in shapes(theirs)} == \
               {p: s for p, s in shapes(theirs).items() if p in shapes(ours)}
        assert shapes(ours)["messages_details"][1] == 13  # 60 s in 5 s steps, both ends included
        assert newest(ours["message_stats"]["publish_details"]) == 3

        for listed in ("/api/queues/%s?%s" % (v, RANGES),
                       "/api/queues/%s?page=1&page_size=10&name=%s&%s" % (v, queue, RANGES)):
            ours, theirs = both(hutch, rabbit, listed)
            ours, theirs = (found["items"] if isinstance(found, dict) else found for found in (ours, theirs))
            assert len(ours) == len(theirs) == 1
            assert shapes(ours[0])["messages_details"] == shapes(theirs[0])["messages_details"]

        ours, theirs = both(hutch, rabbit, "/api/vhosts/%s?%s" % (v, RANGES))
        for key in ("messages_details", "messages_ready_details", "message_stats.publish_details"):
            assert shapes(ours)[key] == shapes(theirs)[key], key

        ours, theirs = both(hutch, rabbit, "/api/overview?" + RANGES)
        for key in ("queue_totals.messages_details", "message_stats.publish_details"):
            assert shapes(ours)[key] == shapes(theirs)[key], key

        ours, theirs = both(hutch, rabbit, "/api/vhosts/%s/connections?%s" % (v, RANGES))
        assert len(ours) == len(theirs) == 1
        for key in ("recv_oct_details", "send_oct_details"):
            assert shapes(ours[0])[key] == shapes(theirs[0])[key], key

        nodes = "/api/nodes/%s?node_stats_age=60&node_stats_incr=5"
        ours = hutch.get(nodes % hutch.get("/api/overview").body["node"]).body
        theirs = rabbit.get(nodes % rabbit.get("/api/overview").body["node"]).body
        for key in ("mem_used_details", "fd_used_details", "sockets_used_details", "disk_free_details",
                    "connection_created_details", "queue_declared_details"):
            assert shapes(ours)[key] == shapes(theirs)[key], key
    finally:
        for connection in connections:
            connection.close()


@pytest.mark.parametrize("query", [
    "lengths_age=60&lengths_incr=120",  # one sample: no avg, no avg_rate
    "lengths_age=60",  # without its increment a range is not asked for
    "lengths_incr=5",
    "lengths_age=abc&lengths_incr=5",
    "lengths_age=2500&lengths_incr=5",  # 501 samples, the most
])
def test_partial_ranges_are_answered_as_rabbitmq_answers_them(vhost_on_both, query):
    hutch, rabbit, vhost = vhost_on_both
    queue = unique("history")
    path = "/api/queues/%s/%s" % (segment(vhost), queue)
    for side in (hutch, rabbit):
        assert side.put(path, {"durable": False}).status == 201
    # RabbitMQ reports a queue's lengths from its first statistics event on
    wait_for(lambda: all("messages_details" in side.get(path).body for side in (hutch, rabbit)), 30, 0.5,
             "the queue's lengths on both brokers")
    ours, theirs = both(hutch, rabbit, path + "?" + query)
    assert shapes(ours)["messages_details"] == shapes(theirs)["messages_details"]


@pytest.mark.parametrize("query", [
    "lengths_age=2505&lengths_incr=5", "lengths_age=0&lengths_incr=5", "msg_rates_age=60&msg_rates_incr=0",
    "data_rates_age=60&data_rates_incr=-5",
])
def test_bad_ranges_are_refused_as_rabbitmq_refuses_them(vhost_on_both, query):
    hutch, rabbit, vhost = vhost_on_both
    path = "/api/vhosts/%s?%s" % (segment(vhost), query)
    ours, theirs = hutch.get(path), rabbit.get(path)
    assert (ours.status, ours.body) == (theirs.status, theirs.body)
    assert ours.status == 400 and ours.body["reason"].startswith("Invalid range parameters: age ")
