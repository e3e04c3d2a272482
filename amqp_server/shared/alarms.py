"""Resource alarms: the memory and disk alarms that block publishers.

Theory of operation (RabbitMQ's, docs/resilience.md):
- One timer checks every CHECK_INTERVAL seconds the process's resident
  memory (on a node of several shards, the node's: every process the
  supervisor forked, and the supervisor, read from /proc) against the memory high watermark (`memory` alarm) and the free
  space of the data directory's filesystem against disk_free_limit (`disk`
  alarm). `raised` is the set of alarms in effect; an alarm clears by itself
  on the first check that finds usage back under its limit.
- While any alarm is raised, a connection that publishes (a basic.publish
  method arrives) is blocked: the alarm joins its `blocked_by` flow sources,
  so it stops reading after that frame, and it is sent connection.blocked if
  it advertised the capability. Connections that only consume are never
  blocked, so consumers drain queues while publishers wait.
- Invariant: `flow_waiters` holds exactly the connections blocked by an
  alarm; when the last alarm clears each gets `unblocked(self)` (and
  connection.unblocked if it was told it was blocked).
- The limits are recomputed from the configuration on every check, and a
  change made at runtime (management API, hutchctl) checks at once.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil

from storage.memory_monitor import total_memory

from amqp_server.shared import allocator
from amqp_server.shared.config import BrokerConfig

log = logging.getLogger("hutch.alarms")

CHECK_INTERVAL = 1.0
MEMORY, DISK = "memory", "disk"
# connection.blocked reasons, RabbitMQ's texts by the set of alarms raised
REASONS = {frozenset({MEMORY}): "low on memory", frozenset({DISK}): "low on disk",
           frozenset({MEMORY, DISK}): "low on memory and disk"}


def resident_memory() -> int:
    """Resident memory of this process (RabbitMQ's rss strategy)."""
    return _resident_of(os.getpid())


def node_memory_elsewhere(supervisor: int) -> int:
    """Resident memory of the node's other processes: the supervisor `supervisor`
    and every process it forked but this one (its shards, leaders or followers in a
    cluster, so the sum is this machine's, never other nodes'). 0 once this process
    is no longer the supervisor's child (orphaned while the node stops)."""
    if os.getppid() != supervisor:
        return 0
    try:
        with open("/proc/%d/task/%d/children" % (supervisor, supervisor)) as children:
            pids = [int(pid) for pid in children.read().split()]
    except (OSError, ValueError):
        return 0
    me = os.getpid()
    return sum(_resident_of(pid) for pid in [supervisor, *pids] if pid != me)


def _resident_of(pid: int) -> int:
    try:
        with open("/proc/%d/statm" % pid) as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0  # it ended meanwhile


def memory_limit(config: BrokerConfig) -> int:
    """The memory high watermark in bytes: absolute if set, else a fraction of RAM."""
    storage = config.storage
    if storage.vm_memory_high_watermark_absolute is not None:
        return storage.vm_memory_high_watermark_absolute
    return int(storage.vm_memory_high_watermark * total_memory())


def disk_free_limit(config: BrokerConfig) -> int:
    """disk_free_limit in bytes: relative to RAM if set, else absolute."""
    storage = config.storage
    if storage.disk_free_limit_mem_relative is not None:
        return int(storage.disk_free_limit_mem_relative * total_memory())
    return storage.disk_free_limit


class ResourceAlarms:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.raised: set[str] = set()
        self.flow_waiters: set = set()
        self.mem_used = 0  # the node's resident bytes (every process's, on a node of several shards)
        self.disk_free = 0
        # On a node of several shards the memory alarm is the node's, as RabbitMQ's is
        # (N shards each allowed the watermark would let the node use N times it): the
        # composition root sets how this shard weighs the node's other processes
        # (node_memory_elsewhere).
        self.memory_elsewhere = lambda: 0
        self._timer: asyncio.TimerHandle | None = None

    @property
    def memory_limit(self) -> int:
        return memory_limit(self.config)

    @property
    def disk_free_limit(self) -> int:
        return disk_free_limit(self.config)

    @property
    def reason(self) -> str:
        return REASONS.get(frozenset(self.raised), "")

    def start(self) -> None:
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def check(self) -> None:
        own, elsewhere = resident_memory(), self.memory_elsewhere()
        if own + elsewhere > self.memory_limit and allocator.give_back():
            own = resident_memory()  # what malloc kept free is not in use (amqp_server.shared.allocator)
        self.mem_used = own + elsewhere
        try:
            self.disk_free = shutil.disk_usage(self.config.data_dir).free
        except OSError:
            self.disk_free = 0
        self._set(MEMORY, self.mem_used > self.memory_limit)
        self._set(DISK, self.disk_free < self.disk_free_limit)

    def _tick(self) -> None:
        self.check()
        self._timer = asyncio.get_running_loop().call_later(CHECK_INTERVAL, self._tick)

    def _set(self, alarm: str, on: bool) -> None:
        if on == (alarm in self.raised):
            return
        if on:
            self.raised.add(alarm)
            if alarm == MEMORY:
                log.warning("memory resource limit alarm set: %d bytes used, the high watermark is %d bytes; "
                            "publishers are blocked", self.mem_used, self.memory_limit)
            else:
                log.warning("disk resource limit alarm set: %d bytes free, the limit is %d bytes; "
                            "publishers are blocked", self.disk_free, self.disk_free_limit)
            return
        self.raised.discard(alarm)
        log.warning("%s resource limit alarm cleared", alarm)
        if not self.raised:
            waiters, self.flow_waiters = self.flow_waiters, set()
            for connection in waiters:
                connection.alarm_cleared(self)

    def block(self, connection) -> None:
        """A publish arrived on `connection` while an alarm is raised."""
        if connection in self.flow_waiters:
            return
        self.flow_waiters.add(connection)
        connection.alarm_blocked(self)
