"""hutch's cluster operations in the management API (hutchctl's
cluster_status, forget_cluster_node, transfer_leadership; docs/cluster.md):

- GET /api/hutch/cluster: every member, running or not, its role, its
  replication state and lag, the in-sync set;
- DELETE /api/hutch/cluster/nodes/{node}: forget a stopped member;
- POST /api/hutch/cluster/transfer-leadership {"node": NAME}: a planned
  hand-over to an in-sync follower (of shard 0's group on nodes of
  several shards);
- POST /api/hutch/cluster/rebalance: on nodes of several shards, hand each
  shard's leadership to the node its group prefers (docs/scaling.md),
  answering {"moves": [{"shard", "from", "to"}]}.

On nodes of several shards the status also has "shards": each shard's
group, as the status of its leader (docs/scaling.md).

On a node that runs alone the status lists that node, and the two
operations are refused (400).
"""
from __future__ import annotations

from amqp_server.management import shapes
from amqp_server.management.errors import bad_request
from amqp_server.management.http import NO_CONTENT


def _cluster(req):
    cluster = req.node.cluster
    if cluster is None:
        raise bad_request("this node is not part of a cluster (cluster.etcd is not set)")
    return cluster


def status(req) -> dict:
    cluster = req.node.cluster
    if cluster is None:
        return {"leader": shapes.NODE, "in_sync": [shapes.NODE],
                "nodes": [{"name": shapes.NODE, "running": True, "in_sync": True, "role": "leader",
                           "state": "leading", "lag_bytes": 0, "lag_seconds": 0.0}]}
    return cluster.status()


async def forget(req):
    cluster = _cluster(req)
    try:
        await cluster.forget(req.params["node"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return NO_CONTENT


async def transfer(req):
    cluster = _cluster(req)
    name = req.body().get("node")
    if not isinstance(name, str) or not name:
        raise bad_request("node must be the name of a cluster node")
    try:
        await cluster.transfer(name)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return NO_CONTENT


async def rebalance(req):
    cluster = _cluster(req)
    try:
        return {"moves": await cluster.rebalance()}
    except ValueError as exc:
        raise bad_request(str(exc)) from None
