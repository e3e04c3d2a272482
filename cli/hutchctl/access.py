"""Virtual hosts, users, permissions and topic permissions.

The API's PUT on a user replaces the whole record, so commands that change one
attribute (password, tags) read the user first and send the rest back. RabbitMQ
reports "user or vhost not found" as one error; we ask which one to print
rabbitmqctl's message and exit status.
"""
from __future__ import annotations

import sys

from cli.hutchctl import exit_codes
from cli.hutchctl.client import ApiError, path
from cli.hutchctl.command import Command, Context, Failure, api_failure, attempt, error


def _user(ctx: Context, name: str, missing: str) -> dict:
    """The user's record; `missing` (formatted with the name) if there is none."""
    return attempt(ctx.client.get, path("users", name), not_found=error(missing % name, exit_codes.NOUSER))


def _tags_text(record: dict) -> str:
    tags = record.get("tags") or []
    return tags if isinstance(tags, str) else ",".join(tags)


def add_vhost(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Adding vhost "{name}" ...')
    body = {"description": opts.get("--description", ""), "tags": opts.get("--tags", "")}
    if "--default-queue-type" in opts:
        body["default_queue_type"] = opts["--default-queue-type"]
    attempt(ctx.client.put, path("vhosts", name), body)


def delete_vhost(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Deleting vhost "{name}" ...')
    attempt(ctx.client.delete, path("vhosts", name),
            not_found=Failure(f"Virtual host '{name}' does not exist", exit_codes.DATAERR))


def add_user(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    password = args[1] if len(args) > 1 else sys.stdin.readline().rstrip("\n")
    ctx.out.banner(f'Adding user "{name}" ...')
    try:
        ctx.client.get(path("users", name))
    except ApiError as exc:
        if exc.status != 404:
            raise api_failure(exc) from None
    else:
        raise error(f'User "{name}" already exists', exit_codes.SOFTWARE)
    attempt(ctx.client.put, path("users", name), {"password": password, "tags": ""})
    ctx.out.message("Done. Don't forget to grant the user permissions to some virtual hosts! "
                    "See 'hutchctl help set_permissions' to learn more.")


def delete_user(ctx: Context, args: list[str], opts: dict) -> None:
    name = args[0]
    ctx.out.banner(f'Deleting user "{name}" ...')
    attempt(ctx.client.delete, path("users", name),
            not_found=error(f'User "{name}" does not exist', exit_codes.NOUSER))


def change_password(ctx: Context, args: list[str], opts: dict) -> None:
    name, password = args
    ctx.out.banner(f'Changing password for user "{name}" ...')
    record = _user(ctx, name, 'User "%s" does not exist')
    attempt(ctx.client.put, path("users", name), {"password": password, "tags": _tags_text(record)})


def set_user_tags(ctx: Context, args: list[str], opts: dict) -> None:
    name, tags = args[0], args[1:]
    ctx.out.banner(f'Setting tags for user "{name}" to [{", ".join(tags)}] ...')
    record = _user(ctx, name, 'User "%s" does not exist')
    body = {"tags": ",".join(tags)}
    # keep the password: send back the hash the API gave us
    for key in ("password_hash", "hashing_algorithm"):
        if key in record:
            body[key] = record[key]
    attempt(ctx.client.put, path("users", name), body)


def _set_permission(ctx: Context, collection: str, user: str, body: dict) -> None:
    """PUT a permission; RabbitMQ answers 400 "vhost_or_user_not_found", so find out which."""
    try:
        ctx.client.put(path(collection, ctx.vhost, user), body)
    except ApiError as exc:
        if exc.status in (400, 404):
            _user(ctx, user, "User %s does not exist")
            attempt(ctx.client.get, path("vhosts", ctx.vhost),
                    not_found=error(f"Virtual host {ctx.vhost} does not exist"))
        raise api_failure(exc) from None


def _clear_permission(ctx: Context, collection: str, user: str) -> None:
    """DELETE a permission; none to clear is fine, an unknown user is not."""
    try:
        ctx.client.delete(path(collection, ctx.vhost, user))
    except ApiError as exc:
        if exc.status != 404:
            raise api_failure(exc) from None
        _user(ctx, user, "User %s does not exist")


def set_permissions(ctx: Context, args: list[str], opts: dict) -> None:
    user, configure, write, read = args
    ctx.out.banner(f'Setting permissions for user "{user}" in vhost "{ctx.vhost}" ...')
    _set_permission(ctx, "permissions", user, {"configure": configure, "write": write, "read": read})


def clear_permissions(ctx: Context, args: list[str], opts: dict) -> None:
    user = args[0]
    ctx.out.banner(f'Clearing permissions for user "{user}" in vhost "{ctx.vhost}" ...')
    _clear_permission(ctx, "permissions", user)


def set_topic_permissions(ctx: Context, args: list[str], opts: dict) -> None:
    user, exchange, write, read = args
    ctx.out.banner(f'Setting topic permissions on "{exchange}" for user "{user}" in vhost "{ctx.vhost}" ...')
    _set_permission(ctx, "topic-permissions", user, {"exchange": exchange, "write": write, "read": read})


def clear_topic_permissions(ctx: Context, args: list[str], opts: dict) -> None:
    user = args[0]
    ctx.out.banner(f'Clearing topic permissions for user "{user}" in vhost "{ctx.vhost}" ...')
    _clear_permission(ctx, "topic-permissions", user)


_VHOST = "[--vhost <vhost>] "
COMMANDS = (
    Command("add_vhost", '<vhost> [--description <description> --tags "<tag1>,<tag2>,<...>" '
            "--default-queue-type <quorum|classic|stream>]", "Creates a virtual host", add_vhost, 1, 1,
            {"--description": True, "--tags": True, "--default-queue-type": True}),
    Command("delete_vhost", "<vhost>", "Deletes a virtual host", delete_vhost, 1, 1),
    Command("add_user", "<username> <password>", "Creates a new user in the internal database",
            add_user, 1, 2),
    Command("delete_user", "<username>", "Removes a user from the internal database", delete_user, 1, 1),
    Command("change_password", "<username> <password>", "Changes the user password", change_password, 2, 2),
    Command("set_user_tags", "<username> <tag> [...]", "Sets user tags", set_user_tags, 1, None),
    Command("set_permissions", _VHOST + "<username> <conf> <write> <read>",
            "Sets user permissions for a vhost", set_permissions, 4, 4),
    Command("clear_permissions", _VHOST + "<username>", "Revokes user permissions for a vhost",
            clear_permissions, 1, 1),
    Command("set_topic_permissions", _VHOST + "<username> <exchange> <write> <read>",
            "Sets topic permissions for an exchange", set_topic_permissions, 4, 4),
    Command("clear_topic_permissions", _VHOST + "<username>",
            "Clears user topic permissions for a vhost", clear_topic_permissions, 1, 1),
)
