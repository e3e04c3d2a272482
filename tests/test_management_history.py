"""The management API's history of rates and lengths (docs/management.md,
"History"): a broker sampling every 0.2 s, asked with RabbitMQ's
age/increment query parameters. The shapes are compared with RabbitMQ's in
tests/differential/test_diff_history.py; here, what the samples say.
"""
from __future__ import annotations

import time

import pytest

from helpers import connect, unique, wait_for


LENGTHS = "lengths_age=60&lengths_incr=5"


def samples(details: dict) -> list[int]:
    return [s["sample"] for s in details["samples"]]


def test_samples_follow_a_queue_and_their_summary_is_rabbitmqs(sampled):
    broker, api = sampled
    queue = unique("hist")
    started = time.time() * 1000
    connection = connect(broker.port)
    channel = connection.channel()
    channel.queue_declare(queue)
    for _ in range(4):
        channel.basic_publish("", queue, b"m")
    path = "/api/queues/%2F/" + queue + "?" + LENGTHS + "&msg_rates_age=60&msg_rates_incr=5"
    found = wait_for(lambda: (lambda q: samples(q["messages_details"])[0] == 4 and q)(api.get(path).body), 10,
                     what="the 4 messages sampled")
    lengths = found["messages_details"]
    values, times = samples(lengths), [s["timestamp"] for s in lengths["samples"]]
    assert len(values) == 13 and times == sorted(times, reverse=True)
    assert {a - b for a, b in zip(times, times[1:])} == {5000} and times[0] % 5000 == 0
    assert times[0] >= started  # the newest sample is now (rounded up to the increment)
    # before the queue existed it held nothing; it holds 4 now
    assert values[-1] == 0 and values[0] == 4 and set(values) <= {0, 4}
    assert lengths["avg"] == pytest.approx(sum(values) / 13)
    assert lengths["avg_rate"] == pytest.approx((values[0] - values[-1]) / 60)
    assert lengths["rate"] == pytest.approx((values[0] - values[1]) / 5)
    assert samples(found["messages_ready_details"]) == values
    assert set(samples(found["messages_unacknowledged_details"])) == {0}
    assert samples(found["message_stats"]["publish_details"])[0] == 4  # a counter: the total so far

    # a consumer holding one unacked: the unacked lengths follow
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, lambda *args: None)
    wait_for(lambda: samples(api.get(path).body["messages_unacknowledged_details"])[0] == 1, 10,
             what="one unacked sampled")
    assert samples(api.get(path).body["messages_details"])[0] == 4
    connection.close()


def test_vhost_overview_and_lists_sum_their_queues(sampled):
    broker, api = sampled
    vhost = unique("hist-vh")
    assert api.put("/api/vhosts/" + vhost).status == 201
    names = [unique("hq") for _ in range(2)]
    for i, name in enumerate(names):
        api.put("/api/queues/%s/%s" % (vhost, name))
        for _ in range(i + 1):
            api.post("/api/exchanges/%s/amq.default/publish" % vhost,
                     {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}})
    wait_for(lambda: samples(api.get("/api/vhosts/%s?%s" % (vhost, LENGTHS)).body["messages_details"])[0] == 3,
             10, what="the vhost's 3 messages sampled")
    listed = api.get("/api/queues/%s?page=1&page_size=10&%s" % (vhost, LENGTHS)).body["items"]
    assert sorted(samples(q["messages_details"])[0] for q in listed) == [1, 2]
    overview = api.get("/api/overview?" + LENGTHS).body["queue_totals"]
    assert samples(overview["messages_details"])[0] == overview["messages"] >= 3
    api.delete("/api/vhosts/" + vhost)


def test_a_recreated_queue_starts_from_nothing(sampled):
    _broker, api = sampled
    name = unique("hist-again")
    path = "/api/queues/%2F/" + name
    api.put(path)
    api.post("/api/exchanges/%2F/amq.default/publish",
             {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}})
    wait_for(lambda: samples(api.get(path + "?" + LENGTHS).body["messages_details"])[0] == 1, 10)
    api.delete(path)
    api.put(path)
    wait_for(lambda: set(samples(api.get(path + "?" + LENGTHS).body["messages_details"])) == {0}, 10,
             what="the new queue's history empty")


def test_the_node_keeps_its_figures(sampled):
    _broker, api = sampled
    name = api.get("/api/overview").body["node"]
    node = api.get("/api/nodes/%s?node_stats_age=60&node_stats_incr=5" % name).body
    memory = samples(node["mem_used_details"])
    assert memory[0] > 0 and len(memory) == 13
    assert samples(node["disk_free_details"])[0] > 0
    # without a range: the rate alone, as before
    assert set(api.get("/api/nodes/" + name).body["mem_used_details"]) == {"rate"}


def test_a_connection_keeps_its_data_rates(sampled):
    broker, api = sampled
    connection = connect(broker.port, client_properties={"connection_name": "history"})
    try:
        def found():
            for c in api.get("/api/connections?data_rates_age=60&data_rates_incr=5").body:
                if c["client_properties"].get("connection_name") == "history" and samples(c["recv_oct_details"])[0]:
                    return c
            return None

        shown = wait_for(found, 10, what="the connection's bytes sampled")
        assert samples(shown["recv_oct_details"])[0] <= shown["recv_oct"]
    finally:
        connection.close()


def test_bad_ranges_are_refused(sampled):
    _broker, api = sampled
    for query in ("lengths_age=2505&lengths_incr=5", "node_stats_age=-1&node_stats_incr=5"):
        for path in ("/api/overview", "/api/queues", "/api/vhosts/%2F", "/api/connections"):
            answer = api.get(path + "?" + query)
            assert answer.status == 400, (path, query)
            assert answer.body["error"] == "bad_request"
