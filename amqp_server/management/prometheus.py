"""Prometheus text exposition (RabbitMQ's rabbitmq_prometheus plugin).

`/metrics` is aggregated, as RabbitMQ's default endpoint: one sample per
metric for the node. `/metrics/per-object` gives the queue metrics one
sample per queue, labelled {vhost, queue}, as RabbitMQ's endpoint of that
name. Names, types and help texts are RabbitMQ's where RabbitMQ has the
metric; `hutch_` names cover what only hutch has (message states, store
files, the disk writer and fsync latency, MQTT connections and sessions). Everything is read from
counters the broker keeps anyway; a scrape walks the queues once.
"""
from __future__ import annotations

from aiohttp import web
from vhosts.stats import MessageStats

from amqp_server.management import shapes, shards
from amqp_server.management.node import COMPATIBLE_VERSION, STORE_KEY, STORES
from amqp_server.management.rates import Reading

CONTENT_TYPE = "text/plain; version=0.0.4"
GAUGE, COUNTER, UNTYPED = "gauge", "counter", "untyped"
STATES = ("alpha", "gamma", "delta")

# Per queue: (name, type, help, key of its figures: `_queue_figures`).
QUEUE_FAMILIES = (
    ("rabbitmq_queue_messages_ready", GAUGE, "Messages ready to be delivered to consumers", "ready"),
    ("rabbitmq_queue_messages_unacked", GAUGE, "Messages delivered to consumers but not yet acknowledged", "unacked"),
    ("rabbitmq_queue_messages", GAUGE, "Sum of ready and unacknowledged messages - total queue depth", "messages"),
    ("rabbitmq_queue_messages_ready_bytes", GAUGE, "Size in bytes of ready messages (of a stream: its segments)",
     "bytes"),
    ("rabbitmq_queue_messages_paged_out", GAUGE, "Messages paged out to disk", "paged_out"),
    ("rabbitmq_queue_consumers", GAUGE, "Consumers on a queue", "consumers"),
    ("rabbitmq_queue_messages_published_total", COUNTER, "Total number of messages published to queues", "published"),
)
# Node counters: (name, help, value of the summed vhost stats).
GLOBAL_COUNTERS = (
    ("rabbitmq_global_messages_received_total", "Total number of messages received from publishers",
     lambda t: t["publish"]),
    ("rabbitmq_global_messages_delivered_total", "Total number of messages delivered to consumers",
     lambda t: t["deliver_get"]),
    ("rabbitmq_global_messages_delivered_consume_manual_ack_total",
     "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
     lambda t: t["deliver"]),
    ("rabbitmq_global_messages_delivered_consume_auto_ack_total",
     "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment",
     lambda t: t["deliver_no_ack"]),
    ("rabbitmq_global_messages_delivered_get_manual_ack_total",
     "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
     lambda t: t["get"]),
    ("rabbitmq_global_messages_delivered_get_auto_ack_total",
     "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
     lambda t: t["get_no_ack"]),
    ("rabbitmq_global_messages_get_empty_total", "Total number of times basic.get operations fetched no message",
     lambda t: t["get_empty"]),
    ("rabbitmq_global_messages_redelivered_total", "Total number of messages redelivered to consumers",
     lambda t: t["redeliver"]),
    ("rabbitmq_global_messages_acknowledged_total", "Total number of messages acknowledged by consumers",
     lambda t: t["ack"]),
    ("rabbitmq_global_messages_confirmed_total", "Total number of messages confirmed to publishers",
     lambda t: t["confirm"]),
    ("rabbitmq_global_messages_unroutable_returned_total",
     "Total number of messages published as mandatory into an exchange and returned to the publisher as "
     "unroutable", lambda t: t["return_unroutable"]),
    ("rabbitmq_global_messages_unroutable_dropped_total",
     "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
     lambda t: t["drop_unroutable"]),
)
# Churn: (name, help, Churn field).
CHURN_COUNTERS = (
    ("rabbitmq_connections_opened_total", "Total number of connections opened", "connection_created"),
    ("rabbitmq_connections_closed_total", "Total number of connections closed or terminated", "connection_closed"),
    ("rabbitmq_channels_opened_total", "Total number of channels opened", "channel_created"),
    ("rabbitmq_channels_closed_total", "Total number of channels closed", "channel_closed"),
    ("rabbitmq_queues_declared_total", "Total number of queues declared", "queue_declared"),
    ("rabbitmq_queues_created_total", "Total number of queues created", "queue_created"),
    ("rabbitmq_queues_deleted_total", "Total number of queues deleted", "queue_deleted"),
)
STORE_GAUGES = (  # Node.storage_figures' STORE_FIGURES
    ("files", "Message store files"),
    ("bytes_on_disk", "Bytes in message store files"),
    ("live_bytes", "Bytes of messages still referenced in message store files"),
    ("messages", "Messages in the message store"),
)


class Exposition:
    """Metric families in the text format, each with its TYPE and HELP once."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples) -> None:
        """`samples`: (labels dict, value) pairs."""
        self.parts.append("# TYPE %s %s\n# HELP %s %s\n" % (name, kind, name, help_text))
        for labels, value in samples:
            self.parts.append("%s%s %s\n" % (name, _labels(labels), _number(value)))

    def one(self, name: str, kind: str, help_text: str, value, labels: dict | None = None) -> None:
        self.family(name, kind, help_text, [(labels or {}, value)])

    def text(self) -> str:
        return "".join(self.parts)


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (key, _escape(str(value))) for key, value in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _queue_figures(node, queues, found) -> dict:
    """Queue -> its figures for the metrics: this shard's own, or (a queue
    of another shard of the node) its owner's (`found`: the other shards'
    reports); a queue that is down (its shard is not reporting) has none,
    as RabbitMQ exposes no metrics of a queue whose node is down."""
    node_queues = shards.NodeQueues(node, Reading(node.sampler, {}), found)
    out = {}
    for q in queues:
        if node_queues.is_down(q):
            continue
        if getattr(q, "remote", False):
            row = node_queues.figures_of(q)
            ready, unacked, size = row["messages_ready"], row["messages_unacknowledged"], row["message_bytes_ready"]
            states, consumers = row["message_states"], row["consumers"]
            published = row.get("message_stats", {}).get("publish", 0)
        else:
            ready, unacked, size = q.message_count, node_queues.unacked[q], q.size
            states, consumers = q.state_counts(), len(q.consumers)
            published = q.stats.publish
            for stats in node_queues.counted.get((q.vhost, q.name), ()):  # publishes other shards took in
                published += stats.get("publish", 0)
        out[q] = {"ready": ready, "unacked": unacked, "messages": ready + unacked, "bytes": size,
                  "paged_out": states.get("delta", 0), "consumers": consumers, "published": published,
                  "states": states}
    return out


async def render(node, per_object: bool = False) -> str:
    """On a node of several shards: every shard's queues, connections,
    channels and message counters (amqp_server.management.shards)."""
    found = await shards.gathered(node, ("connections", "channels", "queues", "counted", "vhosts", "node"))
    node_figures = shards.node_figures(node, Reading(node.sampler, {}), found)[0]
    vhosts = list(node.broker.vhosts.values())
    queues = [q for v in vhosts for q in v.queues.values()]
    connections = [c for c in list(node.connections) if c.vhost is not None]
    figures = _queue_figures(node, queues, found)
    shown = [q for q in queues if q in figures]  # not down
    states = {q: figures[q]["states"] for q in shown}
    out = Exposition()
    out.one("rabbitmq_build_info", UNTYPED, "RabbitMQ & Erlang/OTP version info", 1,
            {"rabbitmq_version": COMPATIBLE_VERSION, "prometheus_plugin_version": COMPATIBLE_VERSION,
             "product": "hutch"})
    out.one("rabbitmq_identity_info", UNTYPED, "RabbitMQ node & cluster identity info", 1,
            {"rabbitmq_node": shapes.NODE, "rabbitmq_cluster": shapes.NODE})
    out.one("rabbitmq_connections", GAUGE, "Connections currently open",
            len(connections) + len(shards.remote_rows(found, "connections")))
    out.one("rabbitmq_channels", GAUGE, "Channels currently open",
            sum(len(c.channels) for c in connections) + len(shards.remote_rows(found, "channels")))
    out.one("rabbitmq_consumers", GAUGE, "Consumers currently connected",
            sum(figures[q]["consumers"] for q in shown))
    out.one("rabbitmq_queues", GAUGE, "Queues available", len(queues))
    for name, kind, help_text, key in QUEUE_FAMILIES:
        if per_object:
            samples = [({"vhost": q.vhost, "queue": q.name}, figures[q][key]) for q in shown]
        else:
            samples = [({}, sum(figures[q][key] for q in shown))]
        out.family(name, kind, help_text, samples)
    totals = MessageStats().totals()
    for v in vhosts:
        for key, value in v.stats.totals().items():
            totals[key] += value
    for _index, report in found:
        for other in report["vhosts"].values():
            for key in totals:
                totals[key] += other["message_stats"].get(key, 0)
    for name, help_text, value in GLOBAL_COUNTERS:
        out.one(name, COUNTER, help_text, value(totals))
    for name, help_text, key in CHURN_COUNTERS:
        out.one(name, COUNTER, help_text, node_figures[key])
    out.one("rabbitmq_process_resident_memory_bytes", GAUGE, "Memory used in bytes", node_figures["mem_used"])
    out.one("rabbitmq_process_open_fds", GAUGE, "Open file descriptors", node_figures["fd_used"])
    out.one("rabbitmq_process_max_fds", GAUGE, "Open file descriptors limit", node_figures["fd_total"])
    out.one("rabbitmq_process_open_tcp_sockets", GAUGE, "Open TCP sockets", node_figures["sockets_used"])
    out.one("rabbitmq_process_max_tcp_sockets", GAUGE, "Open TCP sockets limit", node_figures["sockets_total"])
    out.one("rabbitmq_resident_memory_limit_bytes", GAUGE, "Memory high watermark in bytes", node.memory_limit)
    out.one("rabbitmq_erlang_uptime_seconds", GAUGE, "Node uptime", round(node.uptime_ms / 1000, 3))
    _disk_metrics(out, node.alarms.disk_free, node.alarms.disk_free_limit)
    out.one("rabbitmq_alarms_memory_used_watermark", UNTYPED, "is 1 if VM memory watermark alarm is in effect",
            int(node_figures["mem_alarm"]))
    out.one("rabbitmq_alarms_free_disk_space_watermark", UNTYPED,
            "is 1 if free disk space watermark alarm is in effect", int(node_figures["disk_free_alarm"]))
    help_states = ("Ready messages by storage state: alpha (in RAM only), gamma (in RAM and on disk), "
                   "delta (on disk only)")
    if per_object:
        samples = [({"vhost": q.vhost, "queue": q.name, "state": s}, states[q].get(s, 0))
                   for q in shown for s in STATES]
    else:
        samples = [({"state": s}, sum(states[q].get(s, 0) for q in shown)) for s in STATES]
    out.family("hutch_queue_messages_state", GAUGE, help_states, samples)
    if per_object:
        out.family("hutch_queue_info", GAUGE, "Queue type (label type: classic or stream)",
                   [({"vhost": q.vhost, "queue": q.name, "type": q.kind}, 1) for q in queues])
    _store_metrics(out, node_figures["storage"])
    _writer_metrics(out, node_figures["storage"])
    _mqtt_metrics(out, node, vhosts)
    if node.cluster is not None:
        _cluster_metrics(out, node.cluster.status())
    return out.text()


def _cluster_metrics(out: Exposition, status: dict) -> None:
    """A cluster's leader: its role, the in-sync followers, each follower's lag."""
    leader = status["leader"]
    out.one("hutch_cluster_role", GAUGE, "1 for this node's role in the cluster (leader or follower)", 1,
            {"node": leader, "role": "leader"})
    followers = [n for n in status["nodes"] if n["role"] == "follower"]
    out.one("hutch_cluster_in_sync_followers", GAUGE, "Followers that hold every confirmed change",
            sum(1 for n in followers if n["in_sync"]))
    out.one("hutch_cluster_in_sync_alarm", GAUGE, "1 while the in-sync set is the leader alone although other "
            "members exist: confirmed messages are on one node's disk only", int(status["in_sync_alarm"]))
    out.one("hutch_cluster_nodes_running", GAUGE, "Cluster members running", sum(1 for n in status["nodes"]
                                                                                    if n["running"]))
    connected = [n for n in followers if n["lag_bytes"] is not None]
    out.family("hutch_cluster_follower_lag_bytes", GAUGE, "Replication bytes a follower has not acknowledged",
               [({"follower": n["name"]}, n["lag_bytes"]) for n in connected])
    out.family("hutch_cluster_follower_lag_seconds", GAUGE,
               "Age of the oldest reply held for a follower's acknowledgement",
               [({"follower": n["name"]}, n["lag_seconds"]) for n in connected])
    shards = status.get("shards")
    if shards:  # nodes of several shards: each shard's group (docs/scaling.md)
        out.family("hutch_cluster_shard_leader", GAUGE, "1 for the node that leads a shard's replication group",
                   [({"shard": str(g["shard"]), "node": g["leader"]}, 1) for g in shards if g["leader"]])
        out.family("hutch_cluster_shard_in_sync_followers", GAUGE, "Followers of a shard's group that hold every "
                   "change it confirmed", [({"shard": str(g["shard"])}, max(0, len(g["in_sync"]) - 1))
                                           for g in shards if g.get("reachable", True)])
        lags = [(g["shard"], n) for g in shards for n in g["nodes"]
                if n["role"] == "follower" and n["lag_bytes"] is not None]
        out.family("hutch_cluster_shard_follower_lag_bytes", GAUGE, "Replication bytes a follower of a shard's "
                   "group has not acknowledged", [({"shard": str(k), "follower": n["name"]}, n["lag_bytes"])
                                                  for k, n in lags])


def _disk_metrics(out: Exposition, free: int, limit: int) -> None:
    out.one("rabbitmq_disk_space_available_bytes", GAUGE, "Disk space available in bytes", free)
    out.one("rabbitmq_disk_space_available_limit_bytes", GAUGE, "Free disk space low watermark in bytes", limit)


def render_follower(name: str, state: str, position: int, leader: str | None, figures: dict) -> str:
    """What a cluster's follower exposes (it runs no broker): its role and
    replication, and its own memory and disk (`figures`:
    amqp_server.shared.figures.member_figures)."""
    out = Exposition()
    out.one("rabbitmq_process_resident_memory_bytes", GAUGE, "Memory used in bytes", figures["mem_used"])
    out.one("rabbitmq_resident_memory_limit_bytes", GAUGE, "Memory high watermark in bytes", figures["mem_limit"])
    _disk_metrics(out, figures["disk_free"], figures["disk_free_limit"])
    out.one("hutch_cluster_role", GAUGE, "1 for this node's role in the cluster (leader or follower)", 1,
            {"node": name, "role": "follower"})
    out.one("hutch_cluster_follower_in_sync_state", GAUGE, "1 while following the live stream, 0 while syncing",
            int(state == "following"), {"leader": leader or ""})
    out.one("hutch_cluster_replicated_position_bytes", GAUGE, "Replication stream position applied here", position)
    return out.text()


def follower_app(render_now) -> web.Application:
    """/metrics of a follower: `render_now()` gives the text."""
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=render_now(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _mqtt_metrics(out: Exposition, node, vhosts) -> None:
    sessions = node.mqtt_sessions
    out.one("hutch_mqtt_connections", GAUGE, "MQTT connections currently open", len(sessions.clients))
    out.one("hutch_mqtt_sessions", GAUGE, "Persistent MQTT sessions kept, connected or not",
            sessions.persistent_count(vhosts))


def _store_metrics(out: Exposition, storage: dict) -> None:
    """Files and bytes of the message stores (persistent and transient) of
    every vhost (`storage`: the node's Node.storage_figures, summed over its shards)."""
    for key, help_text in STORE_GAUGES:
        out.family("hutch_msg_store_" + key, GAUGE, help_text,
                   [({"store": kind}, storage[STORE_KEY % (kind, key)]) for kind in STORES])


def _writer_metrics(out: Exposition, storage: dict) -> None:
    out.one("hutch_memory_used_bytes", GAUGE, "Message bytes held in RAM by queues (the paging budget's use)",
            storage["memory_used"])
    out.one("hutch_memory_budget_bytes", GAUGE, "Message bytes queues may hold in RAM before paging out",
            storage["memory_budget"])
    out.one("hutch_paging_runs_total", COUNTER, "Times queues were asked to page messages out",
            storage["paging_runs"])
    out.one("hutch_writer_pending_bytes", GAUGE, "Bytes queued for the disk writer", storage["writer_pending_bytes"])
    out.one("hutch_writer_group_commits_total", COUNTER, "Group commits run by the disk writer",
            storage["group_commits"])
    out.parts.append("# TYPE hutch_fsync_duration_seconds summary\n"
                     "# HELP hutch_fsync_duration_seconds Time the disk writer spent in fsync, per group commit\n"
                     "hutch_fsync_duration_seconds_count %d\nhutch_fsync_duration_seconds_sum %.6f\n"
                     % (storage["fsync_count"], storage["fsync_seconds"]))


def make_app(node) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=await render(node), headers={"Content-Type": CONTENT_TYPE})

    async def per_object(request: web.Request) -> web.Response:
        return web.Response(text=await render(node, per_object=True), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/per-object", per_object)
    return app
