"""The management API's history answers, hutch against the reference
RabbitMQ 3.10: the same objects asked with the same age/increment query
parameters (`lengths_age`/`lengths_incr`, `msg_rates_*`, `data_rates_*`,
`node_stats_*`) must give `*_details` objects of the same shape: the same
keys (`rate`, `samples`, `avg`, `avg_rate`), as many samples, each a
`{"sample", "timestamp"}` pair, newest first, one increment apart, on
multiples of the increment; and the same refusals of bad ranges. Exchanges
and channels must show the same `message_stats` keys for the same traffic,
and the same counts.
"""
from __future__ import annotations

from urllib.parse import quote

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


@pytest.mark.timeout(120)  # it may wait for the suite's broker to be a minute old
def test_detail_objects_have_rabbitmqs_shapes(vhost_on_both, broker, rabbitmq_url):
    hutch, rabbit, vhost = vhost_on_both
    v, queue = segment(vhost), unique("history")
    connections = [fill(hutch, vhost, queue, broker.url), fill(rabbit, vhost, queue, rabbitmq_url)]
    try:
        path = "/api/queues/%s/%s?%s" % (v, queue, RANGES)
        # until both have sampled the 3 messages (RabbitMQ every 5 s)
        wait_for(lambda: all(newest(side.get(path).body.get("messages_details")) == 3 for side in (hutch, rabbit)),
                 30, 0.5, "the queue's samples on both brokers")
        # the vhost's publish samples too, on both (hutch's summed from every shard's reports;
        # RabbitMQ's come with its next 5 s sample, later on a loaded machine)
        wait_for(lambda: all(newest(side.get("/api/vhosts/%s?%s" % (v, RANGES)).body.get("message_stats", {})
                                    .get("publish_details")) == 3 for side in (hutch, rabbit)), 30, 0.5,
                 "the vhost's publish samples on both brokers")
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

        def as_long():
            found = [side.get(nodes % side.get("/api/overview").body["node"]).body for side in (hutch, rabbit)]
            lengths = {len(body[key]["samples"]) for body in found
                       for key in ("mem_used_details", "connection_created_details")}
            return found if len(lengths) == 1 else None

        # A node younger than the range has fewer samples, and the two nodes sample at their own
        # moments (a sample can be due on one and not yet on the other): compared when as long.
        ours, theirs = wait_for(as_long, 70, 0.2, "as many node samples on both")
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


def exchange_and_channel_traffic(url: str, vhost: str):
    """On one connection: a channel publishing with confirms to a fanout
    exchange bound to two queues (through an exchange-to-exchange binding for
    one), an unroutable message each way, and one to the default exchange with
    CC and BCC keys (one naming no queue); a channel getting, consuming and
    acking; one doing nothing. The connection is left open (its channels are
    what is compared)."""
    connection = pika.BlockingConnection(pika.URLParameters(url.rstrip("/") + "/" + segment(vhost)))
    publisher = connection.channel()
    publisher.exchange_declare("fan", "fanout")
    publisher.exchange_declare("next", "fanout")
    publisher.exchange_bind("next", "fan")
    for queue, source in (("q1", "fan"), ("q2", "next")):
        publisher.queue_declare(queue)
        publisher.queue_bind(queue, source)
    publisher.confirm_delivery()
    for _ in range(3):
        publisher.basic_publish("fan", "", b"m")
    with pytest.raises(pika.exceptions.UnroutableError):
        publisher.basic_publish("amq.direct", "nowhere", b"m", mandatory=True)
    publisher.basic_publish("", "nowhere", b"m")
    for queue in ("q3", "q4"):
        publisher.queue_declare(queue)
    publisher.basic_publish("", "q3", b"m", pika.BasicProperties(headers={"CC": ["q4", "missing"], "BCC": ["q3"]}))
    consumer = connection.channel()
    method, _props, _body = consumer.basic_get("q1")
    consumer.basic_ack(method.delivery_tag)
    consumer.basic_get("q1", auto_ack=True)
    got = []
    consumer.basic_consume("q2", lambda ch, m, p, b: got.append(m))
    while len(got) < 3:
        connection.process_data_events(1)
    consumer.basic_reject(got[0].delivery_tag, requeue=True)
    while len(got) < 4:
        connection.process_data_events(1)
    consumer.basic_ack(0, multiple=True)
    connection.channel()
    return connection


def stat_shapes(found: dict) -> dict:
    """The shapes of a channel's message_stats (RabbitMQ's Erlang `reductions_details` left out)."""
    return {path: shape for path, shape in shapes(found).items() if path.startswith("message_stats.")}


def counted(found: dict | None) -> dict:
    return {k: v for k, v in (found or {}).items() if not k.endswith("_details")}


def test_exchange_and_channel_message_stats_are_rabbitmqs(vhost_on_both, broker, rabbitmq_url):
    hutch, rabbit, vhost = vhost_on_both
    v = segment(vhost)
    connections = [exchange_and_channel_traffic(broker.url, vhost), exchange_and_channel_traffic(rabbitmq_url, vhost)]
    try:
        def channels(side) -> dict:
            return {ch["number"]: ch for ch in side.get("/api/vhosts/%s/channels?%s" % (v, RANGES)).body}

        # until both have sampled the publishes and the consumer's acks (RabbitMQ every 5 s)
        wait_for(lambda: all(newest(side.get("/api/exchanges/%s/fan?%s" % (v, RANGES)).body.get(
                     "message_stats", {}).get("publish_in_details")) == 3 and
                     newest(channels(side).get(2, {}).get("message_stats", {}).get("ack_details")) == 4
                     for side in (hutch, rabbit)), 30, 0.5, "the exchange's and channels' samples on both brokers")
        # On a node of several shards each exchange's counters are summed from the shards'
        # reports (each a second apart at most): every exchange compared has them all.
        wait_for(lambda: all(counted(hutch.get("/api/exchanges/%s/%s" % (v, name)).body.get("message_stats")) ==
                             counted(rabbit.get("/api/exchanges/%s/%s" % (v, name)).body.get("message_stats"))
                             for name in ("fan", "next", "amq.direct", "amq.default")), 10, 0.5,
                 "every exchange's counters on hutch")

        for name in ("fan", "next", "amq.direct", "amq.default"):
            path = "/api/exchanges/%s/%s" % (v, name)
            ours, theirs = hutch.get(path).body, rabbit.get(path).body
            assert set(ours) == set(theirs), name
            assert counted(ours.get("message_stats")) == counted(theirs.get("message_stats")), name
            ours, theirs = both(hutch, rabbit, path + "?" + RANGES)
            assert shapes(ours) == shapes(theirs), name
        assert counted(hutch.get("/api/exchanges/%s/fan" % v).body["message_stats"]) == {"publish_in": 3,
                                                                                         "publish_out": 6}
        for listed in ("/api/exchanges/%s?%s" % (v, RANGES), "/api/exchanges/%s?page=1&name=fan&%s" % (v, RANGES)):
            ours, theirs = both(hutch, rabbit, listed)
            ours, theirs = ({x["name"]: x for x in (found["items"] if isinstance(found, dict) else found)}
                            for found in (ours, theirs))
            assert {n: shapes(x) for n, x in ours.items()} == {n: shapes(x) for n, x in theirs.items()}

        ours, theirs = channels(hutch), channels(rabbit)
        assert sorted(ours) == sorted(theirs) == [1, 2, 3]
        for number in (1, 2, 3):
            assert stat_shapes(ours[number]) == stat_shapes(theirs[number]), number
        plain = {ch["number"]: ch for ch in hutch.get("/api/vhosts/%s/channels" % v).body}, \
            {ch["number"]: ch for ch in rabbit.get("/api/vhosts/%s/channels" % v).body}
        for number in (1, 2, 3):
            assert counted(plain[0][number].get("message_stats")) == counted(plain[1][number].get("message_stats"))
        assert "message_stats" not in plain[0][3]
        for side, found in ((hutch, ours), (rabbit, theirs)):
            one = side.get("/api/channels/%s?%s" % (quote(found[1]["name"], safe=""), RANGES)).body
            assert one["deliveries"] == one["publishes"] == []
            found[1] = one
        assert stat_shapes(ours[1]) == stat_shapes(theirs[1])
        for listed in ("/api/channels?" + RANGES,
                       "/api/connections/%s/channels?%s" % (quote(ours[1]["connection_details"]["name"], safe=""),
                                                            RANGES)):
            mine = [ch for ch in hutch.get(listed).body if ch["vhost"] == vhost]
            assert {ch["number"]: stat_shapes(ch) for ch in mine} == {n: stat_shapes(theirs[n]) for n in (1, 2, 3)}
    finally:
        for connection in connections:
            connection.close()
