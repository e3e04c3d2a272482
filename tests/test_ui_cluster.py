"""The web UI against a real three-node cluster (tests/cluster_kit.py: etcd
and hutch nodes; tests/browser.py: headless Chromium), opened through a
follower, which forwards the management listener to the leader: the
overview's node table and the node pages show each member's role, in-sync
state, replication lag, and the memory and disk figures each member
measured of itself.
"""
from __future__ import annotations

import os

import pytest

from browser import Ui, require_chromium
from cluster_kit import cluster, leader_of, until  # noqa: F401 - cluster is a fixture
from http_api import call

pytestmark = pytest.mark.timeout(150)


def resident_bytes(pid: int) -> int:
    with open("/proc/%d/statm" % pid) as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rows(ui) -> dict:
    """Node name -> {column heading: cell text} of the overview's node table."""
    return ui.driver.execute_script("""
        const table = document.querySelector('#nodes table');
        if (!table) return {};
        const heads = Array.from(table.querySelectorAll('thead th'), th => th.innerText);
        const out = {};
        for (const row of table.querySelectorAll('tbody tr')) {
          const cells = Array.from(row.cells, td => td.innerText);
          out[cells[0]] = Object.fromEntries(heads.map((h, i) => [h, cells[i]]));
        }
        return out;""")


def test_overview_and_node_pages_show_every_member(cluster):
    require_chromium()
    etcd, nodes = cluster
    leader = leader_of(etcd, nodes)
    followers = [n for n in nodes if n is not leader]
    port = leader.ports["http"]

    def members():
        listed = call(port, "GET", "/api/nodes").body
        found = {n.get("cluster_node"): n for n in listed}
        ready = len(found) == 3 and all("mem_used" in found[f.name] for f in followers) and \
            all(found[f.name]["replication"]["state"] == "in sync" for f in followers)
        return found if ready else None

    listed = until(members, 30, "three members, the followers in sync with their figures published")
    for follower in followers:
        shown = listed[follower.name]
        # measured by the follower process itself, not copied from the leader
        assert shown["os_pid"] == str(follower.process.pid)
        assert 0.5 < shown["mem_used"] / resident_bytes(follower.process.pid) < 2
        assert shown["disk_free"] > 0 and shown["mem_limit"] > 0 and shown["fd_used"] > 0

    ui = Ui(followers[0].ports["http"])  # through a follower: it forwards to the leader
    try:
        ui.login("guest", "guest")
        ui.one("#tab-queues")
        table = ui.wait(lambda: (lambda r: r if len(r) == 3 else None)(rows(ui)), "three nodes in the table")
        names = {n.name: "hutch@" + n.name for n in followers}
        leader_row = next(r for name, r in table.items() if name not in names.values())
        assert (leader_row["Role"], leader_row["In sync"], leader_row["Replication"], leader_row["Lag"]) == \
            ("leader", "yes", "leading", "-")
        for follower in followers:
            row = table[names[follower.name]]
            assert (row["Role"], row["In sync"], row["Replication"]) == ("follower", "yes", "in sync")
            assert row["Lag"].endswith(" s") and " / " in row["Lag"]
            assert "high watermark" in row["Memory"] and "free (limit" in row["Disk free"]
            assert row["Running"] == "yes"

        follower = followers[1]
        ui.click_text("#nodes tbody a", names[follower.name])
        ui.wait_text("#view h1", names[follower.name])
        ui.wait(lambda: ui.find("#node-details td"), "the node's details")
        facts = dict(ui.driver.execute_script(
            "return Array.from(document.querySelectorAll('#node-details tr'), r => [r.cells[0].innerText, r.cells[1].innerText])"))
        assert (facts["Role"], facts["In sync"], facts["Running"]) == ("follower", "yes", "yes")
        assert "high watermark" in facts["Memory"]
        assert facts["Process"].startswith("pid %d," % follower.process.pid)
    finally:
        ui.close()
