"""hutch's dead-letter log from the command line (docs/analytics.md):

- `list_dead_letters [--from N] [--limit M] [<column> ...]` prints the vhost's
  log records as a rabbitmqctl table, read page by page from hutch's
  `GET /api/hutch/dead-letters/{vhost}?start=N&limit=M`; no Spark involved.
- `dead_letters JOB [job options ...]` runs the Spark job `python -m
  spark_sink JOB` as a child process of the same interpreter, with hutchctl's
  URL, vhost and user as the job's --url, --vhost and --username and the
  password in HUTCH_PASSWORD (so it does not show in `ps`). The job's output
  goes straight to the terminal and its exit status is hutchctl's. hutchctl
  never imports spark_sink or PySpark: the job options it does not know are
  handed on untouched (`Command.forwards_options`) and spark_sink checks them.
"""
from __future__ import annotations

import datetime
import functools
import os
import subprocess
import sys

from cli.hutchctl.client import ApiError, path
from cli.hutchctl.command import BadArgument, Command, Context, api_failure, error, hutch_extension
from cli.hutchctl.options import integer
from cli.hutchctl.terms import FieldTable

ITEMS = ("offset", "time", "vhost", "queue", "reason", "exchange", "routing_keys", "dead_letter_exchange",
         "dead_letter_routing_key", "death_count", "delivery_count", "content_type", "message_id",
         "correlation_id", "app_id", "timestamp", "headers", "body_size", "body")
DEFAULT_ITEMS = ("offset", "time", "queue", "reason", "exchange", "routing_keys", "dead_letter_exchange",
                 "death_count", "message_id", "body_size")
PROPERTIES = frozenset(("content_type", "message_id", "correlation_id", "app_id", "timestamp", "headers"))
DEFAULT_LIMIT = 1000
PAGE = 10000  # the most records the API returns per request


def _time(seconds) -> str | None:
    """Seconds since the epoch as UTC, the way spark_sink's tables show it."""
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _value(record: dict, item: str):
    value = (record.get("properties") or {}).get(item) if item in PROPERTIES else record.get(item)
    if item in ("time", "timestamp"):
        return _time(value)
    if item == "headers":
        return FieldTable(value or {})
    return value


def _page(ctx: Context, api_path: str, query: dict) -> dict:
    try:
        return ctx.client.get(api_path, query) or {}
    except ApiError as exc:
        if exc.status == 404 and exc.error == "not_found":  # hutch, with dead_letter_log.enabled off
            raise error(exc.reason) from None
        raise


def _records(ctx: Context, start: int | None, limit: int):
    """Up to `limit` records from offset `start` (None: the first kept), in pages."""
    api_path = path("hutch", "dead-letters", ctx.vhost)
    while limit > 0:
        query = {"limit": min(limit, PAGE)}
        if start is not None:
            query["start"] = start
        # RabbitMQ answers a path under /api/hutch/ with an empty 400; hutch's own 400s cannot
        # happen here, the query is checked before
        records = hutch_extension(functools.partial(_page, ctx), api_path, "dead-letters", query,
                                  missing=(400, 404, 405)).get("records")
        if not records:
            return
        yield from records
        limit -= len(records)
        start = records[-1]["offset"] + 1  # not first + count: damaged records leave gaps


def list_dead_letters(ctx: Context, args: list[str], opts: dict) -> None:
    unknown = [column for column in args if column not in ITEMS]
    if unknown:
        raise BadArgument("Info key(s) %s are not supported" % ",".join(unknown))
    columns = args or list(DEFAULT_ITEMS)
    start = integer("--from", opts["--from"], 0) if "--from" in opts else None
    limit = integer("--limit", opts.get("--limit", str(DEFAULT_LIMIT)), 0)
    ctx.out.banner(f"Listing dead letters for vhost {ctx.vhost} ...")
    try:
        ctx.client.get(path("vhosts", ctx.vhost))
    except ApiError as exc:
        if exc.status == 404:
            return  # a vhost that does not exist lists nothing, as the other list_* commands
        raise api_failure(exc) from None
    rows = [[_value(record, column) for column in columns] for record in _records(ctx, start, limit)]
    ctx.out.info_items(columns, rows)


def dead_letters(ctx: Context, args: list[str], opts: dict) -> int:
    job, job_options = args[0], args[1:]
    ctx.out.banner(f"Running dead-letter job {job} for vhost {ctx.vhost} ...")
    ctx.out.stream.flush()  # before the job writes to the same terminal
    command = [sys.executable, "-m", "spark_sink", job, "--url", ctx.settings["url"], "--vhost", ctx.vhost,
               "--username", ctx.settings["username"], *job_options]
    job_process = subprocess.Popen(command, env=dict(os.environ, HUTCH_PASSWORD=ctx.settings["password"]))
    while True:
        try:
            return job_process.wait()
        except KeyboardInterrupt:
            continue  # the job got the same Ctrl-C (one process group); its exit status tells how it ended


COMMANDS = (
    Command("list_dead_letters", "[--vhost <vhost>] [--from <offset>] [--limit <count>] [<column>, ...]",
            f"Lists records of the dead-letter log from an offset (hutch; at most {DEFAULT_LIMIT} by default)",
            list_dead_letters, 0, None, {"--from": True, "--limit": True}),
    Command("dead_letters", "[--vhost <vhost>] <job> [<job option> ...] (python -m spark_sink --help)",
            "Runs a Spark analysis of the dead-letter log: python -m spark_sink <job> (hutch)",
            dead_letters, 1, None, forwards_options=True),
)
