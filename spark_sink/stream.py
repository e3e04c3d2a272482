"""The streaming job: keeps the dead-letter aggregates up to date.

Each micro-batch of the hutch-dead-letters stream is written to
OUTPUT/dead_letters/batch=<id> (Parquet, overwritten when Spark replays a
batch after a restart, so a batch id's rows are there exactly once), then
the aggregates are recomputed over everything kept and written atomically:
OUTPUT/report.html and OUTPUT/aggregates/<job>.csv. Spark keeps the source
offsets in CHECKPOINT, so a restarted job goes on where it stopped.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_sink import jobs, output, report
from spark_sink.source import NAME

SUMMARY_JOBS = ("reasons", "breakdown", "top-queues", "delivery-counts")


def start(spark: SparkSession, source_options: dict, output_dir: str, checkpoint: str,
          options: jobs.JobOptions, trigger_seconds: float = 10.0, available_now: bool = False,
          title: str = "hutch dead letters", echo: Callable[[str], None] | None = None) -> StreamingQuery:
    """Start the query; `echo` gets the reasons table after every batch."""
    raw_dir = os.path.join(output_dir, "dead_letters")
    source = "%s vhost %s" % (source_options.get("url", ""), source_options.get("vhost", "/"))

    def batch(df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(os.path.join(raw_dir, "batch=%d" % batch_id))
        everything = spark.read.parquet(raw_dir).drop("batch").cache()
        try:
            for name in SUMMARY_JOBS:
                _replace_csv(jobs.JOBS[name](everything, options), os.path.join(output_dir, "aggregates", name))
            _replace_text(os.path.join(output_dir, "report.html"),
                          report.render(report.gather(everything, options, title, source)))
            if echo is not None:
                echo("batch %d\n%s" % (batch_id, output.write(jobs.reasons(everything), "table", None)))
        finally:
            everything.unpersist()

    reader = spark.readStream.format(NAME)
    for key, value in source_options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="%g seconds" % trigger_seconds)
    return writer.start()


def _replace_csv(df: DataFrame, path: str) -> None:
    """Write next to `path`, then swap it in (a reader never sees half)."""
    staging = path + ".new"
    df.coalesce(1).write.mode("overwrite").option("header", True).csv(staging)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(staging, path)


def _replace_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".new", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".new", path)
