"""python -m spark_sink JOB [options]: dead-letter analyses with Spark.

Jobs: by-reason, by-queue, by-exchange, by-routing-key (per time window),
reasons, breakdown, top-queues, delivery-counts, samples, export (the raw
records), report (HTML with charts), stream (keeps the aggregates and the
report up to date). docs/analytics.md has examples. `export --stream NAME`
exports a stream queue's records instead (docs/streams.md).
"""
from __future__ import annotations

import argparse
import os
import sys

from spark_sink.client import DEFAULT_URL, DeadLetterLogError

BATCH_JOBS = ("by-reason", "by-queue", "by-exchange", "by-routing-key", "reasons", "breakdown", "top-queues",
              "delivery-counts", "samples", "export")
JOBS = BATCH_JOBS + ("report", "stream")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_sink", description="Analyse hutch's dead-letter log with Apache Spark.",
        epilog="The broker's management API serves the log; credentials need read access to the vhost "
               "(or the monitoring tag). Environment: HUTCH_URL, HUTCH_USERNAME, HUTCH_PASSWORD.")
    parser.add_argument("job", choices=JOBS)
    parser.add_argument("--url", default=os.environ.get("HUTCH_URL", DEFAULT_URL),
                        help="management API base URL (default %(default)s)")
    parser.add_argument("--vhost", default="/")
    parser.add_argument("--stream", help="export: this stream queue's records instead of the dead-letter log")
    parser.add_argument("--username", default=os.environ.get("HUTCH_USERNAME", "guest"))
    parser.add_argument("--password", default=os.environ.get("HUTCH_PASSWORD", "guest"))
    parser.add_argument("--master", default="local[*]",
                        help="Spark master: local[*] (default), spark://host:7077, yarn, k8s://...")
    parser.add_argument("--shuffle-partitions", type=int, default=8,
                        help="spark.sql.shuffle.partitions (default %(default)s; raise it for big logs on a cluster)")
    parser.add_argument("--starting-offsets", default="earliest", help="earliest (default), latest or an offset")
    parser.add_argument("--ending-offsets", default="latest", help="batch jobs: latest (default) or an offset")
    parser.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                        help="true (default): fail when records were deleted by retention before they were read; "
                             "false: warn and go on (the source's failOnDataLoss)")
    parser.add_argument("--window", default="1 hour", help="time window of the by-* jobs (default %(default)s)")
    parser.add_argument("--top", type=int, default=10, help="queues in top-queues and the report")
    parser.add_argument("--samples", type=int, default=3, help="messages per reason in samples")
    parser.add_argument("--format", choices=("table", "parquet", "csv", "html"),
                        help="output: table (default; html for report)")
    parser.add_argument("--output", help="file or directory to write (parquet, csv, html; stream: a directory)")
    parser.add_argument("--checkpoint", help="stream: Spark checkpoint directory (default OUTPUT/_checkpoint)")
    parser.add_argument("--trigger-seconds", type=float, default=10.0, help="stream: micro-batch interval")
    parser.add_argument("--max-records-per-trigger", type=int, help="stream: at most this many records per batch")
    parser.add_argument("--once", action="store_true", help="stream: process what is there now, then stop")
    parser.add_argument("--title", default="hutch dead letters", help="report title")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fmt = args.format or ("html" if args.job == "report" else "table")
    if (fmt == "html") != (args.job == "report"):
        print("spark_sink: the report job writes html, and only it does", file=sys.stderr)
        return 2
    if args.stream is not None and args.job != "export":
        print("spark_sink: --stream goes with the export job only", file=sys.stderr)
        return 2
    if (fmt != "table" or args.job == "stream") and not args.output:
        print("spark_sink: --output is needed for %s" % ("stream" if args.job == "stream" else fmt), file=sys.stderr)
        return 2

    # PySpark is imported only now: usage errors and a missing Java are reported without it.
    from spark_sink.session import JavaMissing, build_session

    try:
        spark = build_session(args.master, "hutch dead letters: %s" % args.job, args.shuffle_partitions)
    except JavaMissing as exc:
        print("spark_sink: %s" % exc, file=sys.stderr)
        return 3
    try:
        return _run(spark, args, fmt)
    finally:
        spark.stop()


def _run(spark, args: argparse.Namespace, fmt: str) -> int:
    from spark_sink import jobs, output, report, stream
    from spark_sink.source import NAME, STREAM_NAME

    options = jobs.JobOptions(window=args.window, top=args.top, samples=args.samples)
    source = {"url": args.url, "vhost": args.vhost, "username": args.username, "password": args.password,
              "startingOffsets": args.starting_offsets, "failOnDataLoss": args.fail_on_data_loss}
    if args.stream is not None:
        source["stream"] = args.stream
    try:
        if args.job == "stream":
            if args.max_records_per_trigger:
                source["maxRecordsPerTrigger"] = str(args.max_records_per_trigger)
            checkpoint = args.checkpoint or os.path.join(args.output, "_checkpoint")
            query = stream.start(spark, source, args.output, checkpoint, options, args.trigger_seconds,
                                 available_now=args.once, title=args.title, echo=print)
            query.awaitTermination()
            return 0
        reader = spark.read.format(NAME if args.stream is None else STREAM_NAME)
        reader = reader.option("endingOffsets", args.ending_offsets)
        for key, value in source.items():
            reader = reader.option(key, value)
        df = reader.load()
        if args.job == "report":
            data = report.gather(df.cache(), options, args.title, "%s vhost %s" % (args.url, args.vhost))
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(report.render(data))
            print("wrote the report (%d dead letters) to %s" % (data.total, os.path.abspath(args.output)))
            return 0
        result = jobs.export(df, fmt) if args.job == "export" else jobs.JOBS[args.job](df, options)
        print(output.write(result, fmt, args.output))
        return 0
    except Exception as exc:  # the reader's errors reach the driver wrapped by Spark
        reason = _reader_error(exc)
        if reason is None:
            raise
        print("spark_sink: %s" % reason, file=sys.stderr)
        return 1


def _reader_error(exc: Exception) -> str | None:
    """The DeadLetterLogError message inside `exc`, if that is what it is."""
    if isinstance(exc, DeadLetterLogError):
        return str(exc)
    for line in str(exc).splitlines():
        for marker in ("DeadLetterLogError: ", "DataLossError: "):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    return None


if __name__ == "__main__":
    sys.exit(main())
