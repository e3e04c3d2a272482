"""What the management front end sees of the running broker (one node)."""
from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field

from amqp_server.shared.alarms import DISK, MEMORY, ResourceAlarms
from amqp_server.shared.login_throttle import LoginThrottle
from amqp_server.shared.figures import open_files
from amqp_server.management.rates import RateSampler
from amqp_server.management.shards import LinkHolder

# The RabbitMQ release whose API (and definitions format) hutch answers as.
COMPATIBLE_VERSION = "3.10.8"


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
        """RabbitMQ's node_stats figures now: resident memory (the node's,
        of every shard), file descriptors and sockets in use, disk space
        free (as last measured by the alarm check)."""
        return {"mem_used": self.alarms.node_memory(), "fd_used": open_files(), "sockets_used": len(self.connections),
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
