"""What the management front end sees of the running broker (one node)."""
from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field

from amqp_server.shared.alarms import DISK, MEMORY, ResourceAlarms, resident_memory
from amqp_server.shared.login_throttle import LoginThrottle
from amqp_server.shared.figures import open_files
from amqp_server.management.rates import RateSampler
from amqp_server.management.shards import LinkHolder

# The RabbitMQ release whose API (and definitions format) hutch answers as.
COMPATIBLE_VERSION = "3.10.8"
# The message stores' figures (storage.msg_store stats) in `storage_figures`, by store kind.
STORES = ("persistent", "transient")
STORE_FIGURES = ("files", "bytes_on_disk", "live_bytes", "messages")
STORE_KEY = "store_%s_%s"


@dataclass
class Node:
    broker: object  # vhosts.Broker
    connections: set  # open amqp_server.amqp.connection.Connection objects
    config: object  # amqp_server.shared.config.BrokerConfig
    writer: object  # storage.writer.GroupCommitWriter
    monitor: object  # storage.memory_monitor.MemoryMonitor
    sampler: RateSampler
    alarms: ResourceAlarms
    mqtt_sessions: object  # amqp_server.mqtt.sessions.Sessions
    logins: LoginThrottle  # the broker's one table, shared with the AMQP and MQTT listeners
    # (protocol, address, port) of every open listener, AMQP and HTTP alike
    listeners: list = field(default_factory=list)
    # A cluster's leader (amqp_server.cluster.node.ClusterNode): status,
    # forget, transfer; None on a node that runs alone.
    cluster: object = None
    started: float = field(default_factory=time.monotonic)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # set when the listeners close
    links: object = None  # amqp_server.links.supervisor.Links, once the broker has started it
    # On a node of several shards, this shard's amqp_server.shards.node.ShardNode
    # (amqp_server.management.shards); None on a node of one process.
    shards: object = None

    def __post_init__(self) -> None:
        self.sampler.figures = self.figures
        self.sampler.held = lambda: LinkHolder(self.shards).unacked_deliveries() if self.shards is not None else ()

    def figures(self) -> dict:
        """RabbitMQ's node_stats figures now: resident memory, file
        descriptors and sockets in use, disk space free (as last measured
        by the alarm check)."""
        return {"mem_used": self.rss_bytes(), "fd_used": open_files(), "sockets_used": len(self.connections),
                "disk_free": self.alarms.disk_free}

    @property
    def uptime_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    @property
    def memory_limit(self) -> int:
        """RabbitMQ's memory high watermark in bytes (paging starts at
        paging_ratio of it, the monitor's budget)."""
        return self.alarms.memory_limit

    def resources(self) -> dict:
        """RabbitMQ's node fields for file descriptors, disk space (as last
        measured by the alarm check) and alarms."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        alarms = self.alarms
        return {"fd_used": open_files(), "fd_total": limit, "sockets_total": limit, "disk_free": alarms.disk_free,
                "disk_free_limit": alarms.disk_free_limit, "mem_alarm": MEMORY in alarms.raised,
                "disk_free_alarm": DISK in alarms.raised}

    def storage_figures(self) -> dict:
        """This process's paging budget, disk writer and message stores
        (hutch's own metrics in /metrics), flat: on a node of several
        shards each shard reports them and shard 0 sums them."""
        monitor, writer = self.monitor, self.writer
        out = {"memory_used": monitor.used, "memory_budget": monitor.budget, "paging_runs": monitor.paging_runs,
               "writer_pending_bytes": writer.pending_bytes, "group_commits": writer.batches,
               "fsync_count": writer.fsync_count, "fsync_seconds": writer.fsync_seconds}
        out.update(dict.fromkeys((STORE_KEY % (kind, key) for kind in STORES for key in STORE_FIGURES), 0))
        for v in list(self.broker.vhosts.values()):
            storage = v.message_storage
            if storage is None:
                continue
            for kind, store in (("persistent", storage.persistent), ("transient", storage.transient)):
                found = store.stats()
                for key in STORE_FIGURES:
                    out[STORE_KEY % (kind, key)] += found.get(key, 0)
        return out

    @staticmethod
    def rss_bytes() -> int:
        """Resident memory of this process (RabbitMQ's mem_used, rss strategy)."""
        return resident_memory()

