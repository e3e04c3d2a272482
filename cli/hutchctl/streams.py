"""Super streams (partitioned streams), as `rabbitmq-streams` creates them:

- `add_super_stream NAME --partitions N` (or `--routing-keys a,b,...`)
  declares the direct exchange NAME (durable, argument x-super-stream: true)
  and one stream per partition, NAME-0 ... NAME-(N-1) (or NAME-a, NAME-b,
  ...), each bound with its partition's routing key ("0" ... or the key)
  and the binding argument x-stream-partition-order (0, 1, ...); the
  retention options go to every partition as queue arguments.
- `delete_super_stream NAME` deletes the partitions (the queues the
  exchange routes to by partition order) and the exchange.

Everything goes through RabbitMQ's management API (PUT exchange, PUT queue,
POST binding), so it works against any broker that has stream queues.
"""
from __future__ import annotations

from cli.hutchctl import exit_codes
from cli.hutchctl.client import ApiError, path
from cli.hutchctl.command import BadArgument, Command, Context, api_failure, attempt, error
from cli.hutchctl.options import integer

RETENTION = (("--max-length-bytes", "x-max-length-bytes", int), ("--max-age", "x-max-age", str),
             ("--stream-max-segment-size-bytes", "x-stream-max-segment-size-bytes", int))


def _partitions(opts: dict) -> list[str]:
    """The partitions' routing keys."""
    if ("--partitions" in opts) == ("--routing-keys" in opts):
        raise BadArgument("Specify --partitions or --routing-keys")
    if "--partitions" in opts:
        count = integer("--partitions", opts["--partitions"], 1)
        return [str(i) for i in range(count)]
    keys = [key.strip() for key in opts["--routing-keys"].split(",")]
    if not all(keys) or len(set(keys)) != len(keys):
        raise BadArgument("--routing-keys must be distinct, non-empty keys separated by commas")
    return keys


def add_super_stream(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    keys = _partitions(opts)
    arguments = {"x-queue-type": "stream"}
    for option, argument, kind in RETENTION:
        if option in opts:
            arguments[argument] = integer(option, opts[option], 0) if kind is int else opts[option]
    ctx.out.banner("Adding a super stream ...")
    try:
        ctx.client.get(path("exchanges", ctx.vhost, name))
    except ApiError as exc:
        if exc.status != 404:
            raise api_failure(exc) from None
    else:
        raise error(f"super stream {name} already exists", exit_codes.USAGE)
    attempt(ctx.client.put, path("exchanges", ctx.vhost, name),
            {"type": "direct", "durable": True, "auto_delete": False, "internal": False,
             "arguments": {"x-super-stream": True}})
    for order, key in enumerate(keys):
        partition = "%s-%s" % (name, key)
        attempt(ctx.client.put, path("queues", ctx.vhost, partition),
                {"durable": True, "auto_delete": False, "arguments": arguments})
        attempt(ctx.client.post, path("bindings", ctx.vhost, "e", name, "q", partition),
                {"routing_key": key, "arguments": {"x-stream-partition-order": order}})
    ctx.out.line(f"Super stream {name} was created")


def delete_super_stream(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner("Deleting a super stream ...")
    bindings = attempt(ctx.client.get, path("exchanges", ctx.vhost, name, "bindings", "source"),
                       not_found=error(f"super stream {name} does not exist", exit_codes.USAGE)) or []
    partitions = sorted({b["destination"] for b in bindings if b.get("destination_type") == "queue"
                         and "x-stream-partition-order" in (b.get("arguments") or {})})
    for partition in partitions:
        attempt(ctx.client.delete, path("queues", ctx.vhost, partition), not_found=None)
    attempt(ctx.client.delete, path("exchanges", ctx.vhost, name))
    ctx.out.line(f"Super stream {name} was deleted")


COMMANDS = (
    Command("add_super_stream", "[--vhost <vhost>] <name> --partitions <partitions> | --routing-keys <keys> "
            "[--max-length-bytes <bytes>] [--max-age <age>] [--stream-max-segment-size-bytes <bytes>]",
            "Adds a super stream: an exchange and its partition streams (as rabbitmq-streams)",
            add_super_stream, 1, 1, {"--partitions": True, "--routing-keys": True, "--max-length-bytes": True,
                                     "--max-age": True, "--stream-max-segment-size-bytes": True}),
    Command("delete_super_stream", "[--vhost <vhost>] <name>",
            "Deletes a super stream: its exchange and partition streams (as rabbitmq-streams)",
            delete_super_stream, 1, 1),
)
