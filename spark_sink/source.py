"""The PySpark data sources of hutch's offset-addressed logs (Python Data
Source API): "hutch-dead-letters" reads a vhost's dead-letter log,
"hutch-stream" a stream queue.

    spark.dataSource.register(DeadLetterSource)
    spark.dataSource.register(StreamSource)
    spark.read.format("hutch-dead-letters").option("url", ...).load()
    spark.readStream.format("hutch-dead-letters").option(...).load()
    spark.read.format("hutch-stream").option("stream", "orders").load()

"hutch-dead-letters" with the stream option reads the stream too: the name
streams were first read under, kept as an alias.

Options (case-insensitive): url (management API, default
http://127.0.0.1:15672), vhost ("/"), username/password ("guest"),
stream (the stream queue to read: columns STREAM_SCHEMA, offsets the
stream's; "hutch-stream" needs it), startingOffsets (earliest, latest or an
offset; default earliest), endingOffsets (batch only: latest or an offset),
maxRecordsPerTrigger (streaming), recordsPerPartition (default 10000),
wireFormat (streams: arrow, the default, reads Arrow IPC pages
(format=arrow) handed to Spark as record batches; json reads the JSON
pages; a broker without PyArrow answers 406 and the reader falls back to
JSON with a warning), pageSize (records per HTTP request, default 10000 for
Arrow, 1000 for JSON), failOnDataLoss (true,
the default: a read that finds records deleted by retention before it got
to them fails, saying which offsets; false: it logs a warning and goes on
at the first record kept; Kafka's option of that name).

Theory of operation: the driver asks the broker for the log's bounds and
plans offset ranges [start, end), one InputPartition each; executors read
their range over HTTP (`client.DeadLetterClient.records`). A streaming
offset is {"offset": N}, the next offset to read; Spark keeps it in the
checkpoint, so a restarted query plans the same ranges again and reads the
same records (the broker only exposes records already on disk, and offsets
are never reused): replay is deterministic while the broker keeps them.
Retention can delete records between two reads (a query stopped for longer
than the stream keeps them; a range planned on the driver and read later):
the executor reading the range sees the log's first offset past where it
should start and reports the loss (`_Options.lost`), as the driver does for
a startingOffsets below the first offset kept.
"""
from __future__ import annotations

import base64
import datetime
import json
import logging
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from spark_sink.client import DEFAULT_URL, PAGE_SIZE, ArrowRefused, DataLossError, DeadLetterClient

NAME = "hutch-dead-letters"  # the dead-letter log (and, with the stream option, a stream: an alias)
STREAM_NAME = "hutch-stream"  # a stream queue
RECORDS_PER_PARTITION = 10000
ARROW_PAGE_SIZE = 10000  # records per Arrow page (the broker's most; it also stops at 16 MiB)

log = logging.getLogger("spark_sink")

SCHEMA = StructType([
    StructField("offset", LongType(), False),
    StructField("time", TimestampType(), False),
    StructField("vhost", StringType(), False),
    StructField("queue", StringType(), False),
    StructField("reason", StringType(), False),
    StructField("exchange", StringType(), False),
    StructField("routing_keys", ArrayType(StringType()), False),
    StructField("dead_letter_exchange", StringType(), True),
    StructField("dead_letter_routing_key", StringType(), True),
    StructField("death_count", IntegerType(), False),
    StructField("delivery_count", IntegerType(), False),
    StructField("content_type", StringType(), True),
    StructField("message_id", StringType(), True),
    StructField("correlation_id", StringType(), True),
    StructField("app_id", StringType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("headers", StringType(), True),  # the headers table as JSON text
    StructField("body_size", LongType(), False),
    StructField("body", BinaryType(), True),
])


# A stream queue's records (GET /api/hutch/streams/{vhost}/{stream}).
STREAM_SCHEMA = StructType([
    StructField("offset", LongType(), False),
    StructField("time", TimestampType(), False),  # when the broker appended it
    StructField("exchange", StringType(), False),
    StructField("routing_key", StringType(), False),
    StructField("content_type", StringType(), True),
    StructField("content_encoding", StringType(), True),
    StructField("delivery_mode", IntegerType(), True),
    StructField("priority", IntegerType(), True),
    StructField("correlation_id", StringType(), True),
    StructField("reply_to", StringType(), True),
    StructField("expiration", StringType(), True),
    StructField("message_id", StringType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("type", StringType(), True),
    StructField("user_id", StringType(), True),
    StructField("app_id", StringType(), True),
    StructField("headers", StringType(), True),  # the headers table as JSON text
    StructField("body", BinaryType(), False),
])


def stream_row(record: dict) -> tuple:
    """One stream record of the HTTP API as a row of STREAM_SCHEMA."""
    props = record["properties"]
    return (
        record["offset"], _utc(record["time"]), record["exchange"], record["routing_key"],
        props.get("content_type"), props.get("content_encoding"), props.get("delivery_mode"), props.get("priority"),
        props.get("correlation_id"), props.get("reply_to"), props.get("expiration"), props.get("message_id"),
        _utc(props.get("timestamp")), props.get("type"), props.get("user_id"), props.get("app_id"),
        None if props.get("headers") is None else json.dumps(props["headers"], sort_keys=True),
        base64.b64decode(record["body"]),
    )


def _utc(seconds: float | None) -> datetime.datetime | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def to_row(record: dict) -> tuple:
    """One record of the HTTP API as a row of SCHEMA."""
    props = record["properties"]
    body = record.get("body")
    return (
        record["offset"], _utc(record["time"]), record["vhost"], record["queue"], record["reason"],
        record["exchange"], record["routing_keys"], record.get("dead_letter_exchange"),
        record.get("dead_letter_routing_key"), record["death_count"], record.get("delivery_count", 0),
        props.get("content_type"),
        props.get("message_id"), props.get("correlation_id"), props.get("app_id"), _utc(props.get("timestamp")),
        None if props.get("headers") is None else json.dumps(props["headers"], sort_keys=True),
        record["body_size"], None if body is None else base64.b64decode(body),
    )


class OffsetRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class _Options:
    """The options of one read, parsed once on the driver (picklable)."""

    def __init__(self, options: dict) -> None:
        lower = {k.lower(): v for k, v in options.items()}
        self.url = lower.get("url", DEFAULT_URL)
        self.vhost = lower.get("vhost", "/")
        self.username = lower.get("username", "guest")
        self.password = lower.get("password", "guest")
        self.stream = lower.get("stream")
        self.starting = lower.get("startingoffsets", "earliest")
        self.ending = lower.get("endingoffsets", "latest")
        self.max_per_trigger = _positive(lower, "maxrecordspertrigger", None)
        self.per_partition = _positive(lower, "recordsperpartition", RECORDS_PER_PARTITION)
        self.wire = lower.get("wireformat", "arrow").strip().lower()
        if self.wire not in ("arrow", "json"):
            raise ValueError("option wireFormat must be arrow or json, got %r" % self.wire)
        if self.stream is None:
            self.wire = "json"  # the dead-letter log is served as JSON only
        self.page_size = _positive(lower, "pagesize", ARROW_PAGE_SIZE if self.wire == "arrow" else PAGE_SIZE)
        self.fail_on_data_loss = _boolean(lower, "failondataloss", True)

    def describe(self) -> str:
        if self.stream is None:
            return "the dead-letter log of vhost %r" % self.vhost
        return "stream %r in vhost %r" % (self.stream, self.vhost)

    def lost(self, start: int, end: int, first: int) -> None:
        """Offsets [start, end) were deleted by retention before they were
        read: DataLossError, or a warning when failOnDataLoss is false."""
        message = "offsets %d to %d of %s were deleted by retention before they were read (the first kept is %d)" % (
            start, end - 1, self.describe(), first)
        if self.fail_on_data_loss:
            raise DataLossError(message + "; set the option failOnDataLoss to false to skip them with a warning")
        log.warning("%s: skipped, as failOnDataLoss is false", message)

    def start_at(self, first: int, next_: int) -> int:
        """Where startingOffsets starts, reporting a loss when it names an
        offset retention deleted."""
        start = self.resolve(self.starting, first, next_)
        if start < first:
            self.lost(start, first, first)
        return max(start, first)

    def client(self) -> DeadLetterClient:
        return DeadLetterClient(self.url, self.vhost, self.username, self.password, stream=self.stream)

    def resolve(self, spec: str, first: int, next_: int) -> int:
        """An offset option ("earliest", "latest" or a number) as an offset."""
        spec = spec.strip().lower()
        if spec == "earliest":
            return first
        if spec == "latest":
            return next_
        try:
            value = int(spec)
        except ValueError:
            raise ValueError("offset option must be earliest, latest or a number, got %r" % spec) from None
        if value < 0:
            raise ValueError("offset option must not be negative, got %d" % value)
        return value

    def split(self, start: int, end: int) -> list[OffsetRange]:
        step = self.per_partition
        return [OffsetRange(s, min(s + step, end)) for s in range(start, end, step)]

    def read(self, partition: OffsetRange) -> Iterator:
        """Rows of `partition`: Arrow record batches as the broker sent them
        (Spark takes them without a step per record), or tuples from JSON
        pages (the dead-letter log; wireFormat json; a broker without PyArrow)."""
        client = self.client()
        if self.wire == "arrow":
            batches = client.arrow_batches(partition.start, partition.end, self.page_size, self.lost)
            try:
                first = next(batches, None)
            except ArrowRefused as exc:
                log.warning("%s; reading JSON pages instead", exc)
            else:
                if first is not None:
                    yield first
                    yield from batches
                return
        row = to_row if self.stream is None else stream_row
        for record in client.records(partition.start, partition.end, self.page_size, self.lost):
            yield row(record)


def _positive(options: dict, key: str, default: int | None) -> int | None:
    if key not in options:
        return default
    value = int(options[key])
    if value <= 0:
        raise ValueError("option %s must be positive, got %d" % (key, value))
    return value


def _boolean(options: dict, key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise ValueError("option %s must be true or false, got %r" % (key, value))


class DeadLetterSource(DataSource):
    """hutch-dead-letters: the dead-letter log, or with the stream option a
    stream (the alias hutch-stream replaced)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return STREAM_SCHEMA if _Options(self.options).stream is not None else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(_Options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(_Options(self.options))


class StreamSource(DeadLetterSource):
    """hutch-stream: a stream queue, named by the stream option."""

    @classmethod
    def name(cls) -> str:
        return STREAM_NAME

    def schema(self) -> StructType:
        if _Options(self.options).stream is None:
            raise ValueError("the %s data source reads a stream queue: name it with .option(\"stream\", NAME)"
                             % STREAM_NAME)
        return STREAM_SCHEMA


class BatchReader(DataSourceReader):
    def __init__(self, options: _Options) -> None:
        self.options = options
        first, next_ = options.client().bounds()
        self.start = options.start_at(first, next_)
        self.end = min(options.resolve(options.ending, first, next_), next_)

    def partitions(self) -> Sequence[InputPartition]:
        return self.options.split(self.start, self.end) or [OffsetRange(self.start, self.start)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return self.options.read(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: {"offset": N}, the next offset to read."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.available_now: int | None = None  # the end of Trigger.AvailableNow

    def initialOffset(self) -> dict:
        first, next_ = self.options.client().bounds()
        return {"offset": self.options.start_at(first, next_)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger:
            return ReadMaxRows(self.options.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self.options.client().bounds()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first, end = self.options.client().bounds()
        if self.available_now is not None:
            end = min(end, self.available_now)
        position = max(start["offset"], first)
        if isinstance(limit, ReadMaxRows):
            end = min(end, position + limit.max_rows)
        return {"offset": max(end, start["offset"])}

    def reportLatestOffset(self) -> dict:
        return {"offset": self.options.client().bounds()[1]}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.options.split(start["offset"], end["offset"])

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return self.options.read(partition)
