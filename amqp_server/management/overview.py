"""Handlers for the node as a whole: overview, nodes, whoami, cluster name.
Counts and totals cover what the user may see (`access`)."""
from __future__ import annotations

import os

from routing import EXCHANGE_TYPES
from vhosts.stats import CHURN_FIELDS

from amqp_server.management import access, shapes, shards
from amqp_server.management.errors import not_found
from amqp_server.management.listing import present
from amqp_server.management.node import COMPATIBLE_VERSION

EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
}


def exchange_types() -> list[dict]:
    return [{"name": name, "description": EXCHANGE_TYPE_DESCRIPTIONS.get(name, ""), "enabled": True}
            for name in sorted(EXCHANGE_TYPES)]


def _visible_connections(req) -> list:
    return [c for c in list(req.node.connections) if c.vhost is not None and access.owns(req.user, c)]


# -- overview, nodes, whoami ------------------------------------------------------


async def overview(req) -> dict:
    """On a node of several shards: totals over every shard, as reported
    (amqp_server.management.shards), and the shard count."""
    node, reading = req.node, shapes.reading_of(req)
    vhosts = access.visible_vhosts(req.user, req.broker)
    connections = _visible_connections(req)
    found = await shards.gathered(node, ("connections", "channels", "queues", "vhosts", "node"), reading)
    node_queues = shards.NodeQueues(node, reading, found)
    queue_totals, message_stats = shards.vhost_totals(reading, vhosts, node_queues.unacked, found)
    queues = [q for v in vhosts for q in v.queues.values()]
    out = {
        "management_version": COMPATIBLE_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]},
        "exchange_types": exchange_types(),
        "product_version": COMPATIBLE_VERSION,
        "product_name": "hutch",
        "rabbitmq_version": COMPATIBLE_VERSION,
        "cluster_name": shapes.NODE,
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": message_stats,
        "churn_rates": _churn(shards.node_figures(node, reading, found)[0]),
        "queue_totals": queue_totals,
        "object_totals": {
            "channels": sum(len(c.channels) for c in connections) + len(shards.visible_rows(req, found, "channels")),
            "connections": len(connections) + len(shards.visible_rows(req, found, "connections")),
            "consumers": sum(node_queues.consumer_count(q) for q in queues),
            "exchanges": sum(len(v.exchanges) + 1 for v in vhosts),
            "queues": len(queues),
        },
        "statistics_db_event_queue": 0,
        "node": shapes.NODE,
        "listeners": [
            {"node": shapes.NODE, "protocol": protocol, "ip_address": address, "port": port, "socket_opts": {}}
            for protocol, address, port in node.listeners
        ],
        "contexts": contexts(node),
    }
    if node.shards is not None:
        out["shards"] = shards.shard_count(node)
    return out


def _churn(figures: dict) -> dict:
    """RabbitMQ's churn_rates: the churn counters of the node's figures, with their rates."""
    return {key: figures[key] for field in CHURN_FIELDS for key in (field, field + "_details")}


def contexts(node) -> list[dict]:
    """The HTTP listeners, as RabbitMQ lists its web contexts."""
    return [{"node": shapes.NODE, "description": "RabbitMQ Management", "path": "/", "port": str(port)}
            for protocol, _address, port in node.listeners if protocol == "http"]


async def node_info(req) -> dict:
    """This node: on a node of several shards, its memory, descriptors,
    sockets and churn summed over the shards (shards.node_figures), and
    each shard's own under hutch's `shard_reports`."""
    node, reading = req.node, shapes.reading_of(req)
    found = await shards.gathered(node, ("node",), reading)
    figures, by_shard = shards.node_figures(node, reading, found)
    resources = node.resources()
    storage = figures["storage"]
    out = {
        "name": shapes.NODE,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_used": figures["mem_used"],
        "mem_limit": node.memory_limit,
        "partitions": [],
        "processors": os.cpu_count() or 1,
        "rates_mode": "basic",
        "uptime": node.uptime_ms,
        "run_queue": 0,
        "exchange_types": exchange_types(),
        "auth_mechanisms": [
            {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": True},
            {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True},
        ],
        "db_dir": node.config.data_dir,
        "net_ticktime": 60,
        "mem_calculation_strategy": "rss",
        "sockets_used": figures["sockets_used"],
        "applications": [],
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "contexts": contexts(node),
        "config_files": [],
        "log_files": [],
        # the disk writers' group-commit fsyncs, in RabbitMQ's io_sync fields (ms)
        "io_sync_count": storage["fsync_count"],
        "io_sync_avg_time": round(storage["fsync_seconds"] * 1000 / storage["fsync_count"], 3)
        if storage["fsync_count"] else 0.0,
        **resources,
        "fd_used": figures["fd_used"],
        "fd_total": figures["fd_total"],
        "sockets_total": figures["sockets_total"],
        "mem_alarm": figures["mem_alarm"],
        "disk_free_alarm": figures["disk_free_alarm"],
        **_churn(figures),
    }
    if node.shards is not None:  # the node's shards: processes, each with its own memory and descriptors
        out["shards"] = shards.shard_count(node)
        out["shard_reports"] = shards.breakdown(node, by_shard)
    # RabbitMQ's node_stats fields with their rates (and samples, with a node_stats range)
    for key in shards.PROCESS_FIGURES:
        out[key + "_details"] = figures[key + "_details"]
    out["disk_free_details"] = reading.details([req.broker], ("disk_free",), "node_stats")
    return out


async def _members(req) -> list:
    """This node; in a cluster (this node leads) also every other member,
    with its role and replication state (hutch's `cluster_*` fields) and the
    memory, disk and descriptor figures it last published."""
    listed = [await node_info(req)]
    cluster = req.node.cluster
    if cluster is not None:
        status = cluster.status()
        # nodes of several shards: the shards each member leads (docs/scaling.md)
        leads = {}
        for group in status.get("shards", ()):
            leads.setdefault(group["leader"], []).append(group["shard"])
        for member in status["nodes"]:
            replication = {key: member[key] for key in ("state", "in_sync", "lag_bytes", "lag_seconds")}
            if member["role"] == "leader":
                listed[0].update(cluster_node=member["name"], cluster_role="leader", replication=replication,
                                 in_sync_alarm=cluster.in_sync_alarm)
            else:
                listed.append({"name": "hutch@" + member["name"], "cluster_node": member["name"], "type": "disc",
                               "running": member["running"], "cluster_role": "follower",
                               "replication": replication,
                               **(cluster.figures(member["name"]) if member["running"] else {})})
            if "shards" in status:
                listed[0 if member["role"] == "leader" else -1]["leads_shards"] = leads.get(member["name"], [])
    return listed


async def nodes(req) -> list:
    return present(await _members(req), req.query)


async def node(req) -> dict:
    """One node: this one, or (on a cluster's leader) a member."""
    if req.params["node"] == shapes.NODE:
        return await node_info(req)
    if req.node.cluster is not None:
        for member in (await _members(req))[1:]:
            if member["name"] == req.params["node"]:
                return member
    raise not_found()


def whoami(req) -> dict:
    return {"name": req.user.name, "tags": list(req.user.tags)}


def cluster_name(req) -> dict:
    return {"name": shapes.NODE}


def extensions(req) -> list:
    return []
