"""The list_* commands: one table per command saying which info items exist,
which are shown by default, and where each comes from in the API's JSON.

An item's source is the API field of the same name unless the table says
otherwise. Items the HTTP API does not report (a queue's Erlang pid, mirror
pids) print empty; where rabbitmqctl shows a pid for a connection or channel
we show its API name, which is what identifies it over HTTP.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from cli.hutchctl.client import ApiError, path
from cli.hutchctl.command import BadArgument, Command, Context, api_failure, error, hutch_extension
from cli.hutchctl.terms import Atoms, FieldTable


def _field(name: str) -> Callable[[dict], object]:
    return lambda row: row.get(name)


def _nested(outer: str, inner: str) -> Callable[[dict], object]:
    return lambda row: (row.get(outer) or {}).get(inner)


def _table(name: str) -> Callable[[dict], object]:
    return lambda row: FieldTable(row.get(name) or {})


def _tags(row: dict) -> Atoms:
    tags = row.get("tags") or []
    if isinstance(tags, str):  # RabbitMQ before 3.9 and some clients: "a,b"
        tags = [tag for tag in tags.split(",") if tag]
    return Atoms(tags)


def _compact(name: str) -> Callable[[dict], str]:
    """A JSON field as rabbitmqctl prints it: compact JSON text."""
    return lambda row: json.dumps(row.get(name), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _definition(row: dict) -> str:
    return _compact("definition")(row) if row.get("definition") else "{}"


@dataclass(frozen=True)
class Listing:
    """One list_* command over one API collection."""

    name: str
    banner: str  # formatted with vhost, timeout and the positional arguments as arg0...
    items: tuple[str, ...]
    default: tuple[str, ...]
    source: Callable[[Context, list[str]], str]  # the API path
    sources: dict[str, Callable[[dict], object]] = field(default_factory=dict)
    maps: bool = False  # a list of maps (see formatters) rather than an info-item stream
    selectable: bool = True  # takes <column> ... arguments
    positional: tuple[str, ...] = ()
    missing: str | None = None  # the error when the API answers 404 (formatted like banner)
    # hutch's API extension read (docs/cli.md): the vhost is looked up first, so that a 404 (or
    # RabbitMQ's 400 for /api/hutch/ paths) afterwards says the broker has no such endpoint
    extension: str | None = None
    keep: Callable[[Context, dict], bool] | None = None  # which of the records listed to show

    def run(self, ctx: Context, args: list[str], opts: dict) -> None:
        named, columns = args[:len(self.positional)], args[len(self.positional):]
        unknown = [c for c in columns if c not in self.items]
        if unknown:
            raise BadArgument("Info key(s) %s are not supported" % ",".join(unknown))
        columns = columns or list(self.default)
        fields = {f"arg{i}": value for i, value in enumerate(named)}
        for line in self.banner.format(vhost=ctx.vhost, timeout=float(ctx.timeout), **fields).split("\n"):
            ctx.out.banner(line)
        try:
            if self.extension is None:
                records = ctx.client.get(self.source(ctx, named)) or []
            else:
                ctx.client.get(path("vhosts", ctx.vhost))
                records = hutch_extension(ctx.client.get, self.source(ctx, named), self.extension,
                                          missing=(400, 404, 405)) or []
        except ApiError as exc:
            if exc.status != 404:
                raise api_failure(exc) from None
            if self.missing is not None:
                raise error(self.missing.format(**fields)) from None
            records = []  # a vhost that does not exist lists nothing, as in rabbitmqctl
        if self.keep is not None:
            records = [record for record in records if self.keep(ctx, record)]
        # list_queues' --offline / --online, as rabbitmqctl's: only the queues that are down
        # (on hutch, of a shard that is not reporting), or only the others
        if opts.get("--offline"):
            records = [record for record in records if record.get("state") == "down"]
        elif opts.get("--online"):
            records = [record for record in records if record.get("state") != "down"]
        getters = [self.sources.get(column) or _field(column) for column in columns]
        rows = [[get(record) for get in getters] for record in records]
        if self.maps:
            ctx.out.maps(columns, rows)
        else:
            ctx.out.info_items(columns, rows)

    def command(self, description: str) -> Command:
        usage = " ".join(f"<{p}>" for p in self.positional)
        if self.selectable:
            usage = (usage + " " if usage else "") + "[<column>, ...]"
        scoped = "[--vhost <vhost>] " if "{vhost}" in self.banner else ""
        return Command(self.name, scoped + usage, description, self.run, min_args=len(self.positional),
                       max_args=None if self.selectable else len(self.positional),
                       options={"--online": False, "--offline": False, "--local": False}
                       if self.name == "list_queues" else {})


def _in_vhost(collection: str) -> Callable[[Context, list[str]], str]:
    return lambda ctx, named: path(collection, ctx.vhost)


QUEUE_ITEMS = (
    "name", "durable", "auto_delete", "arguments", "policy", "pid", "owner_pid", "exclusive",
    "exclusive_consumer_pid", "exclusive_consumer_tag", "messages_ready", "messages_unacknowledged",
    "messages", "messages_ready_ram", "messages_unacknowledged_ram", "messages_ram", "messages_persistent",
    "message_bytes", "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram",
    "message_bytes_persistent", "head_message_timestamp", "disk_reads", "disk_writes", "consumers",
    "consumer_utilisation", "consumer_capacity", "memory", "slave_pids", "synchronised_slave_pids", "state",
    "type", "leader", "members", "online",
    # hutch's: ready messages per storage state (docs/storage.md), from the API's `message_states`
    "messages_paged_out", "messages_alpha", "messages_gamma", "messages_delta",
)

# what rabbitmqctl shows of a policy and of an operator policy (always all of it, in this order)
POLICY_ITEMS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")

LISTINGS = (
    (Listing(
        "list_queues", "Timeout: {timeout} seconds ...\nListing queues for vhost {vhost} ...",
        QUEUE_ITEMS, ("name", "messages"), _in_vhost("queues"),
        {"arguments": _table("arguments"), "owner_pid": _nested("owner_pid_details", "name"),
         "exclusive_consumer_pid": _nested("exclusive_consumer_details", "name"),
         **{"messages_" + state: _nested("message_states", state) for state in ("alpha", "gamma", "delta")}},
    ), "Lists queues and their properties"),
    (Listing(
        "list_exchanges", "Listing exchanges for vhost {vhost} ...",
        ("name", "type", "durable", "auto_delete", "internal", "arguments", "policy"), ("name", "type"),
        _in_vhost("exchanges"), {"arguments": _table("arguments")},
    ), "Lists exchanges"),
    (Listing(
        "list_bindings", "Listing bindings for vhost {vhost}...",
        ("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"),
        ("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"),
        _in_vhost("bindings"),
        {"source_name": _field("source"), "source_kind": lambda row: "exchange",
         "destination_name": _field("destination"), "destination_kind": _field("destination_type"),
         "arguments": _table("arguments")},
    ), "Lists all bindings on a vhost"),
    (Listing(
        "list_connections", "Listing connections ...",
        ("pid", "name", "port", "host", "peer_port", "peer_host", "ssl", "ssl_protocol", "ssl_key_exchange",
         "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity", "state",
         "channels", "protocol", "auth_mechanism", "user", "vhost", "timeout", "frame_max", "channel_max",
         "client_properties", "recv_oct", "recv_cnt", "send_oct", "send_cnt", "send_pend", "connected_at"),
        ("user", "peer_host", "peer_port", "state"), lambda ctx, named: path("connections"),
        {"pid": _field("name"), "client_properties": _table("client_properties")},
    ), "Lists AMQP 0.9.1 connections for the node"),
    (Listing(
        "list_channels", "Listing channels ...",
        ("pid", "connection", "name", "number", "user", "vhost", "transactional", "confirm", "consumer_count",
         "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted", "messages_unconfirmed",
         "prefetch_count", "global_prefetch_count"),
        ("pid", "user", "consumer_count", "messages_unacknowledged"), lambda ctx, named: path("channels"),
        {"pid": _field("name"), "connection": _nested("connection_details", "name")},
    ), "Lists all channels in the node"),
    (Listing(
        "list_consumers", "Listing consumers in vhost {vhost} ...",
        ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active",
         "activity_status", "arguments"),
        ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active",
         "activity_status", "arguments"),
        _in_vhost("consumers"),
        {"queue_name": _nested("queue", "name"), "channel_pid": _nested("channel_details", "name"),
         "arguments": _table("arguments")},
    ), "Lists all consumers for a vhost"),
    (Listing(
        "list_vhosts", "Listing vhosts ...",
        ("name", "description", "tags", "tracing", "cluster_state", "default_queue_type"), ("name",),
        lambda ctx, named: path("vhosts"), {"tags": _tags},
    ), "Lists virtual hosts"),
    (Listing(
        "list_users", "Listing users ...", ("user", "tags"), ("user", "tags"),
        lambda ctx, named: path("users"), {"user": _field("name"), "tags": _tags}, selectable=False,
    ), "List user names and tags"),
    (Listing(
        "list_permissions", 'Listing permissions for vhost "{vhost}" ...',
        ("user", "configure", "write", "read"), ("user", "configure", "write", "read"),
        lambda ctx, named: path("vhosts", ctx.vhost, "permissions"), maps=True, selectable=False,
    ), "Lists user permissions in a virtual host"),
    (Listing(
        "list_user_permissions", 'Listing permissions for user "{arg0}" ...',
        ("vhost", "configure", "write", "read"), ("vhost", "configure", "write", "read"),
        lambda ctx, named: path("users", named[0], "permissions"), maps=True, selectable=False,
        positional=("username",), missing='User "{arg0}" does not exist',
    ), "Lists permissions of a user across all virtual hosts"),
    (Listing(
        "list_topic_permissions", 'Listing topic permissions for vhost "{vhost}" ...',
        ("user", "exchange", "write", "read"), ("user", "exchange", "write", "read"),
        lambda ctx, named: path("vhosts", ctx.vhost, "topic-permissions"), maps=True, selectable=False,
    ), "Lists topic permissions in a virtual host"),
    (Listing(
        "list_policies", 'Listing policies for vhost "{vhost}" ...', POLICY_ITEMS, POLICY_ITEMS,
        _in_vhost("policies"), {"definition": _definition}, maps=True, selectable=False,
    ), "Lists all policies in a virtual host"),
    (Listing(
        "list_operator_policies", 'Listing operator policy overrides for vhost "{vhost}" ...', POLICY_ITEMS,
        POLICY_ITEMS, _in_vhost("operator-policies"), {"definition": _definition}, maps=True, selectable=False,
    ), "Lists operator policy overrides for a virtual host"),
    (Listing(
        "list_parameters", 'Listing runtime parameters for vhost "{vhost}" ...',
        ("component", "name", "value"), ("component", "name", "value"),
        lambda ctx, named: path("parameters"), {"value": _compact("value")}, maps=True, selectable=False,
        keep=lambda ctx, row: row.get("vhost") == ctx.vhost,  # the API lists parameters by component, not vhost
    ), "Lists runtime parameters for a virtual host"),
    (Listing(
        "list_global_parameters", "Listing global runtime parameters ...", ("name", "value"), ("name", "value"),
        lambda ctx, named: path("global-parameters"), {"value": _compact("value")}, maps=True, selectable=False,
    ), "Lists global runtime parameters"),
    (Listing(
        "list_mqtt_sessions", "Listing MQTT sessions for vhost {vhost} ...",
        ("vhost", "client_id", "connected", "clean_session", "connection", "user", "protocol", "subscriptions",
         "queues", "messages", "messages_ready", "messages_unacknowledged", "qos2_received", "qos2_sent",
         "qos2_released"),
        ("client_id", "connected", "clean_session", "subscriptions", "messages", "qos2_received", "qos2_sent",
         "qos2_released"),
        lambda ctx, named: path("hutch", "mqtt", "sessions", ctx.vhost),
        {"subscriptions": lambda row: [s["topic_filter"] for s in row.get("subscriptions") or ()],
         "queues": lambda row: [q["name"] for q in row.get("queues") or ()],
         **{"qos2_" + kind: _nested("qos2", kind) for kind in ("received", "sent", "released")}},
        extension="mqtt/sessions",
    ), "Lists MQTT sessions of a virtual host: connected, and persistent ones kept while away (hutch)"),
)

COMMANDS = tuple(listing.command(description) for listing, description in LISTINGS)
