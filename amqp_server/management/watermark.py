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
once, the configuration file is not touched. On a node of several shards
every running shard makes the change before the answer (the "limits"
service); a shard that starts again later starts from the configuration,
as the whole node does after a restart.
"""
from __future__ import annotations

import asyncio
import re

from storage.memory_monitor import budget_bytes

from amqp_server.management import shards
from amqp_server.management.errors import ApiError, bad_request
from amqp_server.management.http import NO_CONTENT

# Seconds the other shards have to make a change of limits.
EVERYWHERE_WAIT = 5.0
# The storage settings a change of limits sets (the "limits" service's argument).
LIMITS = ("vm_memory_high_watermark", "vm_memory_high_watermark_absolute", "disk_free_limit",
          "disk_free_limit_mem_relative")

AMOUNT = re.compile(r"^(\d+)(k|K|kiB|KiB|M|MiB|G|GiB|kB|KB|MB|GB)?$")
UNITS = {None: 1, "k": 1024, "K": 1024, "kiB": 1024, "KiB": 1024, "M": 1024 ** 2, "MiB": 1024 ** 2,
         "G": 1024 ** 3, "GiB": 1024 ** 3, "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def amount(value: str) -> int:
    """Bytes in a RabbitMQ amount ("50MB", "1GiB", "1024")."""
    match = AMOUNT.match(value)
    if match is None:
        raise bad_request("Invalid units: %s" % value)
    return int(match.group(1)) * UNITS[match.group(2)]


async def put_watermark(req):
    value = req.body().get("value")
    storage = req.node.config.storage
    if isinstance(value, str):
        storage.vm_memory_high_watermark_absolute = amount(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        storage.vm_memory_high_watermark = float(value)
        storage.vm_memory_high_watermark_absolute = None
    else:
        raise bad_request("The threshold should be a fraction between 0.0 and 1.0 or an amount with units")
    return await _everywhere(req.node)


async def put_disk_free_limit(req):
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
    return await _everywhere(req.node)


def _applied(node) -> None:
    """The storage settings changed: the paging budget and the alarms follow at once."""
    storage = node.config.storage
    monitor = node.monitor
    monitor.budget = budget_bytes(storage.vm_memory_high_watermark, storage.vm_memory_high_watermark_absolute,
                                  storage.paging_ratio, shards.shard_count(node))
    if monitor.over_budget:
        monitor.page()
    node.alarms.check()


async def _everywhere(node):
    """Apply this shard's limits here and on every other running shard; a
    503 names the shards that did not make the change in time."""
    _applied(node)
    if node.shards is None:
        return NO_CONTENT
    storage = node.config.storage
    limits = {key: getattr(storage, key) for key in LIMITS}
    linked = [index for index in range(shards.shard_count(node)) if index in node.shards.peers]
    answers = await asyncio.gather(*(asyncio.wait_for(shards.ask(node, index, "limits", limits), EVERYWHERE_WAIT)
                                     for index in linked), return_exceptions=True)
    missed = [str(index) for index, answer in zip(linked, answers) if isinstance(answer, BaseException)]
    if missed:
        raise ApiError(503, "service_unavailable", "the limits changed, but not on shard(s) %s, which did not "
                       "answer in time; set them again" % ", ".join(missed))
    return NO_CONTENT


@shards.service("limits")
def _limits(node, limits: dict) -> None:
    storage = node.config.storage
    for key in LIMITS:
        setattr(storage, key, limits[key])
    _applied(node)
