"""The lease's clock (amqp_server.cluster.lease): CLOCK_BOOTTIME, which
keeps counting while the machine is suspended (the monotonic clock stops),
so a leader that wakes from a suspend finds its deadline passed and
confirms nothing until etcd has answered. A suspend itself cannot be made
here: this checks the clock the keeper reads."""
from __future__ import annotations

import time

import pytest

from amqp_server.cluster import lease


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's")
def test_the_lease_deadline_is_kept_on_the_clock_that_counts_through_a_suspend():
    assert lease.clock is lease._boottime
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = lease.clock()
    assert before <= now <= time.clock_gettime(time.CLOCK_BOOTTIME)
    keeper = lease.LeaseKeeper(None, 2, None, None, None, lambda: True)
    keeper.deadline = now + 60
    assert keeper.valid()
    keeper.deadline = time.clock_gettime(time.CLOCK_BOOTTIME) - 0.001
    assert not keeper.valid()
