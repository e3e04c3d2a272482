"""The command line and the connection settings.

rabbitmqctl accepts its general options anywhere on the line (`hutchctl -p v
list_queues` and `hutchctl list_queues -p v` are the same), a command's own
options after the command name, and `--name=value` as well as `--name value`.
`parse` finds the command, then sorts every other token into general options,
command options and positional arguments.

Connection settings come from, lowest first: defaults, the YAML file named by
--config (keys `url`, `username`, `password`), the HUTCH_URL, HUTCH_USERNAME,
HUTCH_PASSWORD environment variables, then the flags.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml

from cli.hutchctl import exit_codes
from cli.hutchctl.command import BadArgument, Command, Failure
from cli.hutchctl.formatters import FORMATTERS

DEFAULTS = {"url": "http://127.0.0.1:15672", "username": "guest", "password": "guest"}
ENVIRONMENT = {"url": "HUTCH_URL", "username": "HUTCH_USERNAME", "password": "HUTCH_PASSWORD"}
DEFAULT_TIMEOUT = 60

# general options: long name -> (short name or None, takes a value)
GENERAL = {
    "--vhost": ("-p", True),
    "--node": ("-n", True),
    "--timeout": ("-t", True),
    "--formatter": (None, True),
    "--url": (None, True),
    "--username": ("-u", True),
    "--password": (None, True),
    "--config": (None, True),
    "--quiet": ("-q", False),
    "--silent": ("-s", False),
    "--no-table-headers": (None, False),
    "--longnames": ("-l", False),
}
_SHORT = {short: name for name, (short, _) in GENERAL.items() if short}


@dataclass
class Invocation:
    command: str | None = None
    args: list[str] = field(default_factory=list)
    general: dict = field(default_factory=dict)  # long name without dashes -> value (True for flags)
    options: dict = field(default_factory=dict)  # command option as given ("--priority") -> value


def _split(token: str) -> tuple[str, str | None]:
    if token.startswith("--") and "=" in token:
        name, _, value = token.partition("=")
        return name, value
    return token, None


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _is_number(token)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def find_command(argv: list[str]) -> str | None:
    """The first token that is neither a general option nor its value."""
    tokens = iter(argv)
    for token in tokens:
        if _is_option(token):
            name, value = _split(token)
            name = _SHORT.get(name, name)
            if name in GENERAL and GENERAL[name][1] and value is None:
                next(tokens, None)
            continue
        return token
    return None


def parse(argv: list[str], command: Command | None) -> Invocation:
    """Sort argv; raise `BadArgument` for unknown options or missing values."""
    own = command.options if command else {}
    found = Invocation()
    unknown = []
    tokens = iter(argv)
    for token in tokens:
        if not _is_option(token):
            if found.command is None:
                found.command = token
            else:
                found.args.append(token)
            continue
        name, value = _split(token)
        # after the command name its own options win (delete_queue -u is --if-unused)
        mine = own if found.command is not None else {}
        if name not in mine:
            name = _SHORT.get(name, name)
        if name in mine:
            takes_value = mine[name]
            target, key = found.options, name
        elif name in GENERAL:
            takes_value = GENERAL[name][1]
            target, key = found.general, name[2:]
        elif found.command is not None and command is not None and command.forwards_options:
            found.args.append(token)
            continue
        else:
            unknown.append((name, value if value is not None else "true"))
            continue
        if takes_value and value is None:
            value = next(tokens, None)
            if value is None:
                raise BadArgument(f"option {name} requires a value")
        target[key] = value if takes_value else True
    if unknown:
        raise BadArgument("Invalid options for this command:\n"
                          + "\n".join(f"{name} : {value}" for name, value in unknown))
    return found


def integer(option: str, raw: str, minimum: int) -> int:
    """An option's whole-number value, at least `minimum`, as rabbitmqctl validates it."""
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise BadArgument(f"Invalid options for this command:\n{option} : {raw}")
    return value


def timeout(general: dict) -> int:
    raw = general.get("timeout")
    return DEFAULT_TIMEOUT if raw is None else integer("--timeout", raw, 1)


def formatter(general: dict) -> str:
    name = general.get("formatter", "table")
    if name not in FORMATTERS:
        raise BadArgument(f"Unsupported formatter '{name}' (use one of: {', '.join(FORMATTERS)})")
    return name


def connection_settings(general: dict, environ: Mapping[str, str]) -> dict:
    """url, username and password, each from the highest layer that sets it."""
    settings = dict(DEFAULTS)
    if "config" in general:
        settings.update(_from_file(general["config"]))
    for key, variable in ENVIRONMENT.items():
        if environ.get(variable):
            settings[key] = environ[variable]
    for key in DEFAULTS:
        if key in general:
            settings[key] = general[key]
    return settings


def _from_file(filename: str) -> dict:
    try:
        with open(filename, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise Failure(f"Error: cannot read the config file: {exc}", exit_codes.CONFIG) from None
    except yaml.YAMLError as exc:
        raise Failure(f"Error: {filename}: invalid YAML: {exc}", exit_codes.CONFIG) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Failure(f"Error: {filename}: expected a mapping with keys url, username, password",
                      exit_codes.CONFIG)
    for key, value in data.items():
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise Failure(f"Error: {filename}: unknown setting '{key}'{hint}; hutchctl reads url, "
                          f"username and password", exit_codes.CONFIG)
        if not isinstance(value, str):
            raise Failure(f"Error: {filename}: setting '{key}' must be a string, got {value!r}",
                          exit_codes.CONFIG)
    return data
