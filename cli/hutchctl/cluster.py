"""Cluster commands (docs/cluster.md): cluster_status, forget_cluster_node,
transfer_leadership. They use hutch's API extension under /api/hutch/cluster;
any node answers (a follower forwards the management API to the leader).
"""
from __future__ import annotations

import json

from cli.hutchctl.client import path
from cli.hutchctl.command import Command, Context, hutch_extension


def _lag(node: dict) -> str:
    if node["role"] == "leader":
        return "leader"
    if node.get("lag_bytes") is None:
        return node["state"]
    return "%s, %d bytes behind, oldest held reply %.3f s" % (node["state"], node["lag_bytes"], node["lag_seconds"])


def cluster_status(ctx: Context, args: list[str], opts: dict) -> None:
    status = hutch_extension(ctx.client.get, path("hutch", "cluster"), "cluster")
    nodes = status["nodes"]
    if ctx.out.formatter == "json":
        ctx.out.line(json.dumps({
            "leader": status["leader"], "disk_nodes": [n["name"] for n in nodes],
            "running_nodes": [n["name"] for n in nodes if n["running"]], "in_sync_nodes": status["in_sync"],
            "nodes": nodes}, separators=(",", ":")))
        return
    ctx.out.banner(f"Cluster status of node {status['leader']} ...")
    sections = [
        ("Basics", [f"Leader: {status['leader']}"]),
        ("Disk Nodes", [n["name"] for n in nodes]),
        ("Running Nodes", [n["name"] for n in nodes if n["running"]]),
        ("In-sync Nodes", status["in_sync"]),
        ("Replication", [f"{n['name']}: {_lag(n)}" for n in nodes]),
    ]
    for title, lines in sections:
        ctx.out.line(title)
        ctx.out.line("")
        for text in lines:
            ctx.out.line(text)
        ctx.out.line("")


def forget_cluster_node(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f"Removing node {args[0]} from the cluster")
    hutch_extension(ctx.client.delete, path("hutch", "cluster", "nodes", args[0]), "cluster", missing=(405,))


def transfer_leadership(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f"Transferring the leadership to node {args[0]} ...")
    hutch_extension(ctx.client.post, path("hutch", "cluster", "transfer-leadership"), "cluster",
                    {"node": args[0]}, missing=(404, 405))


COMMANDS = (
    Command("cluster_status", "", "Displays all the nodes in the cluster, the leader, and each follower's "
            "replication state and lag", cluster_status),
    Command("forget_cluster_node", "<existing_cluster_member_node>",
            "Removes a stopped node from the cluster", forget_cluster_node, 1, 1),
    Command("transfer_leadership", "<node>", "Hands the leadership to an in-sync follower without losing a "
            "confirmed message", transfer_leadership, 1, 1),
)
