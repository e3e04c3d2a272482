"""Node-wide commands: status, close_connection, export/import_definitions,
set_vm_memory_high_watermark, set_disk_free_limit, trace_on and trace_off.

RabbitMQ's API has no endpoint for the memory watermark or the disk free
limit; hutch adds
`PUT /api/hutch/vm-memory-high-watermark {"value": <fraction> | "<amount>"}`
(a number is a fraction of RAM, a string an absolute amount such as "2GB")
and `PUT /api/hutch/disk-free-limit {"value": "<amount>"}` or
`{"mem_relative": <fraction of RAM>}`.
Tracing is the vhost's `tracing` attribute, set with RabbitMQ's own
`PUT /api/vhosts/{vhost}` (which resets description and tags it is not given,
so they are sent back as read).
"""
from __future__ import annotations

import json
import re
import sys

from cli.hutchctl import exit_codes
from cli.hutchctl.client import path
from cli.hutchctl.command import BadArgument, Command, Context, attempt, error, hutch_extension

# RabbitMQ's memory units: k, K, kiB, KiB, M, MiB, G, GiB are powers of 1024; kB, KB, MB, GB of 1000
ABSOLUTE_MEMORY = re.compile(r"^\d+(k|K|kiB|KiB|M|MiB|G|GiB|kB|KB|MB|GB)?$")


def _bold(text: str) -> str:
    return f"\x1b[1m{text}\x1b[0m" if sys.stdout.isatty() else text


def _gb(value) -> str:
    return "%s gb" % round((value or 0) / 1e9, 4)


def _interface(address: str) -> str:
    return f"[{address}]" if ":" in address else address  # IPv6 as rabbitmqctl prints it


def _node(ctx: Context) -> str:
    return (ctx.client.get(path("overview")) or {}).get("node", "?")


def status(ctx: Context, args: list[str], opts: dict) -> None:
    overview = ctx.client.get(path("overview")) or {}
    node_name = overview.get("node", "?")
    node = ctx.client.get(path("nodes", node_name)) or {}
    vhosts = ctx.client.get(path("vhosts")) or []
    totals = overview.get("object_totals") or {}
    alarms = [name for name, key in (("memory", "mem_alarm"), ("disk", "disk_free_alarm")) if node.get(key)]
    if ctx.out.formatter == "json":
        ctx.out.line(json.dumps({
            "pid": node.get("os_pid"), "node": node_name,
            "product_name": overview.get("product_name"), "product_version": overview.get("product_version"),
            "rabbitmq_version": overview.get("rabbitmq_version"), "erlang_version": overview.get("erlang_full_version"),
            "uptime": (node.get("uptime") or 0) // 1000, "alarms": alarms,
            "memory": {"total": node.get("mem_used"), "limit": node.get("mem_limit")},
            "vm_memory_calculation_strategy": node.get("mem_calculation_strategy"),
            "file_descriptors": {"total_used": node.get("fd_used"), "total_limit": node.get("fd_total"),
                                 "sockets_used": node.get("sockets_used"),
                                 "sockets_limit": node.get("sockets_total")},
            "disk_free": node.get("disk_free"), "disk_free_limit": node.get("disk_free_limit"),
            "totals": {"connection_count": totals.get("connections"), "queue_count": totals.get("queues"),
                       "virtual_host_count": len(vhosts)},
            "listeners": overview.get("listeners") or [],
        }, separators=(",", ":")))
        return
    ctx.out.banner(f"Status of node {node_name} ...")
    product = overview.get("product_name") or "RabbitMQ"
    sections = [
        ("Runtime", [
            f"OS PID: {node.get('os_pid', '')}",
            f"Uptime (seconds): {(node.get('uptime') or 0) // 1000}",
            f"{product} version: {overview.get('product_version') or overview.get('rabbitmq_version', '')}",
            f"Node name: {node_name}",
            f"Erlang configuration: {overview.get('erlang_full_version', '')}",
        ]),
        ("Plugins", ["Enabled plugins:", ""] + [f" * {name}" for name in node.get("enabled_plugins") or []]),
        ("Alarms", [f"{alarm}" for alarm in alarms] or ["(none)"]),
        ("Memory", [
            f"Total memory used: {_gb(node.get('mem_used'))}",
            f"Calculation strategy: {node.get('mem_calculation_strategy', '')}",
            f"Memory high watermark: {_gb(node.get('mem_limit'))}",
        ]),
        ("File Descriptors", [
            f"Total: {node.get('fd_used', '')}, limit: {node.get('fd_total', '')}",
            f"Sockets: {node.get('sockets_used', '')}, limit: {node.get('sockets_total', '')}",
        ]),
        ("Free Disk Space", [
            f"Low free disk space watermark: {_gb(node.get('disk_free_limit'))}",
            f"Free disk space: {_gb(node.get('disk_free'))}",
        ]),
        ("Totals", [
            f"Connection count: {totals.get('connections', 0)}",
            f"Queue count: {totals.get('queues', 0)}",
            f"Virtual host count: {len(vhosts)}",
        ]),
        ("Listeners", [
            f"Interface: {_interface(listener.get('ip_address', ''))}, port: {listener.get('port', '')}, "
            f"protocol: {listener.get('protocol', '')}"
            for listener in overview.get("listeners") or []
        ]),
    ]
    for title, lines in sections:
        ctx.out.line(_bold(title))
        ctx.out.line("")
        for line in lines:
            ctx.out.line(line)
        ctx.out.line("")


def close_connection(ctx: Context, args: list[str], opts: dict) -> None:
    name, explanation = args
    ctx.out.banner(f"Closing connection {name}, reason: {explanation}...")
    attempt(ctx.client.delete, path("connections", name), headers={"X-Reason": explanation},
            not_found=error(f"Connection {name} not found (list_connections name shows connection names)"))


def export_definitions(ctx: Context, args: list[str], opts: dict) -> None:
    target = args[0]
    definitions = attempt(ctx.client.get, path("definitions"))
    text = json.dumps(definitions, separators=(",", ":"), ensure_ascii=False)
    if target == "-":
        ctx.out.raw(text)
        return
    ctx.out.banner(f'Exporting definitions in JSON to a file at "{target}" ...')
    try:
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise error(f"could not write to {target}: {exc.strerror}", exit_codes.DATAERR) from None


def import_definitions(ctx: Context, args: list[str], opts: dict) -> None:
    source = args[0] if args else "-"
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as f:
                text = f.read()
    except FileNotFoundError:
        raise BadArgument(f"Bad argument: File {source} does not exist", exit_codes.DATAERR) from None
    except OSError as exc:
        raise BadArgument(f"Bad argument: File {source} cannot be read: {exc.strerror}",
                          exit_codes.DATAERR) from None
    where = "standard input" if source == "-" else f'a file at "{source}"'
    ctx.out.banner(f"Importing definitions in JSON from {where} ...")
    try:
        definitions = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise error(f"Failed to decode JSON from {where}: {exc}", exit_codes.DATAERR) from None
    attempt(ctx.client.post, path("definitions"), definitions)
    ctx.out.message("Successfully started definition import. This process is asynchronous and can take some time.")


def set_vm_memory_high_watermark(ctx: Context, args: list[str], opts: dict) -> None:
    if args[0] == "absolute":
        if len(args) != 2:
            raise BadArgument("not enough arguments." if len(args) < 2 else "too many arguments.")
        if not ABSOLUTE_MEMORY.match(args[1]):
            raise BadArgument("Bad argument: Invalid units.", exit_codes.DATAERR)
        value, shown = args[1], args[1] + " bytes"
    else:
        if len(args) != 1:
            raise BadArgument("too many arguments.")
        try:
            value = float(args[0])
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise BadArgument("Bad argument: The threshold should be a fraction between 0.0 and 1.0",
                              exit_codes.DATAERR)
        shown = args[0]
    ctx.out.banner(f"Setting memory threshold on {_node(ctx)} to {shown} ...")
    hutch_extension(ctx.client.put, path("hutch", "vm-memory-high-watermark"), "vm-memory-high-watermark",
                    {"value": value})


def set_disk_free_limit(ctx: Context, args: list[str], opts: dict) -> None:
    if args[0] == "mem_relative":
        if len(args) != 2:
            raise BadArgument("not enough arguments." if len(args) < 2 else "too many arguments.")
        try:
            fraction = float(args[1])
        except ValueError:
            fraction = -1.0
        if fraction < 0:
            raise BadArgument("Bad argument.", exit_codes.DATAERR)
        body, shown = {"mem_relative": fraction}, f"{args[1]} times the total RAM"
    else:
        if len(args) != 1:
            raise BadArgument("too many arguments.")
        if not ABSOLUTE_MEMORY.match(args[0]):
            raise BadArgument("Bad argument.", exit_codes.DATAERR)
        body, shown = {"value": args[0]}, args[0] + " bytes"
    ctx.out.banner(f"Setting disk free limit on {_node(ctx)} to {shown} ...")
    hutch_extension(ctx.client.put, path("hutch", "disk-free-limit"), "disk-free-limit", body)


def _set_tracing(ctx: Context, enabled: bool) -> None:
    vhost = attempt(ctx.client.get, path("vhosts", ctx.vhost),
                    not_found=error(f"Virtual host {ctx.vhost} does not exist"))
    tags = vhost.get("tags") or []
    body = {"description": vhost.get("description") or "", "tracing": enabled,
            "tags": tags if isinstance(tags, str) else ",".join(tags)}
    if vhost.get("default_queue_type") not in (None, "undefined"):
        body["default_queue_type"] = vhost["default_queue_type"]
    attempt(ctx.client.put, path("vhosts", ctx.vhost), body)


def trace_on(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f'Starting tracing for vhost "{ctx.vhost}" ...')
    _set_tracing(ctx, True)
    ctx.out.line(f"Trace enabled for vhost {ctx.vhost}")


def trace_off(ctx: Context, args: list[str], opts: dict) -> None:
    ctx.out.banner(f'Stopping tracing for vhost "{ctx.vhost}" ...')
    _set_tracing(ctx, False)
    ctx.out.line(f"Trace disabled for vhost {ctx.vhost}")


COMMANDS = (
    Command("status", "", "Displays status of a node", status),
    Command("close_connection", "<connection name> <explanation>",
            "Instructs the broker to close the connection with the given name", close_connection, 2, 2),
    Command("export_definitions", "<file_path | \"-\">",
            "Exports definitions in JSON to a file or standard output", export_definitions, 1, 1),
    Command("import_definitions", "<file_path | \"-\">",
            "Imports definitions in JSON from a file or standard input", import_definitions, 0, 1),
    Command("set_vm_memory_high_watermark", "<fraction> | absolute <value>",
            "Sets the vm_memory_high_watermark setting", set_vm_memory_high_watermark, 1, 2),
    Command("set_disk_free_limit", "<disk_limit> | mem_relative <fraction>",
            "Sets the disk_free_limit setting", set_disk_free_limit, 1, 2),
    Command("trace_on", "[--vhost <vhost>]", "Enables tracing (firehose) for the vhost: every published "
            "and delivered message is copied to amq.rabbitmq.trace", trace_on),
    Command("trace_off", "[--vhost <vhost>]", "Disables tracing (firehose) for the vhost", trace_off),
)
