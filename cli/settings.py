"""Build a `BrokerConfig` from defaults, a YAML file, `HUTCH_*` variables and flags.

Precedence, lowest first: the dataclass defaults (the embedded default
configuration, so the broker runs with no file at all) < the YAML file named by
`--config` or `HUTCH_CONFIG` < `HUTCH_*` environment variables < command-line flags.

Everything is driven by the fields of `BrokerConfig`: each leaf field (nested
dataclasses such as `tls` are sections) becomes one setting with a YAML key path
(`tls.certfile`), an environment variable (`HUTCH_TLS_CERTFILE`) and a flag
(`--tls-certfile`). Adding a field to the dataclass adds all three. YAML values
must already have the field's type; environment and flag values are text
(booleans as true/false/yes/no/1/0, lists comma-separated, an empty string is
null for optional fields). Every error is a `SettingsError` naming where the bad
value came from and which setting it was meant for.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import types
import typing
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import yaml

from amqp_server.process.shards import MAX_SHARDS
from amqp_server.shared.config import BrokerConfig


class SettingsError(ValueError):
    """A setting could not be loaded; the message is meant for the operator."""


_PORT_RANGE = (0, 65535)
# Integer settings are non-negative; these (by field name) have tighter limits.
# `port` and any `*_port` field take _PORT_RANGE.
_INT_RANGES: dict[str, tuple[int, int | None]] = {
    "channel_max": (0, 65535),  # a short in Connection.Tune
    "heartbeat": (0, 65535),  # a short in Connection.Tune
    "frame_max": (4096, 2**32 - 1),  # AMQP 0-9-1 frame-min-size is 4096
    "max_message_size": (0, 536870912),  # RabbitMQ's upper limit, 512 MiB
    "segment_bytes": (4096, None),
    "lease_ttl": (2, 3600),  # etcd lease seconds; fencing needs a margin below it
    "max_body_size": (1, None),  # management API request bodies
    "shards": (0, MAX_SHARDS),  # processes of one node; 0: as many as its cores
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": ("debug", "info", "warning", "error"),
    "durability": ("fsync", "flush"),
    "event_loop": ("auto", "uvloop", "asyncio"),
}
# Float settings (by field name) and their inclusive limits.
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "paging_ratio": (0.0, 1.0),
    "sample_interval": (0.1, 3600.0),
    "request_timeout": (0.1, 3600.0),
    "vm_memory_high_watermark": (0.0, 1.0),
    "disk_free_limit_mem_relative": (0.0, 100.0),
    "max_lag_seconds": (0.1, 3600.0),
    "replication_timeout": (1.0, 3600.0),
    "shard_timeout": (1.0, 3600.0),
}
# HUTCH_* variables that are not broker settings: the config file's name, and
# hutchctl's connection settings (so one shell can export both).
_NOT_BROKER_SETTINGS = frozenset({"HUTCH_CONFIG", "HUTCH_URL", "HUTCH_USERNAME", "HUTCH_PASSWORD"})
_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class _Setting:
    path: tuple[str, ...]
    hint: typing.Any

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return "HUTCH_" + "_".join(self.path).upper()

    @property
    def flag(self) -> str:
        return "--" + "-".join(self.path).replace("_", "-")

    def default(self) -> typing.Any:
        value: typing.Any = BrokerConfig()
        for name in self.path:
            value = getattr(value, name)
        return value


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[_Setting]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + (f.name,)
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _leaves(hints[f.name], path)
        else:
            yield _Setting(path, hints[f.name])


_SETTINGS = tuple(_leaves(BrokerConfig))
_BY_PATH = {s.path: s for s in _SETTINGS}
_BY_ENV = {s.env: s for s in _SETTINGS}
_SECTIONS = {s.path[:i] for s in _SETTINGS for i in range(1, len(s.path))}


class _Expected(Exception):
    """Raised by `_convert` with a description of the type it wanted."""


def _convert(value: typing.Any, hint: typing.Any, text: bool) -> typing.Any:
    """Return `value` as type `hint`; `text` means it came from env or a flag."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (text and value == ""):
            return None
        (inner,) = (a for a in args if a is not type(None))
        try:
            return _convert(value, inner, text)
        except _Expected as exc:
            raise _Expected(f"{exc} or null") from None
    if hint is bool:
        if text and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        if not text and isinstance(value, bool):
            return value
        raise _Expected("a boolean (true/false/yes/no/1/0)" if text else "a boolean")
    if hint is int:
        if text:
            try:
                return int(value)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Expected("an integer")
    if hint is float:
        if text:
            try:
                return float(value)
            except ValueError:
                pass
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Expected("a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Expected("a string")
    if typing.get_origin(hint) is list and args == (str,):
        if text:
            return [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return list(value)
        raise _Expected("a list of strings")
    raise TypeError(f"cli.settings cannot load a field of type {hint!r}")


def _validate(setting: _Setting, value: typing.Any, text: bool, source: str) -> typing.Any:
    """Convert and range-check one value, raising `SettingsError` naming the setting."""
    prefix = f"{source}: setting '{setting.key}'"
    try:
        value = _convert(value, setting.hint, text)
    except _Expected as exc:
        raise SettingsError(f"{prefix} must be {exc}, got {value!r}") from None
    name = setting.path[-1]
    if name in _CHOICES and isinstance(value, str):
        value = value.lower()
        if value not in _CHOICES[name]:
            raise SettingsError(f"{prefix} must be one of {', '.join(_CHOICES[name])}, got {value!r}")
    if type(value) is float and name in _FLOAT_RANGES:
        low, high = _FLOAT_RANGES[name]
        if not low <= value <= high:
            raise SettingsError(f"{prefix} must be between {low} and {high}, got {value}")
    if type(value) is int:
        default = _PORT_RANGE if name == "port" or name.endswith("_port") else (0, None)
        low, high = _INT_RANGES.get(name, default)
        if value < low or (high is not None and value > high):
            limits = f"at least {low}" if high is None else f"between {low} and {high}"
            raise SettingsError(f"{prefix} must be {limits}, got {value}")
    return value


def _suggest(word: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _flatten(data: Mapping, prefix: tuple[str, ...], source: str) -> Iterator[tuple[_Setting, typing.Any]]:
    """Yield (setting, raw value) for a YAML mapping, rejecting unknown keys."""
    for key, value in data.items():
        path = prefix + (str(key),)
        dotted = ".".join(path)
        if path in _SECTIONS:
            if not isinstance(value, dict):
                raise SettingsError(f"{source}: setting '{dotted}' must be a mapping, got {value!r}")
            yield from _flatten(value, path, source)
        elif path in _BY_PATH:
            yield _BY_PATH[path], value
        else:
            known = [s.key for s in _SETTINGS] + [".".join(p) for p in _SECTIONS]
            raise SettingsError(f"{source}: unknown setting '{dotted}'{_suggest(dotted, known)}")


def _from_file(path: str) -> dict[tuple[str, ...], typing.Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise SettingsError(f"cannot read config file: {exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return {s.path: _validate(s, value, False, path) for s, value in _flatten(data, (), path)}


def _from_environ(environ: Mapping[str, str]) -> dict[tuple[str, ...], typing.Any]:
    values = {}
    for name in sorted(environ):
        if not name.startswith("HUTCH_") or name in _NOT_BROKER_SETTINGS:
            continue
        if name not in _BY_ENV:
            raise SettingsError(f"unknown environment variable '{name}'{_suggest(name, _BY_ENV)}")
        setting = _BY_ENV[name]
        values[setting.path] = _validate(setting, environ[name], True, name)
    return values


def _describe(value: typing.Any) -> str:
    """A default as it would be written in an environment variable or flag."""
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, bool):
        return str(value).lower()
    return "unset" if value is None else str(value)


def build_parser() -> argparse.ArgumentParser:
    """The `hutch-server` argument parser: `--config` plus one flag per setting."""
    parser = argparse.ArgumentParser(
        prog="hutch-server",
        description="Run the hutch AMQP 0-9-1 broker.",
        epilog="Settings come from built-in defaults, then the YAML file (--config or "
        "HUTCH_CONFIG), then HUTCH_* environment variables, then these flags. "
        "--port 0 picks a free port.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file (env HUTCH_CONFIG)")
    for s in _SETTINGS:
        choices = _CHOICES.get(s.path[-1])
        parser.add_argument(
            s.flag,
            dest=s.key,
            default=argparse.SUPPRESS,
            metavar="{" + ",".join(choices) + "}" if choices else s.path[-1].upper(),
            help=f"setting {s.key} (env {s.env}; default {_describe(s.default())})",
        )
    return parser


def load_settings(argv: list[str] | None, environ: Mapping[str, str]) -> BrokerConfig:
    """Return the effective configuration; raise `SettingsError` if any layer is invalid.

    `argv` excludes the program name (None means `sys.argv[1:]`). Malformed
    command lines (unknown flags, missing values) are reported by argparse, which
    exits with status 2.
    """
    args = vars(build_parser().parse_args(argv))
    config_file = args.pop("config") or environ.get("HUTCH_CONFIG")
    values = _from_file(config_file) if config_file else {}
    values.update(_from_environ(environ))
    for key, raw in args.items():
        setting = _BY_PATH[tuple(key.split("."))]
        values[setting.path] = _validate(setting, raw, True, setting.flag)

    config = BrokerConfig()
    for path, value in values.items():
        target = config
        for name in path[:-1]:
            target = getattr(target, name)
        setattr(target, path[-1], value)
    if bool(config.tls.certfile) != bool(config.tls.keyfile):
        raise SettingsError("settings 'tls.certfile' and 'tls.keyfile' must be set together")
    _check_cluster(config.cluster)
    if config.cluster.enabled and config.shards > 1:
        # A connection's socket cannot move to a shard whose leader runs on another node.
        config.shard_moves = False
    return config


_MIN_SECRET = 16
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")


def _check_cluster(cluster) -> None:
    """What the per-field checks cannot see: the etcd URLs' form, the node
    name, etcd's TLS and login settings."""
    schemes = set()
    for url in cluster.etcd:
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None or \
                parts.path not in ("", "/"):
            raise SettingsError(f"setting 'cluster.etcd': {url!r} is not an etcd client URL "
                                "of the form http://host:port or https://host:port")
        schemes.add(parts.scheme)
    if len(schemes) > 1:
        raise SettingsError("setting 'cluster.etcd': the URLs must all be http:// or all https://")
    etcd_tls = ("etcd_cacert", "etcd_cert", "etcd_key")
    if schemes == {"http"} and any(getattr(cluster, name) for name in etcd_tls):
        raise SettingsError("settings 'cluster.etcd_cacert', 'etcd_cert' and 'etcd_key' need https:// etcd URLs")
    if bool(cluster.etcd_cert) != bool(cluster.etcd_key):
        raise SettingsError("settings 'cluster.etcd_cert' and 'cluster.etcd_key' must be set together")
    for name in etcd_tls:
        path = getattr(cluster, name)
        if path and not os.path.isfile(path):
            raise SettingsError(f"setting 'cluster.{name}': no such file {path!r}")
    if bool(cluster.etcd_user) != bool(cluster.etcd_password):
        raise SettingsError("settings 'cluster.etcd_user' and 'cluster.etcd_password' must be set together")
    if cluster.enabled and not cluster.secret:
        raise SettingsError("setting 'cluster.secret' is required with 'cluster.etcd': every node of the cluster "
                            "needs the same secret (HUTCH_CLUSTER_SECRET), e.g. the output of "
                            "`openssl rand -hex 32`, so that only members replicate (docs/cluster.md)")
    if cluster.secret is not None and len(cluster.secret) < _MIN_SECRET:
        raise SettingsError(f"setting 'cluster.secret' must be at least {_MIN_SECRET} characters, "
                            f"got {len(cluster.secret)}")
    tls = (cluster.tls_certfile, cluster.tls_keyfile, cluster.tls_cacertfile)
    if any(tls) and not all(tls):
        raise SettingsError("settings 'cluster.tls_certfile', 'cluster.tls_keyfile' and 'cluster.tls_cacertfile' "
                            "must be set together (mutual TLS: each node verifies the other's certificate)")
    if cluster.node_name is not None and not _NODE_NAME.match(cluster.node_name):
        raise SettingsError(f"setting 'cluster.node_name' must be letters, digits and _ . @ - "
                            f"(at most 100), got {cluster.node_name!r}")
