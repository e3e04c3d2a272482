"""What the management front end sees of the running broker (one node)."""
from __future__ import annotations

import os
import resource
import shutil
import time
from dataclasses import dataclass, field

from storage.memory_monitor import total_memory

from amqp_server.management.rates import RateSampler

# The RabbitMQ release whose API (and definitions format) hutch answers as.
COMPATIBLE_VERSION = "3.10.8"
# RabbitMQ's default disk_free_limit (50 MB).
DISK_FREE_LIMIT = 50000000


@dataclass
class Node:
    broker: object  # vhosts.Broker
    connections: set  # open amqp_server.connection.Connection objects
    config: object  # amqp_server.config.BrokerConfig
    writer: object  # storage.writer.GroupCommitWriter
    monitor: object  # storage.memory_monitor.MemoryMonitor
    sampler: RateSampler
    # (protocol, address, port) of every open listener, AMQP and HTTP alike
    listeners: list = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def uptime_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    @property
    def memory_limit(self) -> int:
        """RabbitMQ's memory high watermark in bytes (paging starts at
        paging_ratio of it, the monitor's budget)."""
        storage = self.config.storage
        if storage.vm_memory_high_watermark_absolute is not None:
            return storage.vm_memory_high_watermark_absolute
        return int(storage.vm_memory_high_watermark * total_memory())

    def resources(self) -> dict:
        """RabbitMQ's node fields for file descriptors and disk space (no
        alarm is raised: the limit is reported for tools that show it)."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            fds = 0
        try:
            free = shutil.disk_usage(self.config.data_dir).free
        except OSError:
            free = 0
        return {"fd_used": fds, "fd_total": limit, "sockets_total": limit, "disk_free": free,
                "disk_free_limit": DISK_FREE_LIMIT}

    @staticmethod
    def rss_bytes() -> int:
        """Resident memory of this process (RabbitMQ's mem_used, rss strategy)."""
        try:
            with open("/proc/self/statm") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0
