"""Streaming reads of the dead-letter log: new dead letters appear in the
next micro-batch and the streaming job's aggregates follow them; a query
stopped and restarted from its checkpoint goes on with nothing missing and
nothing duplicated in a Parquet sink."""
from __future__ import annotations

import csv
import glob
import os

import pytest

from dead_letter_clients import Workload, delete_vhost, new_vhost
from helpers import wait_for
from spark_sink import jobs, stream
from spark_sink.source import NAME


@pytest.fixture
def workload(broker):
    vhost = new_vhost(broker)
    work = Workload(broker, vhost)
    work.url = "http://127.0.0.1:%d" % broker.ports["HTTP"]
    yield work
    work.close()
    delete_vhost(broker, vhost)


def reason_counts(output_dir: str) -> dict:
    (path,) = glob.glob(os.path.join(output_dir, "aggregates", "reasons", "*.csv"))
    with open(path, newline="") as f:
        return {row["reason"]: int(row["count"]) for row in csv.DictReader(f)}


@pytest.mark.timeout(240)
def test_the_streaming_job_updates_its_aggregates_every_micro_batch(spark, workload, tmp_path):
    out, echoed = str(tmp_path / "out"), []
    source = {"url": workload.url, "vhost": workload.vhost}
    query = stream.start(spark, source, out, str(tmp_path / "cp"), jobs.JobOptions(window="1 day"),
                         trigger_seconds=0.5, echo=echoed.append)
    try:
        workload.run(rejected=2, expired=1)
        query.processAllAvailable()
        assert reason_counts(out) == {"rejected": 2, "expired": 1, "maxlen": 0, "delivery_limit": 0}
        first = query.lastProgress["batchId"]
        workload.run(maxlen=3, delivery_limit=1)
        query.processAllAvailable()
        assert reason_counts(out) == {"rejected": 2, "expired": 1, "maxlen": 3, "delivery_limit": 1}
        fed = [p for p in query.recentProgress if p["numInputRows"]]
        assert fed[-1]["batchId"] > first and fed[-1]["numInputRows"] == 4
        assert "<title>maxlen: 3</title>" in open(os.path.join(out, "report.html")).read()
        assert "maxlen" in echoed[-1] and echoed[-1].startswith("batch ")
    finally:
        query.stop()


@pytest.mark.timeout(240)
def test_a_restarted_query_continues_from_its_checkpoint_exactly_once(spark, workload, tmp_path):
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "cp")

    def start(**trigger):
        return (spark.readStream.format(NAME).option("url", workload.url).option("vhost", workload.vhost)
                .option("maxRecordsPerTrigger", "2").load()
                .writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
                .trigger(**trigger).start())

    workload.run(rejected=5, expired=4)
    query = start(processingTime="0.2 seconds")
    try:
        wait_for(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 4, timeout=120)
    finally:
        query.stop()
    read_before = sum(p["numInputRows"] for p in query.recentProgress)
    assert 4 <= read_before < 9  # stopped part way: two records per trigger
    workload.run(maxlen=3, delivery_limit=2)
    again = start(availableNow=True)
    again.awaitTermination(180)
    assert max(p["numInputRows"] for p in again.recentProgress) == 2
    rows = spark.read.parquet(sink).select("offset", "queue", "reason").collect()
    assert sorted(r.offset for r in rows) == list(range(14))
    counts = {}
    for r in rows:
        counts[(r.queue, r.reason)] = counts.get((r.queue, r.reason), 0) + 1
    assert counts == dict(workload.died)
