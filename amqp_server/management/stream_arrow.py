"""GET /api/hutch/streams/{vhost}/{name}?format=arrow: a stream's records
as one Arrow IPC stream (`application/vnd.apache.arrow.stream`), the binary
form of the JSON page, for readers that want columns (spark_sink: its
executors hand the batch to Spark as it is, with no step per record).

One record batch, one row per record, the columns of spark_sink's
STREAM_SCHEMA: offset int64, time timestamp[us, UTC] (when the broker
appended it), exchange, routing_key, content_type, content_encoding string,
delivery_mode, priority int32, correlation_id, reply_to, expiration,
message_id string, timestamp timestamp[us, UTC], type, user_id, app_id
string, headers string (the table as JSON text, keys sorted), body binary;
offset, time, exchange, routing_key and body are never null (their fields
say so: Spark checks a batch's schema against the source's).
The log's bounds travel in the headers X-Hutch-First-Offset and
X-Hutch-Next-Offset. PyArrow (the Apache Arrow project's library: the
format is not written by hand) is optional for the broker: without it the
request is a 406 whose reason says so, and the JSON page still serves.
"""
from __future__ import annotations

import json

from aiohttp import web
from storage.dead_letter_log import json_value

from amqp_server.management.errors import ApiError

CONTENT_TYPE = "application/vnd.apache.arrow.stream"
_STRINGS = ("content_type", "content_encoding")
_MORE_STRINGS = ("correlation_id", "reply_to", "expiration", "message_id")
_LAST_STRINGS = ("user_id", "app_id")
_NEVER_NULL = frozenset({"offset", "time", "exchange", "routing_key", "body"})  # as Spark's schema has them


def _pyarrow():
    try:
        import pyarrow
    except ImportError:
        raise ApiError(406, "not_acceptable", "format=arrow needs PyArrow on the broker (pip install pyarrow); "
                                              "the JSON form is served without format") from None
    return pyarrow


def arrow_response(first_offset: int, next_offset: int, records: list) -> web.Response:
    """`records`: [(offset, timestamp ms, Message)], as the queue's read_log gives them."""
    pa = _pyarrow()
    props = [message.properties for _o, _t, message in records]
    micros = pa.timestamp("us", tz="UTC")

    def strings(name: str):
        return pa.array([_text(getattr(p, name, None)) for p in props], pa.string())

    stamps = [getattr(p, "timestamp", None) for p in props]
    headers = [getattr(p, "headers", None) for p in props]
    columns = {
        "offset": pa.array([r[0] for r in records], pa.int64()),
        "time": pa.array([r[1] * 1000 for r in records], pa.int64()).cast(micros),
        "exchange": pa.array([m.exchange for _o, _t, m in records], pa.string()),
        "routing_key": pa.array([m.routing_key for _o, _t, m in records], pa.string()),
        **{name: strings(name) for name in _STRINGS},
        "delivery_mode": pa.array([getattr(p, "delivery_mode", None) for p in props], pa.int32()),
        "priority": pa.array([getattr(p, "priority", None) for p in props], pa.int32()),
        **{name: strings(name) for name in _MORE_STRINGS},
        "timestamp": pa.array([None if s is None else json_value(s) * 1_000_000 for s in stamps],
                              pa.int64()).cast(micros),
        "type": pa.array([_text(getattr(p, "message_type", None)) for p in props], pa.string()),
        **{name: strings(name) for name in _LAST_STRINGS},
        "headers": pa.array([None if h is None else json.dumps(json_value(h), sort_keys=True) for h in headers],
                            pa.string()),
        "body": pa.array([m.body for _o, _t, m in records], pa.binary()),
    }
    schema = pa.schema([pa.field(name, array.type, nullable=name not in _NEVER_NULL)
                        for name, array in columns.items()])
    batch = pa.RecordBatch.from_arrays(list(columns.values()), schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return web.Response(body=sink.getvalue().to_pybytes(), content_type=CONTENT_TYPE,
                        headers={"X-Hutch-First-Offset": str(first_offset), "X-Hutch-Next-Offset": str(next_offset)})


def _text(value) -> str | None:
    return None if value is None else str(json_value(value))
