"""Durable definitions: vhosts, users, permissions, topic permissions, limits,
policies, operator policies, runtime and global parameters, exchanges,
queues, bindings.

`DefinitionStore(path)` keeps them in one SQLite database (stdlib `sqlite3`) in
WAL mode with `synchronous=FULL`: a committed change has reached the disk
before the call returns, and a crash (even `kill -9` or power loss) leaves
either the whole change or none of it. Definitions change rarely, so
correctness comes first.

Theory of operation:
- Every public mutation is one transaction (`BEGIN IMMEDIATE ... COMMIT`,
  `ROLLBACK` on any error, so a failing mutation leaves nothing behind).
  `transaction()` groups several mutations into one: the domain wraps one
  AMQP operation (a queue deletion with the auto-deletes it triggers) in it.
  Transactions nest; only the outermost one commits.
- The store is dumb: it records what the domain tells it and enforces no
  AMQP rule (which things are durable, name prefixes, existence). Its only
  logic is cascades: deleting an exchange deletes its bindings as source and
  as destination, deleting a queue deletes the bindings to it, deleting a
  vhost everything in it and the permissions, topic permissions, limits,
  policies, operator policies and parameters on it, deleting a user that user's permissions, topic permissions
  and limits. There are no foreign keys: a binding's source may be a
  predeclared `amq.*` exchange, which comes from code and is never stored.
- `load()` returns a plain snapshot (`Definitions`: lists of named tuples)
  for the domain to rebuild itself from at start.
- The calls are synchronous and run on the event loop, a deliberate choice:
  each is a few milliseconds at most (one fsync of the WAL), they happen only
  when a durable definition changes, and message data never goes through
  here. Like every `sqlite3` connection it must be used from the thread that
  opened it.

Arguments (AMQP field tables) are stored losslessly as JSON text with type
tags (see `encode_table`): nested tables keep their key order, and every type
the decoder produces comes back as the same type and value (int, float, bool,
str, bytes, bytearray, Decimal with its exponent, datetime with its tzinfo,
None, lists, tables). pamqp's field-table encoder is not used because it
writes floats as 32-bit and cannot encode `bytes`. A binding's arguments are
stored with their top-level keys sorted (their order is not part of the
binding's identity, as in RabbitMQ), which makes the encoded text a key.

Schema (version 5, in `PRAGMA user_version`; an older file is migrated in
place by `_MIGRATIONS`: version 2 added the tables of topic permissions,
limits and policies, version 3 the vhosts' description and tags, as columns
with defaults so existing vhosts read back with none, version 4 operator
policies and runtime and global parameters, version 5 the user who set a
runtime parameter, NULL for those set before and by the broker itself,
version 6 the shard a queue lives on, 0 for those declared before: a node
of one process is its shard 0, docs/scaling.md):

    vhosts      (name PK, description, tags: JSON list of str)
    users       (name PK, password_hash, tags: JSON list of str)
    permissions (user, vhost, configure, write, read; PK user, vhost)
    exchanges   (vhost, name, type, durable, auto_delete, internal, arguments; PK vhost, name)
    queues      (vhost, name, durable, auto_delete, arguments, shard; PK vhost, name)
    bindings    (vhost, source, destination_kind 'queue'|'exchange', destination,
                 routing_key, arguments; PK all six)
    topic_permissions (user, vhost, exchange, write, read; PK user, vhost, exchange)
    vhost_limits (vhost PK, limits: JSON object)
    user_limits  (user PK, limits: JSON object)
    policies     (vhost, name, pattern, apply_to, definition: JSON object, priority;
                  PK vhost, name)
    operator_policies (the columns of policies)
    parameters   (vhost, component, name, value: JSON, owner: user name or NULL;
                  PK vhost, component, name)
    global_parameters (name PK, value: JSON)
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import json
import sqlite3
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Iterator, NamedTuple

from storage import files

SCHEMA_VERSION = 6

_SCHEMA = """
CREATE TABLE vhosts (
    name TEXT PRIMARY KEY
);
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,
    tags TEXT NOT NULL
);
CREATE TABLE permissions (
    user TEXT NOT NULL,
    vhost TEXT NOT NULL,
    configure TEXT NOT NULL,
    write TEXT NOT NULL,
    read TEXT NOT NULL,
    PRIMARY KEY (user, vhost)
);
CREATE INDEX permissions_by_vhost ON permissions (vhost);
CREATE TABLE exchanges (
    vhost TEXT NOT NULL,
    name TEXT NOT NULL,
    type TEXT NOT NULL,
    durable INTEGER NOT NULL,
    auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name)
);
CREATE TABLE queues (
    vhost TEXT NOT NULL,
    name TEXT NOT NULL,
    durable INTEGER NOT NULL,
    auto_delete INTEGER NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name)
);
CREATE TABLE bindings (
    vhost TEXT NOT NULL,
    source TEXT NOT NULL,
    destination_kind TEXT NOT NULL CHECK (destination_kind IN ('queue', 'exchange')),
    destination TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, source, destination_kind, destination, routing_key, arguments)
);
CREATE INDEX bindings_by_destination ON bindings (vhost, destination_kind, destination);
"""

# Statements that take a file of version N-1 to version N (the tables of
# version N's features); a fresh file runs _SCHEMA and then all of them.
_MIGRATIONS = {
    2: """
CREATE TABLE topic_permissions (
    user TEXT NOT NULL,
    vhost TEXT NOT NULL,
    exchange TEXT NOT NULL,
    write TEXT NOT NULL,
    read TEXT NOT NULL,
    PRIMARY KEY (user, vhost, exchange)
);
CREATE TABLE vhost_limits (
    vhost TEXT PRIMARY KEY,
    limits TEXT NOT NULL
);
CREATE TABLE user_limits (
    user TEXT PRIMARY KEY,
    limits TEXT NOT NULL
);
CREATE TABLE policies (
    vhost TEXT NOT NULL,
    name TEXT NOT NULL,
    pattern TEXT NOT NULL,
    apply_to TEXT NOT NULL,
    definition TEXT NOT NULL,
    priority INTEGER NOT NULL,
    PRIMARY KEY (vhost, name)
);
""",
    3: """
ALTER TABLE vhosts ADD COLUMN description TEXT NOT NULL DEFAULT '';
ALTER TABLE vhosts ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
""",
    4: """
CREATE TABLE operator_policies (
    vhost TEXT NOT NULL,
    name TEXT NOT NULL,
    pattern TEXT NOT NULL,
    apply_to TEXT NOT NULL,
    definition TEXT NOT NULL,
    priority INTEGER NOT NULL,
    PRIMARY KEY (vhost, name)
);
CREATE TABLE parameters (
    vhost TEXT NOT NULL,
    component TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (vhost, component, name)
);
CREATE TABLE global_parameters (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
""",
    5: """
ALTER TABLE parameters ADD COLUMN owner TEXT;
""",
    6: """
ALTER TABLE queues ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;
""",
}


# -- the snapshot ----------------------------------------------------------


class VhostMetadata(NamedTuple):
    description: str
    tags: list


class UserRow(NamedTuple):
    name: str
    password_hash: str
    tags: list


class PermissionRow(NamedTuple):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class TopicPermissionRow(NamedTuple):
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


class PolicyRow(NamedTuple):
    vhost: str
    name: str
    pattern: str
    apply_to: str
    definition: dict
    priority: int


class ParameterRow(NamedTuple):
    vhost: str
    component: str
    name: str
    value: object  # any JSON value
    owner: str | None = None  # the user who set it (None: set by the broker, or before schema 5)


class ExchangeRow(NamedTuple):
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict


class QueueRow(NamedTuple):
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: dict
    shard: int = 0


class BindingRow(NamedTuple):
    vhost: str
    source: str
    destination_kind: str  # "queue" or "exchange"
    destination: str
    routing_key: str
    arguments: dict


@dataclass
class Definitions:
    """Everything the store holds, as plain values (the result of `load`)."""

    vhosts: list = field(default_factory=list)  # of str
    vhost_metadata: dict = field(default_factory=dict)  # vhost -> VhostMetadata
    users: list = field(default_factory=list)  # of UserRow
    permissions: list = field(default_factory=list)  # of PermissionRow
    exchanges: list = field(default_factory=list)  # of ExchangeRow
    queues: list = field(default_factory=list)  # of QueueRow
    bindings: list = field(default_factory=list)  # of BindingRow
    topic_permissions: list = field(default_factory=list)  # of TopicPermissionRow
    vhost_limits: dict = field(default_factory=dict)  # vhost -> {limit: value}
    user_limits: dict = field(default_factory=dict)  # user -> {limit: value}
    policies: list = field(default_factory=list)  # of PolicyRow
    operator_policies: list = field(default_factory=list)  # of PolicyRow
    parameters: list = field(default_factory=list)  # of ParameterRow
    global_parameters: dict = field(default_factory=dict)  # name -> JSON value

    @property
    def blank(self) -> bool:
        """No vhost, user or permission: a fresh node (RabbitMQ then creates
        the default vhost and user; it never does on a node with data)."""
        return not (self.vhosts or self.users or self.permissions)


# -- field tables as tagged JSON -----------------------------------------------


def _to_json(value: object) -> object:
    # Plain JSON for str, int, bool, None and lists; a one-key object tags
    # every other type (tables included, as ordered pairs).
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, dict):
        return {"F": [[_key(k), _to_json(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, Decimal):
        return {"D": str(value)}
    if isinstance(value, datetime.datetime):
        return {"T": value.isoformat()}
    if isinstance(value, bytearray):
        return {"x": base64.b64encode(value).decode("ascii")}
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode("ascii")}
    raise TypeError("cannot store a field value of type %s: %r" % (type(value).__name__, value))


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError("field table keys must be str, not %s: %r" % (type(key).__name__, key))
    return key


def _from_json(value: object) -> object:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, raw),) = value.items()
    if tag == "F":
        return {k: _from_json(v) for k, v in raw}
    if tag == "f":
        return float.fromhex(raw)
    if tag == "D":
        return Decimal(raw)
    if tag == "T":
        return datetime.datetime.fromisoformat(raw)
    if tag == "x":
        return bytearray(base64.b64decode(raw))
    if tag == "b":
        return base64.b64decode(raw)
    raise ValueError("unknown field tag %r" % tag)


def encode_table(table: dict | None, sort: bool = False) -> str:
    """A field table as tagged JSON text; `sort` orders the top-level keys."""
    items = list((table or {}).items())
    if sort:
        items.sort(key=lambda kv: _key(kv[0]))
    return json.dumps(_to_json(dict(items)), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def decode_table(text: str) -> dict:
    return _from_json(json.loads(text))


# -- the store -------------------------------------------------------------


class DefinitionStore:
    """The definitions of one broker node in the SQLite file at `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
        self._depth = 0
        try:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise sqlite3.OperationalError("cannot put %s in WAL mode (got %s)" % (path, mode))
            self._db.execute("PRAGMA synchronous=FULL")
            with self.transaction():
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise sqlite3.DatabaseError(
                        "%s has definitions schema version %d; this broker knows %d" % (path, version, SCHEMA_VERSION))
                if version < SCHEMA_VERSION:
                    scripts = [_SCHEMA] if version == 0 else []
                    scripts += [_MIGRATIONS[n] for n in range(max(version, 1) + 1, SCHEMA_VERSION + 1)]
                    for script in scripts:
                        for statement in script.split(";"):
                            if statement.strip():
                                self._db.execute(statement)
                    self._db.execute("PRAGMA user_version=%d" % SCHEMA_VERSION)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group mutations: all of them are committed together, or none."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            if self._db.in_transaction:  # SQLite may have rolled back already (disk full)
                self._db.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        files.wrote(self.path, self._db.serialize)  # a cluster's followers get the committed database

    def _run(self, *statements: tuple) -> None:
        with self.transaction():
            for sql, params in statements:
                self._db.execute(sql, params)

    # -- vhosts, users, permissions ------------------------------------------

    def upsert_vhost(self, name: str, description: str = "", tags: list = ()) -> None:
        """The vhost, with its description and tags (replaced if it exists)."""
        self._run((
            "INSERT INTO vhosts (name, description, tags) VALUES (?, ?, ?) ON CONFLICT (name) "
            "DO UPDATE SET description = excluded.description, tags = excluded.tags",
            (name, description, json.dumps([str(tag) for tag in tags])),
        ))

    def delete_vhost(self, name: str) -> None:
        """The vhost, everything in it and every permission on it."""
        self._run(
            ("DELETE FROM topic_permissions WHERE vhost = ?", (name,)),
            ("DELETE FROM vhost_limits WHERE vhost = ?", (name,)),
            ("DELETE FROM policies WHERE vhost = ?", (name,)),
            ("DELETE FROM operator_policies WHERE vhost = ?", (name,)),
            ("DELETE FROM parameters WHERE vhost = ?", (name,)),
            ("DELETE FROM bindings WHERE vhost = ?", (name,)),
            ("DELETE FROM queues WHERE vhost = ?", (name,)),
            ("DELETE FROM exchanges WHERE vhost = ?", (name,)),
            ("DELETE FROM permissions WHERE vhost = ?", (name,)),
            ("DELETE FROM vhosts WHERE name = ?", (name,)),
        )

    def upsert_user(self, name: str, password_hash: str, tags: list) -> None:
        tags_json = json.dumps([str(tag) for tag in tags])
        self._run((
            "INSERT INTO users (name, password_hash, tags) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET password_hash = excluded.password_hash, tags = excluded.tags",
            (name, password_hash, tags_json),
        ))

    def delete_user(self, name: str) -> None:
        """The user, its permissions and limits."""
        self._run(
            ("DELETE FROM topic_permissions WHERE user = ?", (name,)),
            ("DELETE FROM user_limits WHERE user = ?", (name,)),
            ("DELETE FROM permissions WHERE user = ?", (name,)),
            ("DELETE FROM users WHERE name = ?", (name,)),
        )

    def set_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self._run((
            "INSERT INTO permissions (user, vhost, configure, write, read) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (user, vhost) DO UPDATE SET configure = excluded.configure, "
            "write = excluded.write, read = excluded.read",
            (user, vhost, configure, write, read),
        ))

    def clear_permission(self, user: str, vhost: str) -> None:
        self._run(("DELETE FROM permissions WHERE user = ? AND vhost = ?", (user, vhost)))

    def set_topic_permission(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        self._run((
            "INSERT INTO topic_permissions (user, vhost, exchange, write, read) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (user, vhost, exchange) DO UPDATE SET write = excluded.write, read = excluded.read",
            (user, vhost, exchange, write, read),
        ))

    def clear_topic_permission(self, user: str, vhost: str, exchange: str | None = None) -> None:
        """One exchange's topic permission, or (exchange None) all of them in the vhost."""
        if exchange is None:
            self._run(("DELETE FROM topic_permissions WHERE user = ? AND vhost = ?", (user, vhost)))
        else:
            self._run(("DELETE FROM topic_permissions WHERE user = ? AND vhost = ? AND exchange = ?",
                       (user, vhost, exchange)))

    def set_vhost_limits(self, vhost: str, limits: dict) -> None:
        """Replace the vhost's limits (empty: none)."""
        self._set_limits("vhost_limits", "vhost", vhost, limits)

    def set_user_limits(self, user: str, limits: dict) -> None:
        """Replace the user's limits (empty: none)."""
        self._set_limits("user_limits", "user", user, limits)

    def _set_limits(self, table: str, column: str, name: str, limits: dict) -> None:
        if not limits:
            self._run(("DELETE FROM %s WHERE %s = ?" % (table, column), (name,)))
            return
        self._run((
            "INSERT INTO %s (%s, limits) VALUES (?, ?) ON CONFLICT (%s) DO UPDATE SET limits = excluded.limits"
            % (table, column, column),
            (name, json.dumps(limits)),
        ))

    # -- policies ------------------------------------------------------------

    def set_policy(self, vhost: str, name: str, pattern: str, apply_to: str, definition: dict,
                   priority: int, table: str = "policies") -> None:
        """A policy, or (table "operator_policies") an operator policy."""
        self._run((
            "INSERT INTO %s (vhost, name, pattern, apply_to, definition, priority) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (vhost, name) DO UPDATE SET pattern = excluded.pattern, apply_to = excluded.apply_to, "
            "definition = excluded.definition, priority = excluded.priority" % _policy_table(table),
            (vhost, name, pattern, apply_to, json.dumps(definition), priority),
        ))

    def clear_policy(self, vhost: str, name: str, table: str = "policies") -> None:
        self._run(("DELETE FROM %s WHERE vhost = ? AND name = ?" % _policy_table(table), (vhost, name)))

    # -- runtime and global parameters -----------------------------------------

    def set_parameter(self, vhost: str, component: str, name: str, value: object,
                      owner: str | None = None) -> None:
        self._run((
            "INSERT INTO parameters (vhost, component, name, value, owner) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (vhost, component, name) DO UPDATE SET value = excluded.value, owner = excluded.owner",
            (vhost, component, name, json.dumps(value), owner),
        ))

    def clear_parameter(self, vhost: str, component: str, name: str) -> None:
        self._run(("DELETE FROM parameters WHERE vhost = ? AND component = ? AND name = ?",
                   (vhost, component, name)))

    def set_global_parameter(self, name: str, value: object) -> None:
        self._run((
            "INSERT INTO global_parameters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, json.dumps(value)),
        ))

    def clear_global_parameter(self, name: str) -> None:
        self._run(("DELETE FROM global_parameters WHERE name = ?", (name,)))

    # -- exchanges, queues, bindings ------------------------------------------

    def upsert_exchange(self, vhost: str, name: str, type: str, durable: bool, auto_delete: bool,
                        internal: bool, arguments: dict | None) -> None:
        args = encode_table(arguments)  # before the transaction: a bad value writes nothing
        self._run((
            "INSERT INTO exchanges (vhost, name, type, durable, auto_delete, internal, arguments) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (vhost, name) DO UPDATE SET type = excluded.type, "
            "durable = excluded.durable, auto_delete = excluded.auto_delete, "
            "internal = excluded.internal, arguments = excluded.arguments",
            (vhost, name, type, int(durable), int(auto_delete), int(internal), args),
        ))

    def delete_exchange(self, vhost: str, name: str) -> None:
        """The exchange and its bindings, as source and as destination."""
        self._run(
            ("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name)),
            ("DELETE FROM bindings WHERE vhost = ? AND source = ?", (vhost, name)),
            ("DELETE FROM bindings WHERE vhost = ? AND destination_kind = 'exchange' AND destination = ?",
             (vhost, name)),
        )

    def upsert_queue(self, vhost: str, name: str, durable: bool, auto_delete: bool, arguments: dict | None,
                     shard: int = 0) -> None:
        args = encode_table(arguments)
        self._run((
            "INSERT INTO queues (vhost, name, durable, auto_delete, arguments, shard) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (vhost, name) DO UPDATE SET durable = excluded.durable, "
            "auto_delete = excluded.auto_delete, arguments = excluded.arguments, shard = excluded.shard",
            (vhost, name, int(durable), int(auto_delete), args, shard),
        ))

    def delete_queue(self, vhost: str, name: str) -> None:
        """The queue and the bindings to it."""
        self._run(
            ("DELETE FROM queues WHERE vhost = ? AND name = ?", (vhost, name)),
            ("DELETE FROM bindings WHERE vhost = ? AND destination_kind = 'queue' AND destination = ?",
             (vhost, name)),
        )

    def add_binding(self, vhost: str, source: str, destination_kind: str, destination: str,
                    routing_key: str, arguments: dict | None) -> None:
        args = encode_table(arguments, sort=True)
        self._run((
            "INSERT OR IGNORE INTO bindings (vhost, source, destination_kind, destination, routing_key, arguments) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (vhost, source, destination_kind, destination, routing_key, args),
        ))

    def remove_binding(self, vhost: str, source: str, destination_kind: str, destination: str,
                       routing_key: str, arguments: dict | None) -> None:
        args = encode_table(arguments, sort=True)
        self._run((
            "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination_kind = ? "
            "AND destination = ? AND routing_key = ? AND arguments = ?",
            (vhost, source, destination_kind, destination, routing_key, args),
        ))

    # -- reading -------------------------------------------------------------

    def load(self) -> Definitions:
        """Everything, read in one transaction (so a consistent snapshot)."""
        db = self._db
        with self.transaction():
            vhosts = db.execute("SELECT name, description, tags FROM vhosts ORDER BY rowid").fetchall()
            return Definitions(
                vhosts=[name for name, _d, _t in vhosts],
                vhost_metadata={name: VhostMetadata(description, json.loads(tags)) for name, description, tags in vhosts},
                users=[UserRow(name, password_hash, json.loads(tags)) for name, password_hash, tags in
                       db.execute("SELECT name, password_hash, tags FROM users ORDER BY rowid")],
                permissions=[PermissionRow(*row) for row in db.execute(
                    "SELECT user, vhost, configure, write, read FROM permissions ORDER BY rowid")],
                exchanges=[ExchangeRow(v, n, t, bool(d), bool(a), bool(i), decode_table(args))
                           for v, n, t, d, a, i, args in db.execute(
                               "SELECT vhost, name, type, durable, auto_delete, internal, arguments "
                               "FROM exchanges ORDER BY rowid")],
                queues=[QueueRow(v, n, bool(d), bool(a), decode_table(args), shard)
                        for v, n, d, a, args, shard in db.execute(
                            "SELECT vhost, name, durable, auto_delete, arguments, shard FROM queues ORDER BY rowid")],
                bindings=[BindingRow(v, s, kind, dest, key, decode_table(args))
                          for v, s, kind, dest, key, args in db.execute(
                              "SELECT vhost, source, destination_kind, destination, routing_key, arguments "
                              "FROM bindings ORDER BY rowid")],
                topic_permissions=[TopicPermissionRow(*row) for row in db.execute(
                    "SELECT user, vhost, exchange, write, read FROM topic_permissions ORDER BY rowid")],
                vhost_limits={v: json.loads(limits) for v, limits in db.execute(
                    "SELECT vhost, limits FROM vhost_limits ORDER BY rowid")},
                user_limits={u: json.loads(limits) for u, limits in db.execute(
                    "SELECT user, limits FROM user_limits ORDER BY rowid")},
                policies=self._policies("policies"),
                operator_policies=self._policies("operator_policies"),
                parameters=[ParameterRow(v, c, n, json.loads(value), owner) for v, c, n, value, owner in db.execute(
                    "SELECT vhost, component, name, value, owner FROM parameters ORDER BY rowid")],
                global_parameters={n: json.loads(value) for n, value in db.execute(
                    "SELECT name, value FROM global_parameters ORDER BY rowid")},
            )

    def _policies(self, table: str) -> list:
        return [PolicyRow(v, n, p, a, json.loads(d), prio) for v, n, p, a, d, prio in self._db.execute(
            "SELECT vhost, name, pattern, apply_to, definition, priority FROM %s ORDER BY rowid" % table)]


def _policy_table(table: str) -> str:
    if table not in ("policies", "operator_policies"):
        raise ValueError("no policy table %r" % table)
    return table
