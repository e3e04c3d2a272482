"""The Spark reader and retention (Kafka's failOnDataLoss), against the
session broker with the session `spark`: a stream keeps a few small
segments; a streaming query reads it, then the stream grows until retention
has deleted records the query had not read yet. From its checkpoint the
query then fails and names the lost offsets (failOnDataLoss defaults to
true), or, with failOnDataLoss false, warns and goes on at the first record
kept. A batch read from an offset retention deleted fails the same way.
Also: the stream-neutral data source name, hutch-stream, beside the
hutch-dead-letters alias, and the Arrow pages (wireFormat arrow, the
default) making the same rows as the JSON pages."""
from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from helpers import connect, unique
from http_api import segment
from spark_sink.source import NAME, STREAM_NAME

# Records of about 200 bytes on disk: about ten per segment, two or three segments kept.
RETENTION = {"x-queue-type": "stream", "x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 4000}


@pytest.fixture
def small_stream(broker, api):
    """A stream that keeps a few KiB: (name, management URL, publish(count), bounds()).
    Each publish has its own connection: a test may leave the broker alone
    for minutes while Spark works."""
    name = unique("spark-loss")
    with connect(broker.port) as connection:
        connection.channel().queue_declare(name, durable=True, arguments=RETENTION)
    published = [0]

    def publish(count: int) -> None:
        with connect(broker.port) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for _ in range(count):
                channel.basic_publish("", name, b"record-%d-" % published[0] + b"x" * 100,
                                      pika.BasicProperties(message_id="m%d" % published[0]))
                published[0] += 1

    def bounds() -> tuple[int, int]:
        reply = api.get("/api/hutch/streams/%s/%s?limit=0" % (segment("/"), segment(name)))
        assert reply.status == 200, reply
        return reply.body["first_offset"], reply.body["next_offset"]

    yield name, "http://127.0.0.1:%d" % broker.ports["HTTP"], publish, bounds
    with connect(broker.port) as connection:
        connection.channel().queue_delete(name)


def _query(spark, url: str, name: str, sink: str, checkpoint: str, **options):
    reader = spark.readStream.format(STREAM_NAME).option("url", url).option("stream", name)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().select("offset", "body").writeStream.format("parquet").option("path", sink)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def _lost_to_retention(small_stream) -> int:
    """Publish until retention deleted records past the 5 read; the first kept."""
    _name, _url, publish, bounds = small_stream
    while bounds()[0] <= 5:
        publish(10)
    return bounds()[0]


@pytest.mark.timeout(300)
def test_a_streaming_query_fails_on_records_retention_deleted_before_it_read_them(spark, small_stream, tmp_path):
    name, url, publish, bounds = small_stream
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")
    publish(5)
    first_run = _query(spark, url, name, sink, checkpoint)
    first_run.awaitTermination(180)
    assert sorted(r.offset for r in spark.read.parquet(sink).collect()) == [0, 1, 2, 3, 4]
    first = _lost_to_retention(small_stream)

    failing = _query(spark, url, name, sink, checkpoint)
    with pytest.raises(Exception) as failure:
        failing.awaitTermination(180)
    message = str(failure.value)
    assert "offsets 5 to %d of stream '%s' in vhost '/' were deleted by retention" % (first - 1, name) in message
    assert "failOnDataLoss" in message
    assert sorted(r.offset for r in spark.read.parquet(sink).collect()) == [0, 1, 2, 3, 4]  # nothing committed

    going_on = _query(spark, url, name, sink, checkpoint, failOnDataLoss="false")
    going_on.awaitTermination(180)
    assert going_on.exception() is None
    end = bounds()[1]
    got = sorted(r.offset for r in spark.read.parquet(sink).collect())
    assert got == [0, 1, 2, 3, 4] + list(range(first, end))


# failOnDataLoss false: the warning, on the stderr of the process that read (a Spark of its own).
WARNED_READ = """
import json, sys
from spark_sink.session import build_session
from spark_sink.source import STREAM_NAME
url, name = sys.argv[1:3]
spark = build_session("local[1]", "warned", shuffle_partitions=1)
rows = (spark.read.format(STREAM_NAME).option("url", url).option("stream", name).option("startingOffsets", "0")
        .option("failOnDataLoss", "false").load().select("offset").collect())
print(json.dumps(sorted(r.offset for r in rows)))
spark.stop()
"""


@pytest.mark.timeout(300)
def test_a_batch_read_from_an_offset_retention_deleted_fails_or_warns_and_goes_on(spark, small_stream):
    name, url, publish, bounds = small_stream
    publish(5)
    first = _lost_to_retention(small_stream)
    reader = spark.read.format(STREAM_NAME).option("url", url).option("stream", name).option("startingOffsets", "3")
    with pytest.raises(Exception, match="offsets 3 to %d of stream '%s' in vhost '/' were deleted by retention"
                       % (first - 1, name)):
        reader.load().collect()
    end = bounds()[1]
    done = subprocess.run([sys.executable, "-c", WARNED_READ, url, name], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == list(range(first, end))
    assert "offsets 0 to %d of stream '%s' in vhost '/' were deleted by retention" % (first - 1, name) in done.stderr
    assert "failOnDataLoss is false" in done.stderr


def test_streams_have_a_stream_neutral_source_name_and_the_old_one_still_reads_them(spark, small_stream):
    name, url, publish, _bounds = small_stream
    publish(3)
    read = {}
    for source, wire in ((STREAM_NAME, "arrow"), (STREAM_NAME, "json"), (NAME, "arrow")):
        rows = (spark.read.format(source).option("url", url).option("stream", name).option("wireFormat", wire)
                .load().orderBy("offset").collect())
        read[source, wire] = [r.asDict() for r in rows]
    arrow = read[STREAM_NAME, "arrow"]
    assert [(r["offset"], r["message_id"], bytes(r["body"])[:9]) for r in arrow] == \
        [(0, "m0", b"record-0-"), (1, "m1", b"record-1-"), (2, "m2", b"record-2-")]
    assert read[STREAM_NAME, "json"] == arrow  # the Arrow pages and the JSON pages make the same rows
    assert read[NAME, "arrow"] == arrow
    with pytest.raises(Exception, match="hutch-stream data source reads a stream queue: name it with"):
        spark.read.format(STREAM_NAME).option("url", url).load()
