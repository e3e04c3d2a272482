"""Exchanges' and channels' message_stats and their history (docs/management.md,
"Rates" and "History"): what real clients did, counted as RabbitMQ 3.10
counts it, on a broker sampling every 0.2 s. The shapes are compared with
RabbitMQ's in tests/differential/test_diff_history.py.
"""
from __future__ import annotations

from urllib.parse import quote

import pika
import pytest

from helpers import unique, wait_for
from http_api import segment

RATES = "msg_rates_age=60&msg_rates_incr=5"


@pytest.fixture
def vhost(sampled):
    _broker, api = sampled
    name = unique("ms-vh")
    assert api.put("/api/vhosts/" + name).status == 201
    yield name
    api.delete("/api/vhosts/" + name)


def opened(broker, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url.rstrip("/") + "/" + segment(vhost)))


def stats(api, path: str) -> dict | None:
    return api.get(path).body.get("message_stats")


def counters(found: dict | None) -> dict:
    return {k: v for k, v in (found or {}).items() if not k.endswith("_details")}


def newest(details: dict) -> int:
    return details["samples"][0]["sample"]


def test_exchanges_count_what_was_published_to_them_and_routed_from_them(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        channel = connection.channel()
        channel.exchange_declare("in", "fanout")
        channel.exchange_declare("out", "fanout")
        channel.exchange_bind("out", "in")
        for queue in ("a", "b"):
            channel.queue_declare(queue)
        channel.queue_bind("a", "in")
        channel.queue_bind("b", "out")
        channel.exchange_declare("quiet", "direct")
        for _ in range(5):
            channel.basic_publish("in", "", b"m")  # to a, and through "out" to b
        channel.basic_publish("", "a", b"m")
        channel.basic_publish("amq.direct", "nowhere", b"m")
        channel.basic_publish("", "nowhere", b"m")
        connection.process_data_events(0)
    # published to "in": 5 in, 10 copies out (through exchange-to-exchange
    # bindings too); "out" was published to by nobody, as RabbitMQ counts it
    assert counters(stats(api, "/api/exchanges/%s/in" % v)) == {"publish_in": 5, "publish_out": 10}
    assert stats(api, "/api/exchanges/%s/out" % v) is None
    assert stats(api, "/api/exchanges/%s/quiet" % v) is None
    # routed nowhere: published in, nothing out (no publish_out at all, as RabbitMQ)
    assert counters(stats(api, "/api/exchanges/%s/amq.direct" % v)) == {"publish_in": 1}
    # the default exchange counts the queue its key names, there or not (RabbitMQ 3.10's count)
    assert counters(stats(api, "/api/exchanges/%s/amq.default" % v)) == {"publish_in": 2, "publish_out": 2}
    listed = {x["name"]: counters(x.get("message_stats")) for x in api.get("/api/exchanges/" + v).body}
    assert listed["in"] == {"publish_in": 5, "publish_out": 10} and listed[""] == {"publish_in": 2, "publish_out": 2}
    everywhere = [x for x in api.get("/api/exchanges").body if x["vhost"] == vhost and x["name"] == "in"]
    assert counters(everywhere[0]["message_stats"]) == {"publish_in": 5, "publish_out": 10}
    # the API's publish counts too (RabbitMQ runs it on a channel)
    api.post("/api/exchanges/%s/in/publish" % v,
             {"routing_key": "", "payload": "x", "payload_encoding": "string", "properties": {}})
    assert counters(stats(api, "/api/exchanges/%s/in" % v)) == {"publish_in": 6, "publish_out": 12}
    assert api.get("/api/vhosts/" + v).body["message_stats"]["publish"] == 9


def test_channels_count_their_publishing_and_consuming_side(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        publisher = connection.channel()
        publisher.confirm_delivery()
        publisher.queue_declare("work")
        for _ in range(4):
            publisher.basic_publish("", "work", b"m")
        with pytest.raises(pika.exceptions.UnroutableError):
            publisher.basic_publish("", "nowhere", b"m", mandatory=True)
        publisher.basic_publish("", "nowhere", b"m")
        consumer = connection.channel()
        method, _props, _body = consumer.basic_get("work")
        consumer.basic_ack(method.delivery_tag)
        consumer.basic_get("work", auto_ack=True)
        consumer.basic_get("work")  # left unacked, then requeued by recover
        consumer.basic_recover(requeue=True)
        delivered = []
        consumer.basic_consume("work", lambda ch, m, p, b: delivered.append(m))
        connection.process_data_events(0)
        wait_for(lambda: connection.process_data_events(0) or len(delivered) == 2, 10, what="two deliveries")
        consumer.basic_ack(0, multiple=True)
        publisher.queue_declare("empty")
        assert consumer.basic_get("empty") == (None, None, None)
        idle = connection.channel()

        names = {ch["number"]: ch["name"] for ch in api.get("/api/vhosts/%s/channels" % v).body}
        found = counters(stats(api, "/api/channels/" + quote(names[publisher.channel_number], safe="")))
        assert found == {"publish": 6, "confirm": 6, "return_unroutable": 1, "drop_unroutable": 1}
        found = wait_for(lambda: (lambda s: s.get("ack") == 3 and s)(counters(
            stats(api, "/api/channels/" + quote(names[consumer.channel_number], safe="")))), 10,
            what="the consumer's acks")
        assert found == {"ack": 3, "deliver": 2, "deliver_get": 5, "deliver_no_ack": 0, "get": 2, "get_empty": 1,
                         "get_no_ack": 1, "redeliver": 1}
        # a channel that did nothing has no message_stats, as in RabbitMQ
        assert stats(api, "/api/channels/" + quote(names[idle.channel_number], safe="")) is None
        connection_name = api.get("/api/vhosts/%s/connections" % v).body[0]["name"]
        for listed in (api.get("/api/channels").body, api.get("/api/vhosts/%s/channels" % v).body,
                       api.get("/api/connections/%s/channels" % quote(connection_name, safe="")).body):
            by_number = {ch["number"]: counters(ch.get("message_stats")) for ch in listed if ch["vhost"] == vhost}
            assert by_number[publisher.channel_number]["publish"] == 6
            assert by_number[consumer.channel_number]["deliver_get"] == 5
            assert by_number[idle.channel_number] == {}
        totals = api.get("/api/vhosts/" + v).body["message_stats"]
    # the vhost's totals are its channels' (and exchanges') counts, and keep
    # them once the channels are closed
    assert counters(totals) == counters(api.get("/api/vhosts/" + v).body["message_stats"])
    assert counters(totals) == {"publish": 6, "confirm": 6, "return_unroutable": 1, "drop_unroutable": 1, "ack": 3,
                                "deliver": 2, "deliver_get": 5, "deliver_no_ack": 0, "get": 2, "get_empty": 1,
                                "get_no_ack": 1, "redeliver": 1}


def test_a_transaction_is_counted_when_committed(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare("tx")
        channel.tx_select()
        channel.basic_publish("", "tx", b"m")
        name = api.get("/api/vhosts/%s/channels" % v).body[0]["name"]
        assert stats(api, "/api/channels/" + quote(name, safe="")) is None
        assert stats(api, "/api/exchanges/%s/amq.default" % v) is None
        channel.tx_commit()
        assert counters(stats(api, "/api/channels/" + quote(name, safe=""))) == {
            "publish": 1, "confirm": 0, "return_unroutable": 0, "drop_unroutable": 0}
        assert counters(stats(api, "/api/exchanges/%s/amq.default" % v)) == {"publish_in": 1, "publish_out": 1}


def test_deleting_an_exchange_keeps_the_vhosts_publishes(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        channel = connection.channel()
        channel.exchange_declare("gone", "fanout")
        for _ in range(3):
            channel.basic_publish("gone", "", b"m")
        channel.exchange_delete("gone")
        channel.exchange_declare("gone", "fanout")  # a new exchange of that name starts from nothing
    assert api.get("/api/vhosts/" + v).body["message_stats"]["publish"] == 3
    assert stats(api, "/api/exchanges/%s/gone" % v) is None


def test_exchanges_and_channels_keep_their_history(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        channel = connection.channel()
        channel.exchange_declare("hist", "fanout")
        channel.queue_declare("hq")
        channel.queue_bind("hq", "hist")
        for _ in range(3):
            channel.basic_publish("hist", "", b"m")
        connection.process_data_events(0)
        path = "/api/exchanges/%s/hist?%s" % (v, RATES)
        found = wait_for(lambda: (lambda s: s and newest(s["publish_in_details"]) == 3 and s)(stats(api, path)), 10,
                         what="the exchange's publishes sampled")
        details = found["publish_in_details"]
        values = [s["sample"] for s in details["samples"]]
        assert len(values) == 13 and values[-1] == 0 and set(values) <= {0, 3}
        assert details["avg"] == pytest.approx(sum(values) / 13)
        assert details["avg_rate"] == pytest.approx(3 / 60)
        assert newest(found["publish_out_details"]) == 3
        listed = api.get("/api/exchanges/%s?page=1&page_size=10&name=hist&%s" % (v, RATES)).body["items"]
        assert newest(listed[0]["message_stats"]["publish_in_details"]) == 3

        name = api.get("/api/vhosts/%s/channels" % v).body[0]["name"]
        path = "/api/channels/%s?%s" % (quote(name, safe=""), RATES)
        found = wait_for(lambda: (lambda s: s and newest(s["publish_details"]) == 3 and s)(stats(api, path)), 10,
                         what="the channel's publishes sampled")
        assert len(found["publish_details"]["samples"]) == 13
        assert set(found["confirm_details"]) == {"samples", "avg", "avg_rate", "rate"}
        listed = api.get("/api/vhosts/%s/channels?%s" % (v, RATES)).body
        assert newest(listed[0]["message_stats"]["publish_details"]) == 3
        # without a range: the rate alone, as before
        assert set(stats(api, "/api/channels/" + quote(name, safe=""))["publish_details"]) == {"rate"}


def test_cc_and_bcc_count_the_queues_the_default_exchange_reaches(sampled, vhost):
    broker, api = sampled
    v = segment(vhost)
    with opened(broker, vhost) as connection:
        channel = connection.channel()
        for queue in ("to", "cc"):
            channel.queue_declare(queue)
        # to "to", CC "cc" and "missing", BCC "to" again: two queues there (RabbitMQ 3.10's count)
        channel.basic_publish("", "to", b"m", pika.BasicProperties(headers={"CC": ["cc", "missing"], "BCC": ["to"]}))
        connection.process_data_events(0)
    assert counters(stats(api, "/api/exchanges/%s/amq.default" % v)) == {"publish_in": 1, "publish_out": 2}
