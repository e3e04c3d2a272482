"""GET /api/hutch/streams/{vhost}/{name}?start=N&limit=M: a stream queue's
records by offset (docs/streams.md), for spark_sink and any other reader
that replays a stream without an AMQP consumer.

    {"first_offset": F, "next_offset": X, "records": [{"offset": N, "time": seconds,
     "exchange": ..., "routing_key": ..., "properties": {...}, "body": base64}, ...]}

`start` defaults to the first offset kept; `limit` (default 1000, at most
10000; 0 answers the bounds alone) caps the records, and a response stops
early once its records pass 16 MiB (always at least one record). `time` is
when the broker appended the record. Reading needs the read permission on
the queue, as consuming from it does; a queue that is not a stream is a 400.
`format=arrow` answers the same records as an Arrow IPC stream
(stream_arrow.py); `format=json` is the default.
"""
from __future__ import annotations

import asyncio
import base64

from amqp_server.management.dead_letters import DEFAULT_LIMIT, MAX_BYTES, MAX_LIMIT
from amqp_server.management.errors import ApiError, amqp_errors_as_http
from amqp_server.management.listing import query_integer
from amqp_server.management.resources import find_queue
from amqp_server.management.stream_arrow import arrow_response
from storage.dead_letter_log import json_value

PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
              "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id", "headers")


def record_json(offset: int, time_ms: int, message) -> dict:
    props = message.properties
    properties = {name: json_value(getattr(props, "message_type" if name == "type" else name, None))
                  for name in PROPERTIES}
    return {"offset": offset, "time": time_ms / 1000, "exchange": message.exchange,
            "routing_key": message.routing_key, "properties": properties,
            "body": base64.b64encode(message.body).decode("ascii")}


async def stream_records(req) -> dict:
    v, queue = find_queue(req)
    start = query_integer(req.query, "start", 0, minimum=0)
    limit = min(query_integer(req.query, "limit", DEFAULT_LIMIT, minimum=0), MAX_LIMIT)
    form = req.query.get("format", "json")
    if form not in ("json", "arrow"):
        raise ApiError(400, "bad_request", "format must be json or arrow, not %r" % form)
    done = asyncio.get_running_loop().create_future()
    with amqp_errors_as_http():
        req.access(v).check("queue", queue.name, "read")
        queue.read_log(start, limit, done.set_result, MAX_BYTES)
    records = await done
    if isinstance(records, Exception):
        raise records
    if form == "arrow":
        return arrow_response(queue.first_offset, queue.next_offset, records)
    return {"first_offset": queue.first_offset, "next_offset": queue.next_offset,
            "records": [record_json(*r) for r in records]}
