"""The partition harness, short (tests/partition_kit.py; the long runs are
bench/partitions.py, results in docs/cluster.md): three hutch nodes and
three etcd members, each in its own network namespace, under confirmed
persistent publishing and consuming; the leader isolated from everything,
the leader cut from the followers (not from etcd or the clients), then etcd
split with the leader on the minority side. Checked: no confirmed
message lost, no acked message back beyond what docs/cluster.md allows, at
most one node confirming per term, every node in sync again after healing.

Needs root, `ip` (iproute2), `nft` (nftables), `unshare` and etcd: skipped
without them, a failure when CI is set (.ci/run installs them)."""
from __future__ import annotations

import pytest

from helpers import unavailable
from partition_kit import requirements_missing, run

pytestmark = pytest.mark.timeout(240)

FAULTS = ["leader-isolated", "leader-cut-from-followers", "etcd-split"]


def test_partitions_of_the_leader_lose_nothing_and_heal(tmp_path):
    why = requirements_missing(FAULTS)
    if why is not None:
        unavailable(why)
    # the cut is held until the leader confirms alone, not 20 s (the long runs hold it 20 s)
    report = run(FAULTS, lease_ttl=2, keep=tmp_path / "logs", log=print, cut_until_alone=True)
    print(report)
    assert report["ok"], "; ".join(report["problems"]) + " (logs in %s)" % (tmp_path / "logs")
    isolated, cut, split = report["faults"]
    # The faults did what they are for: another node took over from an isolated leader and from one
    # that lost etcd's majority; a leader cut from its followers only went on confirming (alone, once
    # its followers were dropped after max_lag_seconds) before the cut healed.
    for fault in (isolated, split):
        assert fault["took_over"], fault
    assert cut["confirmed_during"], cut
    for fault in (isolated, cut, split):
        assert fault["in_sync_after"] is not None, fault
    assert report["confirmed"] > 100 and report["terms"] >= 3
