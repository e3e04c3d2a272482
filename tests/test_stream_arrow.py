"""GET /api/hutch/streams/{vhost}/{name}?format=arrow against the session
broker: the same records as the JSON page, as one Arrow IPC record batch
with spark_sink's stream columns; the bounds in headers; a bad format is a
400 with a JSON reason."""
from __future__ import annotations

import base64
import datetime
import json
import urllib.request

import pika
import pyarrow

from helpers import unique
from http_api import segment
from spark_sink.source import STREAM_SCHEMA


def test_an_arrow_page_holds_the_records_of_the_json_page(conn, api):
    name = unique("arrow")
    channel = conn.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    stamp = datetime.datetime(2026, 11, 27, 5, 0, tzinfo=datetime.timezone.utc)
    channel.basic_publish("", name, b"\x00binary\xff", pika.BasicProperties(
        content_type="application/octet-stream", delivery_mode=2, priority=3, message_id="a", type="kind",
        timestamp=int(stamp.timestamp()), headers={"tenant": "acme", "n": 7}))
    channel.basic_publish("", name, b"plain")
    path = "/api/hutch/streams/%s/%s?start=0&limit=10" % (segment("/"), segment(name))
    try:
        page = api.get(path)
        assert page.status == 200
        headers, data = _raw(api, path + "&format=arrow")
        assert headers["content-type"].startswith("application/vnd.apache.arrow.stream")
        assert (int(headers["x-hutch-first-offset"]), int(headers["x-hutch-next-offset"])) == (0, 2)
        table = pyarrow.ipc.open_stream(data).read_all()
        assert table.column_names == STREAM_SCHEMA.names
        assert [f.nullable for f in table.schema] == [f.nullable for f in STREAM_SCHEMA.fields]
        rows = table.to_pylist()
        assert [r["offset"] for r in rows] == [r["offset"] for r in page.body["records"]] == [0, 1]
        assert [r["body"] for r in rows] == [base64.b64decode(r["body"]) for r in page.body["records"]]
        first = rows[0]
        assert (first["exchange"], first["routing_key"], first["content_type"], first["delivery_mode"],
                first["priority"], first["message_id"], first["type"]) == \
            ("", name, "application/octet-stream", 2, 3, "a", "kind")
        assert first["timestamp"] == stamp
        assert json.loads(first["headers"]) == {"n": 7, "tenant": "acme"}
        assert first["time"].timestamp() == page.body["records"][0]["time"]
        assert rows[1]["headers"] is None and rows[1]["timestamp"] is None

        bad = api.get(path + "&format=xml")
        assert bad.status == 400 and "format must be json or arrow" in bad.body["reason"]
    finally:
        channel.queue_delete(name)


def _raw(api, path: str) -> tuple[dict, bytes]:
    """(headers, body) of a 200 answer."""
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (api.port, path), headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return {k.lower(): v for k, v in response.headers.items()}, response.read()
