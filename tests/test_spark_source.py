"""Unit tests of the hutch-dead-letters reader against a tiny HTTP server
that serves the dead-letter API's JSON shape from a list (the broker's own
endpoint is exercised end to end in test_spark_e2e.py). What these pin down:
option parsing, offset ranges split into partitions, gaps and retention in
the middle of a range, maxRecordsPerTrigger, and the row conversion."""
from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spark_sink.client import DataLossError, DeadLetterClient, DeadLetterLogError
from spark_sink.source import OffsetRange, _Options


class FakeLog:
    def __init__(self) -> None:
        self.records: list[dict] = []
        self.first = 0
        self.requests: list[tuple[int, int]] = []

    def add(self, n: int, reason: str = "rejected", queue: str = "q") -> None:
        for _ in range(n):
            offset = self.records[-1]["offset"] + 1 if self.records else 0
            self.records.append({
                "offset": offset, "time": 1_700_000_000 + offset, "vhost": "/", "queue": queue, "reason": reason,
                "exchange": "ex", "routing_keys": ["k"], "dead_letter_exchange": None,
                "dead_letter_routing_key": None, "death_count": 1,
                "properties": {"content_type": None, "message_id": "m%d" % offset, "correlation_id": None,
                               "app_id": None, "timestamp": None, "headers": {"x-n": offset}},
                "body_size": 2, "body": base64.b64encode(b"%02d" % (offset % 100)).decode()})

    @property
    def next(self) -> int:
        return self.records[-1]["offset"] + 1 if self.records else 0

    def answer(self, start: int, limit: int) -> dict:
        self.requests.append((start, limit))
        kept = [r for r in self.records if r["offset"] >= max(start, self.first)][:limit]
        return {"first_offset": self.first, "next_offset": self.next,
                "records": kept}


@pytest.fixture
def fake():
    log = FakeLog()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"guest:guest").decode():
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error":"not_authorised"}')
                return
            query = urllib.parse.parse_qs(url.query)
            body = json.dumps(log.answer(int(query["start"][0]), int(query["limit"][0]))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.url = "http://127.0.0.1:%d" % server.server_address[1]
    yield log
    server.shutdown()
    server.server_close()


def test_client_pages_through_a_range_and_skips_what_retention_removed(fake):
    fake.add(25)
    client = DeadLetterClient(fake.url)
    assert [r["offset"] for r in client.records(3, 20, page_size=4)] == list(range(3, 20))
    assert all(limit <= 4 for _start, limit in fake.requests)
    fake.first = 10
    assert [r["offset"] for r in client.records(0, 12)] == [10, 11]


def test_client_reports_what_retention_deleted_and_not_gaps_inside_the_log(fake):
    fake.add(25)
    del fake.records[15]  # a record the broker found damaged: a gap, not retention
    fake.first = 10
    lost = []
    got = DeadLetterClient(fake.url).records(0, 20, page_size=4, lost=lambda *loss: lost.append(loss))
    assert [r["offset"] for r in got] == [10, 11, 12, 13, 14, 16, 17, 18, 19]
    assert lost == [(0, 10, 10)]  # offsets 0-9, the first kept being 10
    with pytest.raises(DataLossError, match=r"offsets 3 to 9 of the dead-letter log of vhost '/' were deleted "
                                            r"by retention .*failOnDataLoss"):
        _Options({"url": fake.url}).read(OffsetRange(3, 20)).__next__()
    rows = list(_Options({"url": fake.url, "failOnDataLoss": "false"}).read(OffsetRange(3, 12)))
    assert [r[0] for r in rows] == [10, 11]
    with pytest.raises(ValueError, match="failondataloss must be true or false"):
        _Options({"failOnDataLoss": "maybe"})


def test_client_reports_http_errors():
    with pytest.raises(DeadLetterLogError, match="Connection refused|HTTP"):
        DeadLetterClient("http://127.0.0.1:9").bounds()


def test_client_reports_refused_credentials(fake):
    with pytest.raises(DeadLetterLogError, match="HTTP 401"):
        DeadLetterClient(fake.url, password="wrong").bounds()


def test_options_resolve_offsets_and_split_ranges():
    options = _Options({"startingOffsets": "latest", "RECORDSPERPARTITION": "4"})
    assert options.resolve(options.starting, 5, 17) == 17
    assert options.resolve("earliest", 5, 17) == 5
    assert options.resolve("9", 5, 17) == 9
    with pytest.raises(ValueError):
        options.resolve("soon", 5, 17)
    assert [(p.start, p.end) for p in options.split(3, 13)] == [(3, 7), (7, 11), (11, 13)]
    with pytest.raises(ValueError):
        _Options({"maxRecordsPerTrigger": "0"})


def test_batch_read_splits_into_partitions_and_converts_rows(spark, fake):
    fake.add(23, reason="expired", queue="a")
    df = (spark.read.format("hutch-dead-letters").option("url", fake.url)
          .option("recordsPerPartition", "5").option("startingOffsets", "2").option("endingOffsets", "20").load())
    assert df.rdd.getNumPartitions() == 4
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(2, 20))
    row = rows[0]
    assert (row.reason, row.queue, row.message_id, row.body, json.loads(row.headers)) == \
        ("expired", "a", "m2", b"02", {"x-n": 2})
    assert row.time.year == 2023


def test_stream_respects_max_records_per_trigger(spark, fake, tmp_path):
    fake.add(10)
    stream = (spark.readStream.format("hutch-dead-letters").option("url", fake.url)
              .option("maxRecordsPerTrigger", "4").load())
    query = (stream.writeStream.format("memory").queryName("fake_dead_letters")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [4, 4, 2]
    got = sorted(r.offset for r in spark.sql("select offset from fake_dead_letters").collect())
    assert got == list(range(10))
