"""set_policy and clear_policy. The definition is parsed here so a typo is
reported before anything is sent; the broker validates its keys and values."""
from __future__ import annotations

import json

from cli.hutchctl.client import ApiError, path
from cli.hutchctl.command import BadArgument, Command, Context, api_failure, error


def set_policy(ctx: Context, args: list[str], opts: dict) -> None:
    name, pattern, definition = args
    priority = opts.get("--priority", "0")
    try:
        priority_value = int(priority)
    except ValueError:
        raise BadArgument(f"Invalid options for this command:\n--priority : {priority}") from None
    ctx.out.banner(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" '
                   f'with priority "{priority}" for vhost "{ctx.vhost}" ...')
    try:
        parsed = json.loads(definition)
    except ValueError:
        raise error("JSON decoding error. Reason: badarg") from None
    body = {"pattern": pattern, "definition": parsed, "priority": priority_value,
            "apply-to": opts.get("--apply-to", "all")}
    try:
        ctx.client.put(path("policies", ctx.vhost, name), body)
    except ApiError as exc:
        raise api_failure(exc) from None


def clear_policy(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Clearing policy "{name}" on vhost "{ctx.vhost}" ...')
    try:
        ctx.client.delete(path("policies", ctx.vhost, name))
    except ApiError as exc:
        if exc.status == 404:
            raise error("Parameter does not exist") from None
        raise api_failure(exc) from None


COMMANDS = (
    Command("set_policy", "[--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
            "<name> <pattern> <definition>", "Sets or updates a policy", set_policy, 3, 3,
            {"--priority": True, "--apply-to": True}),
    Command("clear_policy", "[--vhost <vhost>] <name>", "Clears (removes) a policy", clear_policy, 1, 1),
)
