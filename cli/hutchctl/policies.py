"""set_policy and clear_policy. The definition is parsed here so a typo is
reported before anything is sent; the broker validates its keys and values."""
from __future__ import annotations

import json

from cli.hutchctl.client import path
from cli.hutchctl.command import Command, Context, attempt, error
from cli.hutchctl.options import integer


def set_policy(ctx: Context, args: list[str], opts: dict) -> None:
    name, pattern, definition = args
    priority = opts.get("--priority", "0")
    priority_value = integer("--priority", priority, -2**31)
    ctx.out.banner(f'Setting policy "{name}" for pattern "{pattern}" to "{definition}" '
                   f'with priority "{priority}" for vhost "{ctx.vhost}" ...')
    try:
        parsed = json.loads(definition)
    except ValueError:
        raise error("JSON decoding error. Reason: badarg") from None
    body = {"pattern": pattern, "definition": parsed, "priority": priority_value,
            "apply-to": opts.get("--apply-to", "all")}
    attempt(ctx.client.put, path("policies", ctx.vhost, name), body)


def clear_policy(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Clearing policy "{name}" on vhost "{ctx.vhost}" ...')
    attempt(ctx.client.delete, path("policies", ctx.vhost, name), not_found=error("Parameter does not exist"))


COMMANDS = (
    Command("set_policy", "[--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
            "<name> <pattern> <definition>", "Sets or updates a policy", set_policy, 3, 3,
            {"--priority": True, "--apply-to": True}),
    Command("clear_policy", "[--vhost <vhost>] <name>", "Clears (removes) a policy", clear_policy, 1, 1),
)
