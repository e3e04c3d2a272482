"""What a command is, what it runs with, and how it fails.

A command declares its positional argument count and its own options; `main`
checks argv against them before anything is sent. `run(ctx, args, opts)`
prints through `ctx.out`, returns None (success) or an exit status, and raises
`Failure` (a broker-side error, printed as rabbitmqctl prints it) or
`BadArgument` (argument validation, printed with the command's usage).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cli.hutchctl import exit_codes
from cli.hutchctl.client import ApiError, ManagementClient
from cli.hutchctl.formatters import Output


class Failure(Exception):
    """The operation failed: `message` goes to stderr, the exit status is `code`."""

    def __init__(self, message: str, code: int = exit_codes.UNAVAILABLE):
        super().__init__(message)
        self.message = message
        self.code = code


class BadArgument(Exception):
    """An argument failed validation (rabbitmqctl's "Error (argument validation)")."""

    def __init__(self, reason: str, code: int = exit_codes.USAGE):
        super().__init__(reason)
        self.reason = reason
        self.code = code


def error(detail: str, code: int = exit_codes.UNAVAILABLE) -> Failure:
    """rabbitmqctl's usual failure: "Error:" on a line, then the detail."""
    return Failure("Error:\n" + detail, code)


def api_failure(exc: ApiError) -> Failure:
    """An API error with no more specific translation."""
    return error(exc.reason)


def attempt(request: Callable, *args, not_found: Exception | None = None, **kwargs):
    """`request(*args, **kwargs)` (a client method); an HTTP 404 raises `not_found`
    when given, any other API error its reason after "Error:"."""
    try:
        return request(*args, **kwargs)
    except ApiError as exc:
        if exc.status == 404 and not_found is not None:
            raise not_found from None
        raise api_failure(exc) from None


def hutch_extension(request: Callable, api_path: str, endpoint: str, *args, missing: tuple = (404, 405)):
    """Call one of hutch's API extensions (docs/cli.md); if the endpoint is
    missing (a `missing` status once the object it acts on is known to
    exist), the broker is not hutch."""
    try:
        return request(api_path, *args)
    except ApiError as exc:
        if exc.status in missing:
            raise error(f"the broker's management API has no {endpoint} endpoint "
                        "(a hutch extension that RabbitMQ does not provide)") from None
        raise api_failure(exc) from None


@dataclass(frozen=True)
class Context:
    client: ManagementClient
    out: Output
    vhost: str
    timeout: int
    settings: Mapping[str, str] = field(default_factory=dict)  # url, username, password, to hand on


@dataclass(frozen=True)
class Command:
    name: str
    usage: str  # after the command name, as rabbitmqctl's usage line shows it
    description: str
    run: Callable[[Context, list[str], dict], None]
    min_args: int = 0
    max_args: int | None = 0  # None: any number
    options: Mapping[str, bool] = field(default_factory=dict)  # --name -> takes a value
    # Options it does not know, after its name, are kept in the arguments as given (for a child process).
    forwards_options: bool = False
