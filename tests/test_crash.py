"""Crash tests: a broker under confirmed publishing and consuming is killed
with SIGKILL at random moments and restarted on the same data directory.

The cycle logic and the invariants it checks (nothing confirmed is lost,
durable acks stick, nothing is delivered twice except messages unacked at a
crash, and those marked redelivered, publish order, bodies intact, quick and
honest restarts) are in crash_cycle.py; bench/crash_soak.py runs the same
cycles for longer. Only the kill moments are random: the seed is printed and
named in every failure, and HUTCH_CRASH_SEED=N reuses its kill delays.
"""
from __future__ import annotations

import asyncio
import os

import pytest

import crash_cycle
from crash_cycle import History, body_for, plan

CYCLES = 22  # at least 20; the last one is a fill, so the final drain has work


@pytest.mark.timeout(150)
def test_kill_9_cycles_keep_every_confirmed_message(tmp_path):
    seed = os.environ.get("HUTCH_CRASH_SEED")
    settings = crash_cycle.Settings(cycles=CYCLES, seed=int(seed) if seed else None)
    crasher = crash_cycle.Crasher(tmp_path, settings)
    print("crash test seed", crasher.seed)
    summary = asyncio.run(crasher.run())  # raises with every violation found
    print(summary)
    history = crasher.history
    # The run exercised what it is meant to: both storage paths, redeliveries
    # after crashes, durable acks, a final drain, and torn tails.
    small = [n for n in history.confirmed if len(body_for(n)) < 3000]
    large = [n for n in history.confirmed if len(body_for(n)) > 4500]
    assert len(small) > 1000 and len(large) > 300, summary
    assert summary["max_store_messages_recovered"] > 0, summary  # large ones crashed in the store
    assert summary["redelivered"] > 0 and summary["durably_acked"] > 1000, summary
    assert summary["final_drain"] > 0, summary
    assert plan(CYCLES - 1)["kind"] == "fill"
    assert sum(plan(i)["torn"] for i in range(CYCLES)) >= 4
    assert {plan(i)["kind"] for i in range(CYCLES)} == {"mixed", "fill", "drain"}


def test_the_checks_catch_each_kind_of_violation():
    """The invariant checks themselves, on a hand-made history."""
    h = History()
    h.new_run()
    for n in range(6):
        h.published[n] = 0
    h.confirmed.update(range(6))
    h.delivered(body_for(0), False)
    h.delivered(body_for(2), False)
    h.delivered(body_for(1), False)  # out of order
    h.delivered(body_for(2), False)  # twice in one run
    h.delivered(b"99|x", False)  # never published
    h.delivered(body_for(3)[:-1] + b"?", False)  # damaged body
    assert len(h.violations) == 4, h.violations
    h.ack_sent.update({0, 1})
    h.durably_acked.add(0)
    h.new_run()
    h.check_ready_count(7)  # more than published and not durably acked (5)
    h.delivered(body_for(0), True)  # durably acked, back
    h.delivered(body_for(1), False)  # back without redelivered
    h.delivered(body_for(5), True)  # skipped 2 and 4 (confirmed, never acked)
    h.check_run_gaps()
    assert len(h.violations) == 8, h.violations
    h.check_all_delivered(h.run)  # 4 was never delivered; 2, 3, 4 not in this run
    assert len(h.violations) == 10, h.violations
    assert "redelivered=false" in h.violations[6] and "skipped" in h.violations[7]
