"""Cluster commands (docs/cluster.md): cluster_status, forget_cluster_node,
transfer_leadership, rebalance (docs/scaling.md). They use hutch's API
extension under /api/hutch/cluster; any node answers (a follower forwards
the management API to the leader). force_boot acts on a node's data
directory instead (as rabbitmqctl's does on the node's database): the node
it names may be waiting for peers, with no leader to answer the API.
"""
from __future__ import annotations

import json
import os

from cli.hutchctl.client import path
from cli.hutchctl.command import BadArgument, Command, Context, error, hutch_extension


def _lag(node: dict) -> str:
    if node["role"] == "leader":
        return "leader"
    if node.get("lag_bytes") is None:
        return node["state"]
    return "%s, %d bytes behind, oldest held reply %.3f s" % (node["state"], node["lag_bytes"], node["lag_seconds"])


def cluster_status(ctx: Context, args: list[str], opts: dict) -> None:
    status = hutch_extension(ctx.client.get, path("hutch", "cluster"), "cluster")
    nodes = status["nodes"]
    shards = status.get("shards")
    if ctx.out.formatter == "json":
        ctx.out.line(json.dumps({
            "leader": status["leader"], "disk_nodes": [n["name"] for n in nodes],
            "running_nodes": [n["name"] for n in nodes if n["running"]], "in_sync_nodes": status["in_sync"],
            "nodes": nodes, **({"shards": shards} if shards else {})}, separators=(",", ":")))
        return
    ctx.out.banner(f"Cluster status of node {status['leader']} ...")
    sections = [
        ("Basics", [f"Leader: {status['leader']}"]),
        ("Disk Nodes", [n["name"] for n in nodes]),
        ("Running Nodes", [n["name"] for n in nodes if n["running"]]),
        ("In-sync Nodes", status["in_sync"]),
        ("Replication", [f"{n['name']}: {_lag(n)}" for n in nodes]),
    ]
    if shards:  # nodes of several shards: each shard's group, and how many each node leads
        led = {n["name"]: [g["shard"] for g in shards if g["leader"] == n["name"]] for n in nodes}
        sections.append(("Shard Leaders", [_shard(g) for g in shards]))
        sections.append(("Balance", [f"{name}: leads {len(ids)} of {len(shards)} shards" +
                                     (f" ({', '.join(map(str, ids))})" if ids else "")
                                     for name, ids in led.items()]))
    for title, lines in sections:
        ctx.out.line(title)
        ctx.out.line("")
        for text in lines:
            ctx.out.line(text)
        ctx.out.line("")


def _shard(group: dict) -> str:
    if not group["leader"]:
        return f"shard {group['shard']}: no leader"
    if group.get("reachable") is False:
        return f"shard {group['shard']}: {group['leader']} (not linked to shard 0's leader)"
    lags = "; ".join(f"{n['name']}: {_lag(n)}" for n in group["nodes"] if n["role"] == "follower")
    return f"shard {group['shard']}: {group['leader']}, in sync: {', '.join(group['in_sync'])}" + \
        (f"; {lags}" if lags else "")


def rebalance(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner("Re-balancing the shards' leaders over the cluster's nodes ...")
    answer = hutch_extension(ctx.client.post, path("hutch", "cluster", "rebalance"), "cluster", {},
                             missing=(404, 405))
    moves = (answer or {}).get("moves", [])
    if ctx.out.formatter == "json":
        ctx.out.line(json.dumps(moves, separators=(",", ":")))
        return
    for move in moves:
        ctx.out.line(f"shard {move['shard']}: leadership handed from {move['from']} to {move['to']}")
    if not moves:
        ctx.out.line("Every shard is led by the node it should be")


def forget_cluster_node(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f"Removing node {args[0]} from the cluster")
    hutch_extension(ctx.client.delete, path("hutch", "cluster", "nodes", args[0]), "cluster", missing=(405,))


def transfer_leadership(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f"Transferring the leadership to node {args[0]} ...")
    hutch_extension(ctx.client.post, path("hutch", "cluster", "transfer-leadership"), "cluster",
                    {"node": args[0]}, missing=(404, 405))


FORCE_BOOT = "force_boot"  # amqp_server.cluster.state.FORCE_BOOT


def force_boot(ctx: Context, args: list[str], opts: dict) -> None:
    directory = opts.get("--data-dir")
    if not directory:
        raise BadArgument("--data-dir <the node's data directory> is required.")
    if not os.path.isfile(os.path.join(directory, "cluster_state")) and \
            not os.path.isfile(os.path.join(directory, "definitions.db")):
        raise error(f"{directory} is not a hutch data directory (no definitions.db, no cluster_state)")
    ctx.out.banner(f"Ensuring the node with data directory {directory} leads: it campaigns with its data "
                   "as soon as no node leads, whatever the others hold ...")
    # a node of several shards: every shard's group too (DATA_DIR/shards/K, docs/scaling.md)
    shards = os.path.join(directory, "shards")
    groups = [os.path.join(shards, name) for name in sorted(os.listdir(shards)) if name.isdigit() and
              os.path.isfile(os.path.join(shards, name, "cluster_state"))] if os.path.isdir(shards) else []
    for target in [directory] + groups:
        try:
            with open(os.path.join(target, FORCE_BOOT), "w") as marker:
                marker.write("written by hutchctl force_boot\n")
        except OSError as exc:
            raise error(f"cannot write to {target}: {exc.strerror or exc}") from None


COMMANDS = (
    Command("cluster_status", "", "Displays all the nodes in the cluster, the leader, and each follower's "
            "replication state and lag", cluster_status),
    Command("forget_cluster_node", "<existing_cluster_member_node>",
            "Removes a stopped node from the cluster", forget_cluster_node, 1, 1),
    Command("transfer_leadership", "<node>", "Hands the leadership to an in-sync follower without losing a "
            "confirmed message", transfer_leadership, 1, 1),
    Command("rebalance", "", "Hands each shard's leadership to the node it should be on, spreading the leaders "
            "over the nodes without losing a confirmed message", rebalance),
    Command("force_boot", "--data-dir <directory>", "Makes the node of this data directory lead, with its "
            "data, without waiting for the other members (the others set aside what differs)", force_boot,
            options={"--data-dir": True}),
)
