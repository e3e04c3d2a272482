"""The shard fault soak's short version (tests/shard_soak.py; minutes of it in
bench/shard_soak.py): a node of three shards under confirmed load on a queue of
every shard, clients on other shards than their queues, with random shards
SIGKILLed or stopped; nothing confirmed lost, nothing acked back without a
restart, order kept."""
from __future__ import annotations

import pytest

import shard_soak
from conftest import launch


@pytest.mark.timeout(180)
def test_random_shard_kills_and_stalls_lose_nothing_and_keep_order(tmp_path):
    node = launch(tmp_path, "--shards", "3", "--shard-moves", "false", "--shard-timeout", "2")
    try:
        history, owners = shard_soak.run(node, 3, seconds=16, every=4, seed=39)
    finally:
        node.stop()
    summary = shard_soak.summary(history)
    assert len(summary["faults"]) >= 3, summary
    assert summary["confirmed"] > 100, summary
    assert shard_soak.check(history, owners) == [], summary
