"""GET /api/hutch/dead-letters/{vhost}?start=N&limit=M: the vhost's
dead-letter log by offset (storage/dead_letter_log.py), for spark_sink and
any other reader that wants to replay what died.

    {"first_offset": F, "next_offset": X, "records": [...]}

`start` defaults to the first offset kept; `limit` (default 1000, at most
10000; 0 answers the bounds alone) caps the records, and a response stops
early once its records pass 16 MiB (always at least one record). Reading
needs a permission in the vhost or the monitoring tag, as reading the
vhost's queues does.
"""
from __future__ import annotations

import asyncio

from amqp_server.management.errors import ApiError
from amqp_server.management.listing import query_integer

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10000
MAX_BYTES = 16 * 1024 * 1024


async def dead_letters(req) -> dict:
    vhost = req.vhost(req.params["vhost"])
    log = vhost.message_storage.dead_letters if vhost.message_storage is not None else None
    if log is None:
        raise ApiError(404, "not_found", "the dead-letter log is disabled (dead_letter_log.enabled)")
    start = query_integer(req.query, "start", log.first_offset, minimum=0)
    limit = min(query_integer(req.query, "limit", DEFAULT_LIMIT, minimum=0), MAX_LIMIT)
    done = asyncio.get_running_loop().create_future()
    log.read(start, limit, done.set_result, MAX_BYTES)
    records = await done
    if isinstance(records, Exception):
        raise records
    return {"first_offset": log.first_offset, "next_offset": log.next_offset,
            "records": [r.to_json() for r in records]}
