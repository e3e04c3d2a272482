"""shovel_status, restart_shovel, delete_shovel and federation_status: the
commands of RabbitMQ's shovel and federation plugins, over the management
API's /api/shovels and /api/federation-links."""
from __future__ import annotations

from cli.hutchctl.client import path
from cli.hutchctl.command import Command, Context, attempt, error

# /api/shovels field -> rabbitmqctl shovel_status column
_SHOVEL_COLUMNS = {
    "dest_uri": "destination", "dest_protocol": "destination_protocol", "dest_queue": "destination_queue",
    "dest_exchange": "destination_exchange", "dest_exchange_key": "destination_exchange_key",
    "name": "name", "src_uri": "source", "src_protocol": "source_protocol", "src_queue": "source_queue",
    "src_exchange": "source_exchange", "src_exchange_key": "source_exchange_key", "state": "state",
    "type": "type", "vhost": "vhost",
}


def _last_changed(timestamp: str) -> str:
    """The API's "2026-11-26 3:45:38" as rabbitmqctl prints it, "2026-11-26 03:45:38"."""
    day, _, clock = (timestamp or "").partition(" ")
    return "%s %s" % (day, ":".join(part.zfill(2) for part in clock.split(":"))) if clock else timestamp


def _shovel_row(status: dict) -> dict:
    row = {column: status[field] for field, column in _SHOVEL_COLUMNS.items() if field in status}
    row["last_changed"] = _last_changed(status.get("timestamp", ""))
    row["termination_reason"] = status.get("reason", "")
    return row


def _node(ctx: Context, rows: list) -> str:
    """The node's name, as the banner shows it."""
    if rows:
        return rows[0]["node"]
    return (attempt(ctx.client.get, path("overview")) or {}).get("node", "")


def shovel_status(ctx: Context, args: list[str], opts: dict) -> None:
    statuses = attempt(ctx.client.get, path("shovels")) or []
    ctx.out.banner("Shovel status on node %s" % _node(ctx, statuses))
    rows = [_shovel_row(status) for status in statuses]
    columns = sorted({column for row in rows for column in row})
    ctx.out.info_items(columns, [[row.get(column, "") for column in columns] for row in rows])


def _not_found(ctx: Context) -> Exception:
    return error("Shovel with the given name was not found on the target node and / or virtual host '%s'" % ctx.vhost)


def restart_shovel(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner("Restarting dynamic Shovel %s in virtual host %s" % (name, ctx.vhost))
    attempt(ctx.client.delete, path("shovels", "vhost", ctx.vhost, name, "restart"), not_found=_not_found(ctx))


def delete_shovel(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner("Deleting shovel %s in vhost %s" % (name, ctx.vhost))
    attempt(ctx.client.delete, path("shovels", "vhost", ctx.vhost, name), not_found=_not_found(ctx))


_FEDERATION_COLUMNS = ("type", "name", "vhost", "exchange", "queue", "upstream_exchange", "upstream_queue",
                       "upstream", "id", "status", "local_connection", "uri", "timestamp", "error")


def federation_status(ctx: Context, args: list[str], opts: dict) -> None:
    links = attempt(ctx.client.get, path("federation-links")) or []
    ctx.out.banner("Listing federation links on node %s..." % _node(ctx, links))
    if not links and ctx.out.formatter == "table":
        ctx.out.line("[]")  # what rabbitmqctl prints when there are none
        return
    columns = [column for column in _FEDERATION_COLUMNS if any(column in link for link in links)]
    ctx.out.maps(columns, [[link.get(column, "") for column in columns] for link in links])


COMMANDS = (
    Command("shovel_status", "", "Displays status of Shovel on a node", shovel_status),
    Command("restart_shovel", "[--vhost <vhost>] <name>", "Restarts a dynamic Shovel", restart_shovel, 1, 1),
    Command("delete_shovel", "[--vhost <vhost>] <name>", "Deletes a Shovel", delete_shovel, 1, 1),
    Command("federation_status", "", "Displays federation link status", federation_status),
)
