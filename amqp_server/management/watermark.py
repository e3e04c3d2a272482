"""hutch's extensions for `hutchctl set_vm_memory_high_watermark` and
`hutchctl set_disk_free_limit`:
`PUT /api/hutch/vm-memory-high-watermark {"value": <fraction> | "<amount>"}`,
`PUT /api/hutch/disk-free-limit {"value": <bytes> | "<amount>"}` or
`{"mem_relative": <fraction of RAM>}`.

A number is a fraction of RAM, a string an absolute amount in RabbitMQ's
units (k, K, kiB, KiB, M, MiB, G, GiB are powers of 1024; kB, KB, MB, GB of
1000). As with rabbitmqctl, the change lasts until the broker restarts: the
memory monitor gets the new paging budget at once (and pages out if the
queues now hold more), the alarms are checked against the new limits at
once, the configuration file is not touched.
"""
from __future__ import annotations

import re

from storage.memory_monitor import budget_bytes

from amqp_server.management.errors import bad_request
from amqp_server.management.http import NO_CONTENT

AMOUNT = re.compile(r"^(\d+)(k|K|kiB|KiB|M|MiB|G|GiB|kB|KB|MB|GB)?$")
UNITS = {None: 1, "k": 1024, "K": 1024, "kiB": 1024, "KiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2,
         "G": 1024 ** 3, "GiB": 1024 ** 3, "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def amount(value: str) -> int:
    """Bytes in a RabbitMQ amount ("50MB", "1GiB", "1024")."""
    match = AMOUNT.match(value)
    if match is None:
        raise bad_request("Invalid units: %s" % value)
    return int(match.group(1)) * UNITS[match.group(2)]


def put_watermark(req):
    value = req.body().get("value")
    storage = req.node.config.storage
    if isinstance(value, str):
        storage.vm_memory_high_watermark_absolute = amount(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        storage.vm_memory_high_watermark = float(value)
        storage.vm_memory_high_watermark_absolute = None
    else:
        raise bad_request("The threshold should be a fraction between 0.0 and 1.0 or an amount with units")
    monitor = req.node.monitor
    monitor.budget = budget_bytes(storage.vm_memory_high_watermark, storage.vm_memory_high_watermark_absolute,
                                  storage.paging_ratio)
    if monitor.over_budget:
        monitor.page()
    req.node.alarms.check()
    return NO_CONTENT


def put_disk_free_limit(req):
    body = req.body()
    storage = req.node.config.storage
    relative, value = body.get("mem_relative"), body.get("value")
    if relative is not None:
        if not isinstance(relative, (int, float)) or isinstance(relative, bool) or relative < 0:
            raise bad_request("The mem_relative limit should be a non-negative fraction of RAM")
        storage.disk_free_limit_mem_relative = float(relative)
    elif isinstance(value, str):
        storage.disk_free_limit = amount(value)
        storage.disk_free_limit_mem_relative = None
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        storage.disk_free_limit = value
        storage.disk_free_limit_mem_relative = None
    else:
        raise bad_request("The limit should be an amount of bytes with optional units, or mem_relative")
    req.node.alarms.check()
    return NO_CONTENT
