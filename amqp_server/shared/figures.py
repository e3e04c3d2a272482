"""A process's own resource figures in RabbitMQ's node fields, measured
where the process runs: the management face's `Node` reports its own, and
a cluster follower measures these and publishes them with its membership
(amqp_server.cluster.node) and in its /metrics, so the leader's
`/api/nodes` shows each member's real memory and disk rather than none.
"""
from __future__ import annotations

import os
import resource
import shutil

from amqp_server.shared.alarms import disk_free_limit, memory_limit, resident_memory


def open_files() -> int:
    """File descriptors this process holds."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def member_figures(config, uptime_ms: int) -> dict:
    """RabbitMQ's node fields for memory, disk and file descriptors of this
    process (`config`: its BrokerConfig)."""
    try:
        disk_free = shutil.disk_usage(config.data_dir).free
    except OSError:
        disk_free = 0
    mem_used, mem_limit, disk_limit = resident_memory(), memory_limit(config), disk_free_limit(config)
    fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return {"mem_used": mem_used, "mem_limit": mem_limit, "mem_alarm": mem_used > mem_limit,
            "disk_free": disk_free, "disk_free_limit": disk_limit, "disk_free_alarm": disk_free < disk_limit,
            "fd_used": open_files(), "fd_total": fd_total, "sockets_total": fd_total, "uptime": uptime_ms,
            "os_pid": str(os.getpid()), "processors": os.cpu_count() or 1}
