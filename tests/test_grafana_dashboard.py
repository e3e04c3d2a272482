"""The Grafana dashboard in docs/grafana/hutch-overview.json: every query
names metrics hutch exports, as scraped from real processes - a broker's
/metrics and /metrics/per-object, and a real three-node cluster's leader
and follower /metrics (tests/cluster_kit.py) - so no panel stays empty
for want of a metric.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cluster_kit import cluster, leader_of, until  # noqa: F401 - cluster is a fixture
from http_api import call

pytestmark = pytest.mark.timeout(150)

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "hutch-overview.json"
METRIC = re.compile(r"\b((?:rabbitmq|hutch)_[a-z0-9_]+)\b")
# label names that share the prefix (label_values(..., rabbitmq_cluster) and the like)
LABELS = {"rabbitmq_cluster", "rabbitmq_node", "rabbitmq_version"}


def panels(items: list) -> list:
    out = []
    for panel in items:
        out.append(panel)
        out.extend(panels(panel.get("panels", [])))
    return out


def queries(dashboard: dict) -> list[str]:
    found = [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"])
    return found


def exported(port: int, path: str = "/metrics") -> set[str]:
    reply = call(port, "GET", path)
    assert reply.status == 200
    text = reply.body if isinstance(reply.body, str) else reply.body.decode()
    return {re.split(r"[{ ]", line, 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_dashboard_is_grafanas_and_each_panel_queries(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "hutch-overview" and dashboard["schemaVersion"] >= 30
    shown = [p for p in panels(dashboard["panels"]) if p["type"] != "row"]
    assert len(shown) >= 30
    for panel in shown:
        assert panel["targets"] and all(t["expr"].count("(") == t["expr"].count(")") for t in panel["targets"]), \
            panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
    assert len({p["id"] for p in panels(dashboard["panels"])}) == len(panels(dashboard["panels"]))


def test_every_query_names_a_metric_hutch_exports(broker, cluster):
    etcd, nodes = cluster
    leader = leader_of(etcd, nodes)
    follower = next(n for n in nodes if n is not leader)
    # the leader reports its followers' lag once they are connected
    until(lambda: "hutch_cluster_follower_lag_bytes" in exported(leader.ports["prometheus"]), 30, "the lag metrics")
    names = (exported(broker.ports["PROMETHEUS"]) | exported(broker.ports["PROMETHEUS"], "/metrics/per-object")
             | exported(leader.ports["prometheus"]) | exported(follower.ports["prometheus"]))
    used = {name for query in queries(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(query)} - LABELS
    assert used - names == set()
    # the cluster's metrics are charted, and a follower's own memory and disk
    assert {"hutch_cluster_role", "hutch_cluster_follower_lag_bytes", "hutch_cluster_follower_lag_seconds",
            "hutch_cluster_in_sync_followers", "hutch_cluster_nodes_running",
            "hutch_cluster_follower_in_sync_state"} <= used
    assert {"rabbitmq_process_resident_memory_bytes", "rabbitmq_disk_space_available_bytes"} <= \
        exported(follower.ports["prometheus"])
