"""Spark reads any stream queue: batch and Structured Streaming through the
hutch-dead-letters data source with .option("stream", NAME), stream offsets
as Spark offsets; a streaming query into Parquet killed part way (SIGKILL,
with its JVM) and restarted from its checkpoint ends with every record
exactly once; `python -m spark_sink export --stream NAME`. The session
`spark` fixture, tiny data."""
from __future__ import annotations

import base64
import csv
import glob
import os
import signal
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from helpers import unique, wait_for
from spark_sink.__main__ import _run, build_parser
from spark_sink.source import NAME

ROOT = Path(__file__).resolve().parent.parent


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


# The query of the killed run: its own SparkSession in a child process (killed with its JVM).
KILLED_QUERY = """
import sys, time
from spark_sink.session import build_session
from spark_sink.source import NAME
url, name, sink, checkpoint = sys.argv[1:5]
spark = build_session("local[1]", "killed", shuffle_partitions=1)
(spark.readStream.format(NAME).option("url", url).option("stream", name).option("maxRecordsPerTrigger", "2")
 .load().writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
 .trigger(processingTime="0.2 seconds").start())
time.sleep(600)
"""


@pytest.mark.timeout(300)
def test_a_streaming_query_killed_and_restarted_from_its_checkpoint_ends_with_every_record_once(spark, stream,
                                                                                                 tmp_path):
    """The first run is SIGKILLed (with its JVM) after it committed some
    micro-batches, possibly in the middle of another; the second run, from
    the same checkpoint, reads the rest: the Parquet sink holds every record
    exactly once."""
    name, url, publish = stream
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")
    child = subprocess.Popen([sys.executable, "-c", KILLED_QUERY, url, name, sink, checkpoint], cwd=ROOT,
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: glob.glob(os.path.join(checkpoint, "commits", "[0-9]*")) or child.poll() is not None,
                 timeout=180, interval=0.05)
        assert child.poll() is None, "the query process ended by itself"
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    assert len(glob.glob(os.path.join(checkpoint, "commits", "[0-9]*"))) < 3  # killed part way: 6 records take 3
    publish(3, 6)
    again = (spark.readStream.format(NAME).option("url", url).option("stream", name)
             .option("maxRecordsPerTrigger", "2").load()
             .writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    again.awaitTermination(180)
    rows = spark.read.parquet(sink).select("offset", "body").collect()
    assert sorted(r.offset for r in rows) == list(range(9))
    assert sorted(bytes(r.body) for r in rows) == sorted(b"record-%d" % i for i in range(9))


def test_a_batch_export_of_a_stream_from_an_offset_to_csv(spark, stream, tmp_path, capsys):
    name, url, _publish = stream
    out = str(tmp_path / "csv")
    args = build_parser().parse_args(["export", "--stream", name, "--url", url, "--format", "csv", "--output", out,
                                      "--starting-offsets", "2"])
    assert _run(spark, args, "csv") == 0
    (path,) = glob.glob(out + "/*.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["offset"]) for r in rows] == [2, 3, 4, 5]
    assert [base64.b64decode(r["body"]) for r in rows] == [b"record-%d" % i for i in range(2, 6)]
    first = rows[0]
    assert (first["exchange"], first["routing_key"], first["content_type"], first["message_id"]) == \
        ("", name, "text/plain", "m2")
    assert "n" in first["headers"] and "2" in first["headers"]  # JSON text, quoted by Spark's CSV writer
    assert "wrote csv" in capsys.readouterr().out


def test_stream_is_only_for_export():
    from spark_sink.__main__ import main
    assert main(["reasons", "--stream", "x"]) == 2
