"""The node's dead-letter log on a node of several shards (docs/scaling.md,
docs/analytics.md): shard 0 keeps it, one per vhost, so that its offsets
are one sequence and every reader (the management API, the UI, hutchctl,
spark_sink) reads one log. Another shard records a dying message through
`vhosts.dead_letter_recorder.ShardLog`: a "dead" record to shard 0, which
appends it and answers "durable" once it is on disk there
(ShardNode.dead_letter, ShardNode._on_dead: amqp_server.shards.services).

A shard other than 0 may still hold a log of its own in its data directory
(DATA_DIR/shards/K/vhosts/<vhost-dir>/dead_letters), written by hutch before
shard 0 kept the node's: `hand_over` moves its records to shard 0's log when
the shard starts, then deletes it. Invariant: the local log is deleted only
once shard 0 has every one of its records on disk; a shard that ends
before that hands the whole log over again at its next start (a record may
then be in shard 0's log twice: at least once, as dead-lettering itself).
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("hutch.shards")

# Records read from a local log and sent to shard 0 before waiting for them to be on disk.
PAGE = 1000


async def hand_over(node) -> None:
    """Move the records of this shard's own dead-letter logs to shard 0's (see above)."""
    for host in list(node.broker.vhosts.values()):
        storage = host.message_storage
        local = storage.dead_letters if storage is not None else None
        if local is None or local.next_offset == local.first_offset:
            continue
        try:
            moved = await _hand_over_log(node, host.name, local)
        except Exception as exc:  # the vhost was deleted meanwhile, or the log could not be read
            log.warning("shard %d: the dead letters of vhost '%s' kept here were not handed to shard 0: %s",
                        node.here, host.name, exc)
            continue
        if moved is not None:
            local.delete()
            log.info("shard %d: %d dead letters of vhost '%s' kept here went to shard 0's log",
                     node.here, moved, host.name)


async def _hand_over_log(node, vhost: str, local) -> int | None:
    """Send every record of `local` to shard 0; the count once all are on
    disk there, None if shard 0 ended first."""
    loop = asyncio.get_running_loop()
    start, end, moved = local.first_offset, local.next_offset, 0
    while start < end:
        read = loop.create_future()
        local.read(start, min(PAGE, end - start), read.set_result)
        records = await read
        if isinstance(records, Exception):
            raise records
        if not records:
            break
        durable = [loop.create_future() for _ in records]
        for record, done in zip(records, durable):
            node.request(0, lambda ticket, record=record: ("dead", ticket, vhost, record),
                         lambda answer, done=done: done.done() or done.set_result(answer[0] == "durable"))
        if not all(await asyncio.gather(*durable)):
            return None
        moved += len(records)
        start = records[-1].offset + 1  # not start + count: a damaged record leaves a gap
    return moved
