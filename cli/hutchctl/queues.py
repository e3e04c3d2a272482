"""Commands on one queue: purge_queue and delete_queue (RabbitMQ's API), and
hutch's own peek and move, which use hutch extensions of the API (docs/cli.md):

    GET  /api/queues/{vhost}/{name}/peek?count=N
         -> the first N ready messages, left in place, in the shape of
            RabbitMQ's POST /api/queues/{vhost}/{name}/get answer
    POST /api/queues/{vhost}/{name}/move
         {"destination": {"queue": name} | {"exchange": name[, "routing_key": key]},
          "count": N or null}
         -> {"moved": n}
"""
from __future__ import annotations

from cli.hutchctl import exit_codes
from cli.hutchctl.client import path
from cli.hutchctl.command import BadArgument, Command, Context, attempt, error, hutch_extension
from cli.hutchctl.options import integer
from cli.hutchctl.terms import FieldTable

PEEK_COLUMNS = ("exchange", "routing_key", "redelivered", "payload_bytes", "payload_encoding", "payload",
                "properties")


def _queue(ctx: Context, name: str) -> dict:
    return attempt(ctx.client.get, path("queues", ctx.vhost, name),
                   not_found=error("Queue not found", exit_codes.USAGE))


def _count(opts: dict) -> int | None:
    raw = opts.get("--count")
    return None if raw is None else integer("--count", raw, 0)


def purge_queue(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f"Purging queue '{name}' in vhost '{ctx.vhost}' ...")
    attempt(ctx.client.delete, path("queues", ctx.vhost, name, "contents"), not_found=error("not_found"))


def delete_queue(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    if_empty = "--if-empty" in opts or "-e" in opts
    if_unused = "--if-unused" in opts or "-u" in opts
    conditions = [text for flag, text in ((if_empty, "if queue is empty"), (if_unused, "if queue is unused"))
                  if flag]
    ctx.out.banner(f"Deleting queue '{name}' on vhost '{ctx.vhost}' "
                   + (" and ".join(conditions) + " " if conditions else "") + "...")
    ready = _queue(ctx, name).get("messages_ready") or 0
    query = {}
    if if_empty:
        query["if-empty"] = "true"
    if if_unused:
        query["if-unused"] = "true"
    attempt(ctx.client.delete, path("queues", ctx.vhost, name), query,
            not_found=error("Queue not found", exit_codes.USAGE))
    ctx.out.line(f"Queue was successfully deleted with {ready} ready messages")


def peek(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    count = _count(opts)
    count = 1 if count is None else count
    ctx.out.banner(f"Peeking at {count} messages in queue '{name}' in vhost '{ctx.vhost}' ...")
    _queue(ctx, name)
    messages = hutch_extension(ctx.client.get, path("queues", ctx.vhost, name, "peek"), "peek",
                               {"count": count}) or []
    rows = [[FieldTable(m.get(c) or {}) if c == "properties" else m.get(c) for c in PEEK_COLUMNS]
            for m in messages]
    ctx.out.info_items(list(PEEK_COLUMNS), rows)


def move(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    count = _count(opts)
    if ("--to-queue" in opts) == ("--to-exchange" in opts):
        raise BadArgument("exactly one of --to-queue and --to-exchange is required")
    if "--to-queue" in opts:
        if "--routing-key" in opts:
            raise BadArgument("--routing-key goes with --to-exchange")
        destination = {"queue": opts["--to-queue"]}
        where = f"queue '{opts['--to-queue']}'"
    else:
        destination = {"exchange": opts["--to-exchange"]}
        if "--routing-key" in opts:  # without one, each message keeps its own routing key
            destination["routing_key"] = opts["--routing-key"]
        where = f"exchange '{opts['--to-exchange']}'"
    how_many = "all" if count is None else str(count)
    ctx.out.banner(f"Moving {how_many} messages from queue '{name}' to {where} in vhost '{ctx.vhost}' ...")
    _queue(ctx, name)
    answer = hutch_extension(ctx.client.post, path("queues", ctx.vhost, name, "move"), "move",
                             {"destination": destination, "count": count}) or {}
    ctx.out.line(f"Moved {answer.get('moved', 0)} messages")


COMMANDS = (
    Command("purge_queue", "[--vhost <vhost>] <queue>", "Purges a queue (removes all messages in it)",
            purge_queue, 1, 1),
    Command("delete_queue", "[--vhost <vhost>] <queue_name> [--if-empty|-e] [--if-unused|-u]",
            "Deletes a queue", delete_queue, 1, 1,
            {"--if-empty": False, "-e": False, "--if-unused": False, "-u": False}),
    Command("peek", "[--vhost <vhost>] <queue> [--count <count>]",
            "Shows the first messages of a queue without removing them (hutch)", peek, 1, 1,
            {"--count": True}),
    Command("move", "[--vhost <vhost>] <queue> --to-queue <queue> | --to-exchange <exchange> "
            "[--routing-key <key>] [--count <count>]",
            "Moves ready messages from a queue to another queue or an exchange (hutch)", move, 1, 1,
            {"--to-queue": True, "--to-exchange": True, "--routing-key": True, "--count": True}),
)
