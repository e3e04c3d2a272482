"""Prometheus metrics on the metrics port: the exposition parses, carries
RabbitMQ's metric names and hutch's own, and the values follow traffic."""
from __future__ import annotations

import re
import urllib.request

from helpers import confirm_channel, connect, drain, publish_n, unique, wait_for
from http_api import Api, segment

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+]+|NaN|\+Inf|-Inf)$')


def scrape(broker, path: str = "/metrics") -> tuple[dict, dict]:
    """(types by metric family, samples by name+labels) of one scrape; every
    line must parse as the text format."""
    url = "http://127.0.0.1:%d%s" % (broker.ports["PROMETHEUS"], path)
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = reply.read().decode()
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            match = SAMPLE.match(line)
            assert match, line
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    for key in samples:
        family = re.sub(r"_(sum|count)$", "", key.split("{")[0])
        assert key.split("{")[0] in types or family in types, key
    return types, samples


def test_metric_names(broker):
    types, samples = scrape(broker)
    for name in ("rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers", "rabbitmq_queues",
                 "rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked", "rabbitmq_queue_messages",
                 "rabbitmq_process_resident_memory_bytes", "rabbitmq_resident_memory_limit_bytes"):
        assert types[name] == "gauge", name
    for name in ("rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
                 "rabbitmq_global_messages_acknowledged_total", "rabbitmq_global_messages_confirmed_total",
                 "rabbitmq_global_messages_unroutable_dropped_total"):
        assert types[name] == "counter", name
    for state in ("alpha", "gamma", "delta"):
        assert 'hutch_queue_messages_state{state="%s"}' % state in samples
    assert 'hutch_msg_store_files{store="persistent"}' in samples
    assert types["hutch_fsync_duration_seconds"] == "summary"
    assert "hutch_fsync_duration_seconds_count" in samples and "hutch_fsync_duration_seconds_sum" in samples
    assert samples["rabbitmq_process_resident_memory_bytes"] > 0


def test_metrics_follow_traffic(broker, conn):
    _, before = scrape(broker)
    channel = confirm_channel(conn)
    queue = channel.queue_declare(unique("metrics"), durable=True).method.queue
    publish_n(channel, queue, 5)
    channel.basic_publish("", unique("nowhere"), b"dropped")
    _, during = scrape(broker)
    assert during["rabbitmq_global_messages_received_total"] - before["rabbitmq_global_messages_received_total"] >= 6
    assert during["rabbitmq_global_messages_confirmed_total"] - before["rabbitmq_global_messages_confirmed_total"] >= 6
    assert during["rabbitmq_global_messages_unroutable_dropped_total"] > \
        before["rabbitmq_global_messages_unroutable_dropped_total"]
    assert during["rabbitmq_queue_messages_ready"] >= 5
    assert during["rabbitmq_connections"] >= 1 and during["rabbitmq_queues"] >= 1
    assert during["hutch_fsync_duration_seconds_count"] >= before["hutch_fsync_duration_seconds_count"]
    drain(channel, queue, auto_ack=False)
    channel.basic_ack(0, multiple=True)

    def acked_since_before():
        samples = scrape(broker)[1]
        acked = samples["rabbitmq_global_messages_acknowledged_total"] - before[
            "rabbitmq_global_messages_acknowledged_total"]
        return samples if acked >= 5 else None

    after = wait_for(acked_since_before)
    assert after["rabbitmq_global_messages_delivered_get_manual_ack_total"] - \
        before["rabbitmq_global_messages_delivered_get_manual_ack_total"] >= 5
    channel.queue_delete(queue)


def test_per_object_metrics_label_each_queue(broker):
    api = Api(broker.ports["HTTP"])
    queue = unique('per "object"')  # declared over HTTP: a quote must be escaped in the label
    path = "/api/queues/%2F/" + segment(queue)
    api.put(path, {"durable": False})
    for _ in range(3):
        api.post("/api/exchanges/%2F/amq.default/publish",
                 {"properties": {}, "routing_key": queue, "payload": "m", "payload_encoding": "string"})
    _types, samples = scrape(broker, "/metrics/per-object")
    labels = '{vhost="/",queue="%s"}' % queue.replace('"', '\\"')
    assert samples["rabbitmq_queue_messages_ready" + labels] == 3
    assert samples["rabbitmq_queue_messages_published_total" + labels] == 3
    assert samples['hutch_queue_messages_state{vhost="/",queue="%s",state="alpha"}' % queue.replace('"', '\\"')] \
        == 3
    api.delete(path)


def test_churn_counters(broker):
    api = Api(broker.ports["HTTP"])
    _, before = scrape(broker)
    churn_before = api.get("/api/overview").body["churn_rates"]
    connection = connect(broker.port)
    channel = connection.channel()
    connection.channel().close()
    name = channel.queue_declare(unique("churn")).method.queue
    channel.queue_declare(name, passive=True)
    channel.queue_declare(name)
    channel.queue_delete(name)
    connection.close()

    def counted():
        samples = scrape(broker)[1]
        return samples if samples["rabbitmq_connections_closed_total"] > before[
            "rabbitmq_connections_closed_total"] else None

    after = wait_for(counted)
    for metric, least in (("rabbitmq_connections_opened_total", 1), ("rabbitmq_connections_closed_total", 1),
                          ("rabbitmq_channels_opened_total", 2), ("rabbitmq_channels_closed_total", 2),
                          ("rabbitmq_queues_declared_total", 2), ("rabbitmq_queues_created_total", 1),
                          ("rabbitmq_queues_deleted_total", 1)):
        assert after[metric] - before[metric] >= least, metric
    churn = api.get("/api/overview").body["churn_rates"]
    assert churn["queue_created"] > churn_before["queue_created"]
    assert churn["channel_closed"] >= churn_before["channel_closed"] + 2
    assert "rate" in churn["connection_created_details"]
