"""Spark reads any stream queue: batch and Structured Streaming through the
hutch-dead-letters data source with .option("stream", NAME), stream offsets
as Spark offsets; a streaming query into Parquet stopped part way and
restarted from its checkpoint ends with every record exactly once; and
`python -m spark_sink export --stream NAME`. The session `spark` fixture,
tiny data."""
from __future__ import annotations

import base64
import csv
import glob
import json

import pika
import pytest

from helpers import unique, wait_for
from spark_sink.__main__ import _run, build_parser
from spark_sink.source import NAME


@pytest.fixture
def stream(broker, conn):
    """A stream with 6 records: (name, management URL, publish(count, first))."""
    name = unique("spark-stream")
    channel = conn.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()

    def publish(count: int, first: int) -> None:
        for i in range(first, first + count):
            channel.basic_publish("", name, b"record-%d" % i, pika.BasicProperties(
                content_type="text/plain", message_id="m%d" % i, headers={"n": i}))

    publish(6, 0)
    yield name, "http://127.0.0.1:%d" % broker.ports["HTTP"], publish
    channel.queue_delete(name)


def test_a_batch_read_of_a_stream_from_an_offset(spark, stream):
    name, url, _publish = stream
    rows = (spark.read.format(NAME).option("url", url).option("stream", name).option("startingOffsets", "2")
            .load().orderBy("offset").collect())
    assert [r.offset for r in rows] == [2, 3, 4, 5]
    assert [bytes(r.body) for r in rows] == [b"record-%d" % i for i in range(2, 6)]
    first = rows[0]
    assert (first.exchange, first.routing_key, first.content_type, first.message_id) == ("", name, "text/plain", "m2")
    assert json.loads(first.headers) == {"n": 2}


@pytest.mark.timeout(240)
def test_a_streaming_query_restarted_from_its_checkpoint_ends_with_every_record_exactly_once(spark, stream,
                                                                                              tmp_path):
    name, url, publish = stream
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")

    def start(**trigger):
        return (spark.readStream.format(NAME).option("url", url).option("stream", name)
                .option("maxRecordsPerTrigger", "2").load()
                .writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
                .trigger(**trigger).start())

    query = start(processingTime="0.2 seconds")
    try:
        wait_for(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 2, timeout=120)
    finally:
        query.stop()
    assert sum(p["numInputRows"] for p in query.recentProgress) < 6  # stopped part way
    publish(3, 6)
    again = start(availableNow=True)
    again.awaitTermination(180)
    rows = spark.read.parquet(sink).select("offset", "body").collect()
    assert sorted(r.offset for r in rows) == list(range(9))
    assert sorted(bytes(r.body) for r in rows) == sorted(b"record-%d" % i for i in range(9))


def test_export_a_stream_to_csv(spark, stream, tmp_path, capsys):
    name, url, _publish = stream
    out = str(tmp_path / "csv")
    args = build_parser().parse_args(["export", "--stream", name, "--url", url, "--format", "csv", "--output", out])
    assert _run(spark, args, "csv") == 0
    (path,) = glob.glob(out + "/*.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["offset"]) for r in rows] == list(range(6))
    assert base64.b64decode(rows[3]["body"]) == b"record-3"
    assert "wrote csv" in capsys.readouterr().out


def test_stream_is_only_for_export():
    from spark_sink.__main__ import main
    assert main(["reasons", "--stream", "x"]) == 2
