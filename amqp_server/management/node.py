"""What the management front end sees of the running broker (one node)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from amqp_server.management.rates import RateSampler

# The RabbitMQ release whose API (and definitions format) hutch answers as.
COMPATIBLE_VERSION = "3.10.8"


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

    @staticmethod
    def rss_bytes() -> int:
        """Resident memory of this process (RabbitMQ's mem_used, rss strategy)."""
        try:
            with open("/proc/self/statm") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0
