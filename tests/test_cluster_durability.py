"""Durability made visible, and kept by the management API
(tests/cluster_kit.py: real etcd, real hutch processes): the in-sync alarm
when only the leader holds the data, and management changes answered only
once a follower holds them."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest

from cluster_kit import in_sync, leader_of, new_leader, running, until
from http_api import call

pytestmark = pytest.mark.timeout(180)


def metrics(node) -> str:
    reply = call(node.ports["prometheus"], "GET", "/metrics")
    return reply.body if isinstance(reply.body, str) else reply.body.decode()


def leader_entry(node) -> dict:
    return next(n for n in call(node.ports["http"], "GET", "/api/nodes").body if n.get("cluster_role") == "leader")


def test_the_in_sync_alarm_is_raised_while_the_leader_alone_is_in_sync(tmp_path):
    with running(tmp_path, 2, "--cluster-max-lag-seconds", "1") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        (follower,) = [n for n in nodes if n is not leader]
        until(lambda: "hutch_cluster_in_sync_alarm 0" in metrics(leader), 30, "no alarm with the follower in sync")
        assert leader_entry(leader)["in_sync_alarm"] is False
        follower.kill()
        until(lambda: leader_entry(leader)["in_sync_alarm"] is True, 30, "the alarm in /api/nodes")
        assert "hutch_cluster_in_sync_alarm 1" in metrics(leader)
        assert "in-sync alarm: the in-sync set is this leader alone" in leader.log
        shown_in_the_ui(leader)
        follower.start()
        until(lambda: leader_entry(leader)["in_sync_alarm"] is False, 60, "the alarm to clear")
        assert "hutch_cluster_in_sync_alarm 0" in metrics(leader)
        assert "in-sync alarm cleared" in leader.log


def shown_in_the_ui(leader) -> None:
    """The overview's node table, in a real browser, shows the alarm."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        reason = "needs Debian's chromium and chromium-driver (.ci/run installs them)"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
        return
    from browser import Ui

    ui = Ui(leader.ports["http"])
    try:
        ui.login("guest", "guest")
        ui.open("")
        ui.wait_text("#nodes", "in-sync alarm: only this leader holds the data")
    finally:
        ui.close()


def test_a_management_change_is_answered_once_a_follower_holds_it_and_survives_a_failover(tmp_path):
    """min_in_sync_replicas 1 on two nodes: with the follower stalled
    (SIGSTOP), PUT /api/users/keeper is not answered (before: 201 at once,
    and the user was lost with the leader); once the follower is back it
    is, and the user is there after the leader is killed."""
    with running(tmp_path, 2, "--cluster-min-in-sync-replicas", "1") as (etcd, nodes):
        leader = leader_of(etcd, nodes)
        (follower,) = [n for n in nodes if n is not leader]
        follower.signal(signal.SIGSTOP)
        answered = {}

        def put_user():
            answered["reply"] = call(leader.ports["http"], "PUT", "/api/users/keeper", {"password": "k", "tags": ""})
            answered["at"] = time.monotonic()

        putting = threading.Thread(target=put_user)
        putting.start()
        putting.join(2)
        assert "reply" not in answered, "answered %s with no follower holding the change" % answered["reply"].status
        resumed = time.monotonic()
        follower.signal(signal.SIGCONT)
        putting.join(90)
        assert answered["reply"].status == 201 and answered["at"] >= resumed
        until(lambda: follower.name in in_sync(etcd), 60, "the follower in sync")
        leader.kill()
        new = new_leader(etcd, nodes, leader)
        until(lambda: answers(new, "/api/overview"), 30, "the new leader's management API")
        assert call(new.ports["http"], "GET", "/api/users/keeper").status == 200


def answers(node, path: str) -> bool:
    try:
        return call(node.ports["http"], "GET", path).status == 200
    except OSError:  # its forwarding listener closing as it takes over
        return False
