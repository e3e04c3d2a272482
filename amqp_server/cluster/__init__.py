"""Replication and automatic failover (docs/cluster.md).

One node is the leader and owns all state; the others follow it. etcd (an
external service, asked through `etcd.Etcd`) elects the leader and keeps the
membership (`node.ClusterNode`); the leader holds an etcd lease and stops
answering before it can run out (`lease.LeaseKeeper`).
"""
