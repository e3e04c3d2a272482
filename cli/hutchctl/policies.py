"""set_policy, clear_policy, set_operator_policy, clear_operator_policy,
and the runtime and global parameters (set_parameter, clear_parameter,
set_global_parameter, clear_global_parameter). Definitions and values are
parsed here so a typo is reported before anything is sent; the broker
validates their keys and values."""
from __future__ import annotations

import json

from cli.hutchctl.client import path
from cli.hutchctl.command import Command, Context, attempt, error
from cli.hutchctl.options import integer


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        raise error("JSON decoding error. Reason: badarg") from None


def _set_policy(collection: str, what: str):
    def run(ctx: Context, args: list[str], opts: dict) -> None:
        name, pattern, definition = args
        priority = opts.get("--priority", "0")
        priority_value = integer("--priority", priority, -2**31)
        ctx.out.banner(f'Setting {what} "{name}" for pattern "{pattern}" to "{definition}" '
                       f'with priority "{priority}" for vhost "{ctx.vhost}" ...')
        body = {"pattern": pattern, "definition": _json(definition), "priority": priority_value,
                "apply-to": opts.get("--apply-to", "all")}
        attempt(ctx.client.put, path(collection, ctx.vhost, name), body)
    return run


def _clear_policy(collection: str, what: str):
    def run(ctx: Context, args: list[str], opts: dict) -> None:
        name = args[0]
        ctx.out.banner(f'Clearing {what} "{name}" on vhost "{ctx.vhost}" ...')
        attempt(ctx.client.delete, path(collection, ctx.vhost, name), not_found=error("Parameter does not exist"))
    return run


def set_parameter(ctx: Context, args: list[str], opts: dict) -> None:
    component, name, value = args
    ctx.out.banner(f'Setting runtime parameter "{name}" for component "{component}" to "{value}" '
                   f'in vhost "{ctx.vhost}" ...')
    attempt(ctx.client.put, path("parameters", component, ctx.vhost, name), {"value": _json(value)})


def clear_parameter(ctx: Context, args: list[str], opts: dict) -> None:
    component, name = args
    ctx.out.banner(f'Clearing runtime parameter "{name}" for component "{component}" on vhost "{ctx.vhost}" ...')
    attempt(ctx.client.delete, path("parameters", component, ctx.vhost, name),
            not_found=error("Parameter does not exist"))


def set_global_parameter(ctx: Context, args: list[str], opts: dict) -> None:
    name, value = args
    ctx.out.banner(f'Setting global runtime parameter "{name}" to "{value}" ...')
    attempt(ctx.client.put, path("global-parameters", name), {"value": _json(value)})


def clear_global_parameter(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Clearing global runtime parameter "{name}" ...')
    attempt(ctx.client.delete, path("global-parameters", name), not_found=error("Parameter does not exist"))


set_policy = _set_policy("policies", "policy")
clear_policy = _clear_policy("policies", "policy")
_POLICY_OPTIONS = {"--priority": True, "--apply-to": True}


COMMANDS = (
    Command("set_policy", "[--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
            "<name> <pattern> <definition>", "Sets or updates a policy", set_policy, 3, 3, _POLICY_OPTIONS),
    Command("clear_policy", "[--vhost <vhost>] <name>", "Clears (removes) a policy", clear_policy, 1, 1),
    Command("set_operator_policy", "[--vhost <vhost>] [--priority <priority>] [--apply-to <apply-to>] "
            "<name> <pattern> <definition>", "Sets an operator policy that overrides a subset of arguments "
            "in user policies", _set_policy("operator-policies", "operator policy override"), 3, 3,
            _POLICY_OPTIONS),
    Command("clear_operator_policy", "[--vhost <vhost>] <name>", "Clears an operator policy",
            _clear_policy("operator-policies", "operator policy"), 1, 1),
    Command("set_parameter", "[--vhost <vhost>] <component_name> <name> <value>", "Sets a runtime parameter.",
            set_parameter, 3, 3),
    Command("clear_parameter", "[--vhost <vhost>] <component_name> <name>", "Clears a runtime parameter.",
            clear_parameter, 2, 2),
    Command("set_global_parameter", "<name> <value>", "Sets a runtime parameter.", set_global_parameter, 2, 2),
    Command("clear_global_parameter", "<name>", "Clears a global runtime parameter", clear_global_parameter, 1, 1),
)
