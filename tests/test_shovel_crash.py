"""An on-confirm shovel loses nothing when either broker is killed with
SIGKILL mid-transfer (tests/shovel_crash.py; bench/shovel_crash.py runs the
issue's 100,000 messages)."""
from __future__ import annotations

import pytest

import shovel_crash

pytestmark = pytest.mark.timeout(150)


def test_sigkill_of_either_end_loses_nothing(start_broker):
    outcome = shovel_crash.run(lambda *args: start_broker(*args, expect=("AMQP", "HTTP")), 10000)
    assert outcome.missing == [], "lost %d of %d" % (len(outcome.missing), outcome.count)
    assert outcome.received == outcome.count + outcome.duplicates
    assert all(held < outcome.count for held in outcome.on_b_at_kills), outcome  # both kills were mid-transfer
    print("shovel crash: %d messages, %d duplicates, %.1f s" % (outcome.count, outcome.duplicates, outcome.seconds))
