"""The analyses, as functions from the dead-letter DataFrame (source.SCHEMA)
to a small result DataFrame. Each is named in JOBS, which `python -m
spark_sink JOB` runs; `report` puts them all in one HTML page."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
# Which dimension each "by-..." job groups by (routing keys: one row per key).
DIMENSIONS = {"reason": "reason", "queue": "queue", "exchange": "exchange", "routing-key": "routing_key"}


@dataclass
class JobOptions:
    window: str = "1 hour"  # time window of the by-* jobs
    top: int = 10  # rows of top-queues
    samples: int = 3  # messages per reason in samples


def by_dimension(df: DataFrame, dimension: str, window: str) -> DataFrame:
    """Dead letters per time window and value of one dimension."""
    if dimension == "routing_key":
        df = df.withColumn("routing_key", F.explode("routing_keys"))
    return (df.groupBy(F.window("time", window).alias("w"), F.col(dimension))
            .count()
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), dimension, "count")
            .orderBy("window_start", F.desc("count"), dimension))


def breakdown(df: DataFrame) -> DataFrame:
    """Expiry vs rejection vs length limit (vs delivery limit), per vhost and
    queue, with a total row per queue's share of all dead letters."""
    counts = df.groupBy("vhost", "queue").pivot("reason", list(REASONS)).count().na.fill(0)
    total = F.lit(0)
    for reason in REASONS:
        total = total + F.col(reason)
    everything = df.count() or 1
    return (counts.withColumn("total", total)
            .withColumn("share", F.round(F.col("total") * 100.0 / everything, 1))
            .orderBy(F.desc("total"), "vhost", "queue"))


def reasons(df: DataFrame) -> DataFrame:
    """Dead letters per reason, every reason listed (0 when none)."""
    counts = {r["reason"]: r["count"] for r in df.groupBy("reason").count().collect()}
    names = list(REASONS) + sorted(set(counts) - set(REASONS))
    everything = sum(counts.values()) or 1
    rows = [(name, counts.get(name, 0), round(counts.get(name, 0) * 100.0 / everything, 1)) for name in names]
    return df.sparkSession.createDataFrame(rows, "reason string, count long, percent double")


def top_queues(df: DataFrame, n: int) -> DataFrame:
    """The queues where most messages died, with their main reason."""
    per_reason = df.groupBy("vhost", "queue", "reason").count()
    rank = Window.partitionBy("vhost", "queue").orderBy(F.desc("count"), "reason")
    main = (per_reason.withColumn("r", F.row_number().over(rank)).where("r = 1")
            .select("vhost", "queue", F.col("reason").alias("main_reason")))
    totals = df.groupBy("vhost", "queue").agg(
        F.count("*").alias("count"), F.min("time").alias("first"), F.max("time").alias("last"),
        F.sum("body_size").alias("bytes"))
    return (totals.join(main, ["vhost", "queue"])
            .select("vhost", "queue", "count", "main_reason", "first", "last", "bytes")
            .orderBy(F.desc("count"), "vhost", "queue").limit(n))


def delivery_counts(df: DataFrame) -> DataFrame:
    """Per reason: how often messages had died (death_count, as in x-death)
    and been given back after a delivery (delivery_count, x-delivery-count)."""
    return (df.groupBy("reason")
            .agg(F.count("*").alias("count"),
                 F.min("death_count").alias("min_deaths"),
                 F.round(F.avg("death_count"), 2).alias("avg_deaths"),
                 F.max("death_count").alias("max_deaths"),
                 F.percentile_approx("death_count", 0.95).alias("p95_deaths"),
                 F.round(F.avg("delivery_count"), 2).alias("avg_delivery_count"),
                 F.max("delivery_count").alias("max_delivery_count"))
            .orderBy(F.desc("count"), "reason"))


def death_histogram(df: DataFrame) -> DataFrame:
    """How many dead letters had died 1, 2, 3... times."""
    return df.groupBy("death_count").count().orderBy("death_count")


def samples(df: DataFrame, n: int) -> DataFrame:
    """The first `n` dead letters (by offset) of each reason, body previewed."""
    first = Window.partitionBy("reason").orderBy("offset")
    preview = F.substring(F.decode(F.coalesce("body", F.lit(b"")), "UTF-8"), 1, 60)
    return (df.withColumn("n", F.row_number().over(first)).where(F.col("n") <= n)
            .select("reason", "offset", "time", "queue", "exchange",
                    F.concat_ws(",", "routing_keys").alias("routing_keys"),
                    "message_id", "death_count", "body_size", preview.alias("body_preview"))
            .orderBy("reason", "offset"))


def export(df: DataFrame, fmt: str) -> DataFrame:
    """The records themselves (of the dead-letter log or a stream); CSV
    cannot hold arrays or bytes, so there the routing keys are comma-joined
    and the body is base64."""
    if fmt != "csv":
        return df.orderBy("offset")
    if "routing_keys" in df.columns:
        df = df.withColumn("routing_keys", F.concat_ws(",", "routing_keys"))
    return df.withColumn("body", F.base64("body")).orderBy("offset")


def _by(column: str) -> Callable[[DataFrame, JobOptions], DataFrame]:
    return lambda df, o: by_dimension(df, column, o.window)


JOBS: dict[str, Callable[[DataFrame, JobOptions], DataFrame]] = {
    **{"by-" + name: _by(column) for name, column in DIMENSIONS.items()},
    "reasons": lambda df, o: reasons(df),
    "breakdown": lambda df, o: breakdown(df),
    "top-queues": lambda df, o: top_queues(df, o.top),
    "delivery-counts": lambda df, o: delivery_counts(df),
    "samples": lambda df, o: samples(df, o.samples),
}
