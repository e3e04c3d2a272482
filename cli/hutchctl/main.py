"""hutchctl's entry point: find the command, check its arguments, run it, and
turn every failure into rabbitmqctl's message and exit status (exit_codes)."""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from cli.hutchctl import exit_codes, options
from cli.hutchctl.client import ApiError, ManagementClient, NotAuthorised, Refused, TimedOut, Unreachable
from cli.hutchctl.command import BadArgument, Command, Context, Failure
from cli.hutchctl.formatters import Output
from cli.hutchctl.registry import COMMANDS

PROG = "hutchctl"
GENERAL_USAGE = f"{PROG} [--node <node>] [--timeout <timeout>] [--longnames] [--quiet] <command> [<command options>]"


def _bold(text: str) -> str:
    return f"\x1b[1m{text}\x1b[0m" if sys.stderr.isatty() else text


def _usage_line(command: Command) -> str:
    return f"{PROG} [--node <node>] [--longnames] [--quiet] {command.name} {command.usage}".rstrip()


def _command_list() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    return "\n".join(f"   {name.ljust(width)}{COMMANDS[name].description}" for name in sorted(COMMANDS))


def _general_help() -> str:
    return (f"\n{_bold('Usage')}\n\n{GENERAL_USAGE}\n\n"
            "General options: -p/--vhost <vhost>, -q/--quiet, -s/--silent, --formatter table|json|csv,\n"
            "--no-table-headers, -t/--timeout <seconds>, --url <management API URL> (env HUTCH_URL),\n"
            "-u/--username <user> (HUTCH_USERNAME), --password <password> (HUTCH_PASSWORD),\n"
            "--config <YAML file with url, username, password>; -n/--node is accepted and ignored.\n\n"
            f"Available commands:\n\n{_command_list()}\n")


def _argument_error(argv: list[str], command: Command, exc: BadArgument) -> int:
    sys.stderr.write(f"Error (argument validation): {exc.reason}\nArguments given:\n\t{' '.join(argv)}\n\n"
                     f"{_bold('Usage')}\n\n{_usage_line(command)}\n")
    return exc.code


def _unreachable(url: str, detail: str) -> str:
    return (f"Error: unable to perform an operation on the broker at {url}. "
            "Please see diagnostics information and suggestions below.\n\n"
            "Most common reasons for this are:\n\n"
            " * Target broker is unreachable (e.g. due to hostname resolution, TCP connection or firewall issues)\n"
            " * The broker's management HTTP API is not enabled, or listens on another address or port\n"
            " * Target broker is not running\n\n"
            "In addition to the diagnostics info below:\n\n"
            " * Check the URL given with --url, HUTCH_URL or the --config file\n"
            " * Consult the broker's log\n\n"
            f"DIAGNOSTICS\n===========\n\nattempted to contact: {url}\n\nerror: {detail}\n")


def _help(args: list[str]) -> int:
    if args and args[0] in COMMANDS:
        command = COMMANDS[args[0]]
        sys.stdout.write(f"\n{_bold('Usage')}\n\n{_usage_line(command)}\n\n{command.description}.\n")
        return exit_codes.OK
    sys.stdout.write(_general_help())
    return exit_codes.OK


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The exit status of one hutchctl invocation (`sys.argv`, `os.environ` by default)."""
    try:
        status = _run(sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`hutchctl list_queues | head -1`): stop quietly, as a filter should
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = exit_codes.OK
    return status


def _run(argv: list[str], environ: Mapping[str, str]) -> int:
    if any(a in ("--help", "-?") for a in argv):
        return _help([a for a in argv if a not in ("--help", "-?")])
    name = options.find_command(argv)
    if name is None:
        sys.stderr.write(_general_help())
        return exit_codes.USAGE
    if name == "help":
        return _help([a for a in argv if a != "help"])
    command = COMMANDS.get(name)
    if command is None:
        sys.stderr.write(f"\nCommand '{name}' not found. \n{_general_help()}")
        return exit_codes.USAGE
    try:
        invocation = options.parse(argv, command)
        given = len(invocation.args)
        if given < command.min_args:
            raise BadArgument("not enough arguments.")
        if command.max_args is not None and given > command.max_args:
            raise BadArgument("too many arguments.")
        general = invocation.general
        formatter = options.formatter(general)
        timeout = options.timeout(general)
    except BadArgument as exc:
        return _argument_error(argv, command, exc)
    try:
        settings = options.connection_settings(general, environ)
    except Failure as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.code
    silent = "silent" in general
    out = Output(formatter, quiet=silent or "quiet" in general,
                 headers=not (silent or "no-table-headers" in general))
    client = ManagementClient(settings["url"], settings["username"], settings["password"], timeout)
    ctx = Context(client, out, general.get("vhost", "/"), timeout, settings)
    try:
        status = command.run(ctx, invocation.args, invocation.options)
    except BadArgument as exc:
        return _argument_error(argv, command, exc)
    except Failure as exc:
        sys.stderr.write(exc.message + "\n")
        return exc.code
    except Unreachable as exc:
        sys.stderr.write(_unreachable(client.url, str(exc)))
        return exit_codes.UNAVAILABLE
    except TimedOut:
        sys.stderr.write(f"Error: operation {name} on the broker at {client.url} timed out. "
                         f"Timeout value used: {timeout * 1000}\n")
        return exit_codes.TEMPFAIL
    except Refused as exc:
        sys.stderr.write(f"Error: the broker at {client.url} refused the credentials of user "
                         f"'{settings['username']}': {exc}\n")
        return exit_codes.NOPERM
    except NotAuthorised as exc:
        sys.stderr.write(f"Error: the broker at {client.url} accepted the credentials of user "
                         f"'{settings['username']}' but did not authorise this operation: {exc}\n")
        return exit_codes.NOPERM
    except ApiError as exc:
        sys.stderr.write(f"Error:\n{exc.reason}\n")
        return exit_codes.UNAVAILABLE
    return exit_codes.OK if status is None else status
