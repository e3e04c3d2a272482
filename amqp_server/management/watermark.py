"""hutch's extension for `hutchctl set_vm_memory_high_watermark`:
`PUT /api/hutch/vm-memory-high-watermark {"value": <fraction> | "<amount>"}`.

A number is a fraction of RAM, a string an absolute amount in RabbitMQ's
units (k, K, kiB, KiB, M, MiB, G, GiB are powers of 1024; kB, KB, MB, GB of
1000). As with rabbitmqctl, the change lasts until the broker restarts: the
memory monitor gets the new paging budget at once (and pages out if the
queues now hold more), the configuration file is not touched.
"""
from __future__ import annotations

import re

from storage.memory_monitor import budget_bytes

from amqp_server.management.errors import bad_request
from amqp_server.management.http import NO_CONTENT

AMOUNT = re.compile(r"^(\d+)(k|K|kiB|KiB|M|MiB|G|GiB|kB|KB|MB|GB)?$")
UNITS = {None: 1, "k": 1024, "K": 1024, "kiB": 1024, "KiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2,
         "G": 1024 ** 3, "GiB": 1024 ** 3, "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def put_watermark(req):
    value = req.body().get("value")
    storage = req.node.config.storage
    if isinstance(value, str):
        match = AMOUNT.match(value)
        if match is None:
            raise bad_request("Invalid units: %s" % value)
        storage.vm_memory_high_watermark_absolute = int(match.group(1)) * UNITS[match.group(2)]
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
    return NO_CONTENT
