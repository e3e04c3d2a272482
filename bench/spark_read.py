#!/usr/bin/env python3
"""The Spark reader's read rate: a stream of --records 1 KiB records read by
the hutch-stream data source, JSON pages against Arrow pages.

    python bench/spark_read.py                        # 1,000,000 records, local[1] and local[2]
    python bench/spark_read.py --records 50000        # a quick run

A fresh hutch from this checkout (management on a free port); amqpbench
(../shared/amqpbench, built here) fills the stream with confirms. Then, for
each wire format and each master, one batch query reads every record (all
columns: a Python data source reads whole rows) and sums the body lengths:
- total: records / wall seconds of the query;
- per executor: records / the summed run time of the query's tasks (Spark's
  REST API, executorRunTime), the rate one executor core reads at;
- broker CPU µs per record (/proc/<pid>/stat): where the time goes, whatever
  the load on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pika  # noqa: E402

from harness import (AMQPBENCH_SRC, amqpbench, build_amqpbench, cpu_seconds, free_port, fresh_hutch, log,  # noqa: E402
                     machine, revision)


def fill(binary: str, uri: str, port: int, name: str, records: int, size: int, pid: int) -> None:
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        connection.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    amqpbench(binary, uri, ["--predeclared", "--queue", name, "--producers", "1", "--consumers", "0",
                            "--pmessages", str(records), "--size", str(size), "--confirm", "100"], pid)


def task_seconds(spark) -> float:
    """Summed executorRunTime of the completed stages so far (seconds)."""
    url = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen("%s/api/v1/applications/%s/stages?status=complete" % (url, app)) as r:
        return sum(stage["executorRunTime"] for stage in json.load(r)) / 1000


def read_once(master: str, url: str, name: str, wire: str, records: int, pid: int,
              per_partition: int) -> dict:
    from pyspark.sql import functions as F

    from spark_sink.session import build_session
    from spark_sink.source import STREAM_NAME

    spark = build_session(master, "spark-read-bench", 2)
    try:
        df = (spark.read.format(STREAM_NAME).option("url", url).option("stream", name).option("wireFormat", wire)
              .option("recordsPerPartition", str(per_partition)).load())
        before_tasks, before_cpu, t0 = task_seconds(spark), cpu_seconds(pid), time.monotonic()
        row = df.agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("bytes")).collect()[0]
        wall = time.monotonic() - t0
        tasks, cpu = task_seconds(spark) - before_tasks, cpu_seconds(pid) - before_cpu
    finally:
        spark.stop()
    if row.n != records:
        raise RuntimeError("read %d records, expected %d" % (row.n, records))
    return {"master": master, "wire": wire, "wall_s": round(wall, 2), "total_rps": round(records / wall),
            "per_executor_rps": round(records / tasks) if tasks else None,
            "broker_cpu_us_per_record": round(cpu / records * 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--per-partition", type=int, default=50_000, help="recordsPerPartition")
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--wires", default="json,arrow")
    parser.add_argument("--amqpbench", default=AMQPBENCH_SRC)
    args = parser.parse_args()
    binary = build_amqpbench(os.path.abspath(args.amqpbench))
    http = free_port()
    log("machine: %s; hutch %s" % (machine(), revision()))
    results = []
    with fresh_hutch(["--management-enabled", "true", "--management-bind", "127.0.0.1",
                      "--management-port", str(http)]) as hutch:
        name = "spark-read-bench"
        t0 = time.monotonic()
        fill(binary, hutch.uri, hutch.port, name, args.records, args.size, hutch.pid)
        log("filled %d records of %d B in %.0f s" % (args.records, args.size, time.monotonic() - t0))
        url = "http://127.0.0.1:%d" % http
        for wire in args.wires.split(","):
            for master in args.masters.split(","):
                result = read_once(master, url, name, wire, args.records, hutch.pid, args.per_partition)
                log(json.dumps(result))
                results.append(result)
    print("| wire | master | total records/s | per executor records/s | broker CPU µs/record | wall s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print("| %s | %s | %s | %s | %s | %s |" % (r["wire"], r["master"], format(r["total_rps"], ","),
                                                   format(r["per_executor_rps"] or 0, ","),
                                                   r["broker_cpu_us_per_record"], r["wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
