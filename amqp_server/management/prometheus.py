"""Prometheus text exposition at /metrics (RabbitMQ's rabbitmq_prometheus).

Aggregated, as RabbitMQ's default endpoint: one sample per metric for the
node, with RabbitMQ's names, types and help texts where RabbitMQ has the
metric, and `hutch_` names for what only hutch has (message states, store
files, group commits and fsync latency). Everything is read from counters
the broker keeps anyway; a scrape walks the queues once.
"""
from __future__ import annotations


from aiohttp import web

from amqp_server.management import shapes
from amqp_server.management.node import COMPATIBLE_VERSION

CONTENT_TYPE = "text/plain; version=0.0.4"


def _line(out: list, name: str, kind: str, help_text: str, value, labels: str = "") -> None:
    out.append("# TYPE %s %s\n# HELP %s %s\n%s%s %s\n" % (name, kind, name, help_text, name, labels, value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(node) -> str:
    broker = node.broker
    vhosts = list(broker.vhosts.values())
    queues = [q for v in vhosts for q in v.queues.values()]
    connections = [c for c in list(node.connections) if c.vhost is not None]
    unacked = shapes.unacked_by_queue(node.connections)
    totals = dict.fromkeys(("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver",
                            "ack", "confirm", "return_unroutable", "drop_unroutable"), 0)
    for v in vhosts:
        for key in totals:
            totals[key] += getattr(v.stats, key)
    states = dict.fromkeys(("alpha", "gamma", "delta"), 0)
    for q in queues:
        for state, count in q.backing.state_counts().items():
            states[state] = states.get(state, 0) + count
    ready = sum(q.message_count for q in queues)
    held = sum(unacked[q] for q in queues)
    out: list[str] = []
    g, c = "gauge", "counter"
    _line(out, "rabbitmq_build_info", "untyped", "RabbitMQ & Erlang/OTP version info", 1,
          '{rabbitmq_version="%s",prometheus_plugin_version="%s",product="hutch"}'
          % (COMPATIBLE_VERSION, COMPATIBLE_VERSION))
    _line(out, "rabbitmq_identity_info", "untyped", "RabbitMQ node & cluster identity info", 1,
          '{rabbitmq_node="%s",rabbitmq_cluster="%s"}' % (_escape(shapes.NODE), _escape(shapes.NODE)))
    _line(out, "rabbitmq_connections", g, "Connections currently open", len(connections))
    _line(out, "rabbitmq_channels", g, "Channels currently open", sum(len(x.channels) for x in connections))
    _line(out, "rabbitmq_consumers", g, "Consumers currently connected", sum(len(q.consumers) for q in queues))
    _line(out, "rabbitmq_queues", g, "Queues available", len(queues))
    _line(out, "rabbitmq_queue_messages_ready", g, "Messages ready to be delivered to consumers", ready)
    _line(out, "rabbitmq_queue_messages_unacked", g, "Messages delivered to consumers but not yet acknowledged", held)
    _line(out, "rabbitmq_queue_messages", g, "Sum of ready and unacknowledged messages - total queue depth",
          ready + held)
    _line(out, "rabbitmq_queue_messages_ready_bytes", g, "Size in bytes of ready messages",
          sum(q.backing.ready_bytes for q in queues))
    _line(out, "rabbitmq_queue_messages_paged_out", g, "Messages paged out to disk", states["delta"])
    _line(out, "rabbitmq_queue_consumers", g, "Consumers on a queue", sum(len(q.consumers) for q in queues))
    _line(out, "rabbitmq_global_messages_received_total", c, "Total number of messages received from publishers",
          totals["publish"])
    _line(out, "rabbitmq_global_messages_delivered_total", c, "Total number of messages delivered to consumers",
          totals["deliver"] + totals["deliver_no_ack"] + totals["get"] + totals["get_no_ack"])
    _line(out, "rabbitmq_global_messages_delivered_consume_manual_ack_total", c,
          "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
          totals["deliver"])
    _line(out, "rabbitmq_global_messages_delivered_consume_auto_ack_total", c,
          "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment",
          totals["deliver_no_ack"])
    _line(out, "rabbitmq_global_messages_delivered_get_manual_ack_total", c,
          "Total number of messages delivered to consumers using basic.get with manual acknowledgment", totals["get"])
    _line(out, "rabbitmq_global_messages_delivered_get_auto_ack_total", c,
          "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
          totals["get_no_ack"])
    _line(out, "rabbitmq_global_messages_get_empty_total", c,
          "Total number of times basic.get operations fetched no message", totals["get_empty"])
    _line(out, "rabbitmq_global_messages_redelivered_total", c, "Total number of messages redelivered to consumers",
          totals["redeliver"])
    _line(out, "rabbitmq_global_messages_acknowledged_total", c,
          "Total number of messages acknowledged by consumers", totals["ack"])
    _line(out, "rabbitmq_global_messages_confirmed_total", c, "Total number of messages confirmed to publishers",
          totals["confirm"])
    _line(out, "rabbitmq_global_messages_unroutable_returned_total", c,
          "Total number of messages published as mandatory into an exchange and returned to the publisher as "
          "unroutable", totals["return_unroutable"])
    _line(out, "rabbitmq_global_messages_unroutable_dropped_total", c,
          "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
          totals["drop_unroutable"])
    _line(out, "rabbitmq_process_resident_memory_bytes", g, "Memory used in bytes", node.rss_bytes())
    _line(out, "rabbitmq_resident_memory_limit_bytes", g, "Memory high watermark in bytes",
          int(node.monitor.budget / max(node.config.storage.paging_ratio, 1e-9)))
    _line(out, "rabbitmq_erlang_uptime_seconds", g, "Node uptime", round(node.uptime_ms / 1000, 3))
    _line(out, "rabbitmq_alarms_memory_used_watermark", "untyped",
          "is 1 if VM memory watermark alarm is in effect", 0)
    _line(out, "rabbitmq_alarms_free_disk_space_watermark", "untyped",
          "is 1 if free disk space watermark alarm is in effect", 0)
    out.append("# TYPE hutch_queue_messages_state gauge\n"
               "# HELP hutch_queue_messages_state Ready messages by storage state: alpha (in RAM only), "
               "gamma (in RAM and on disk), delta (on disk only)\n")
    out += ['hutch_queue_messages_state{state="%s"} %d\n' % (state, count) for state, count in sorted(states.items())]
    _store_metrics(out, vhosts)
    writer = node.writer
    _line(out, "hutch_memory_used_bytes", g, "Message bytes held in RAM by queues (the paging budget's use)",
          node.monitor.used)
    _line(out, "hutch_memory_budget_bytes", g, "Message bytes queues may hold in RAM before paging out",
          node.monitor.budget)
    _line(out, "hutch_paging_runs_total", c, "Times queues were asked to page messages out", node.monitor.paging_runs)
    _line(out, "hutch_writer_pending_bytes", g, "Bytes queued for the disk writer", writer.pending_bytes)
    _line(out, "hutch_writer_group_commits_total", c, "Group commits run by the disk writer", writer.batches)
    out.append("# TYPE hutch_fsync_duration_seconds summary\n"
               "# HELP hutch_fsync_duration_seconds Time the disk writer spent in fsync, per group commit\n"
               "hutch_fsync_duration_seconds_count %d\nhutch_fsync_duration_seconds_sum %.6f\n"
               % (writer.fsync_count, writer.fsync_seconds))
    return "".join(out)


def _store_metrics(out: list, vhosts) -> None:
    """Files and bytes of the shared message stores (persistent and transient)."""
    stats = {"persistent": {"files": 0, "bytes_on_disk": 0, "live_bytes": 0, "messages": 0},
             "transient": {"files": 0, "bytes_on_disk": 0, "live_bytes": 0, "messages": 0}}
    for v in vhosts:
        storage = v.message_storage
        if storage is None:
            continue
        for kind, store in (("persistent", storage.persistent), ("transient", storage.transient)):
            for key, value in store.stats().items():
                if key in stats[kind]:
                    stats[kind][key] += value
    for key, help_text in (("files", "Message store files"),
                           ("bytes_on_disk", "Bytes in message store files"),
                           ("live_bytes", "Bytes of messages still referenced in message store files"),
                           ("messages", "Messages in the message store")):
        name = "hutch_msg_store_" + key
        out.append("# TYPE %s gauge\n# HELP %s %s\n" % (name, name, help_text))
        out += ['%s{store="%s"} %d\n' % (name, kind, stats[kind][key]) for kind in ("persistent", "transient")]


def make_app(node) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=render(node), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


