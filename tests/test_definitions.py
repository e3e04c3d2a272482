"""storage.definitions.DefinitionStore, and the domain writing durable definitions into it.

The store: round trips (field tables of every type, nested, in order), the
cascades, one transaction per mutation (a failing one leaves nothing),
reopening the file, surviving a process that dies without closing it. The
domain: which declarations RabbitMQ keeps (durable exchanges and queues, not
exclusive queues, bindings only between durable ends), and the default
vhost and user created only on a blank store. Restarts of a real broker
process are in test_restart.py.
"""
from __future__ import annotations

import datetime
import math
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from routing import Destination
from storage.definitions import (
    BindingRow,
    DefinitionStore,
    ExchangeRow,
    PermissionRow,
    SCHEMA_VERSION,
    QueueRow,
    UserRow,
    decode_table,
    encode_table,
)
from vhosts import Broker
from vhosts.users import Permission, hash_password

ROOT = Path(__file__).resolve().parent.parent

EVERY_TYPE = {
    "small": 1,
    "negative": -129,
    "long": 2**31,
    "longlong": -(2**63),
    "max": 2**64 - 1,
    "float": 0.1,
    "huge": 1e300,
    "negzero": -0.0,
    "inf": float("-inf"),
    "true": True,
    "false": False,
    "text": "héllo \u2603 \x00 \"quoted\"",
    "empty": "",
    "bytes": b"\x00\xff\xfe not utf-8",
    "bytearray": bytearray(b"\x01\x02"),
    "decimal": Decimal("1.00"),
    "decimal-neg": Decimal("-0.000"),
    "decimal-exp": Decimal("1E+3"),
    "naive": datetime.datetime(2024, 2, 29, 23, 59, 58),
    "aware": datetime.datetime(2024, 1, 2, 3, 4, 5, 678, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    "void": None,
    "array": [1, "two", 3.5, None, [True, b"x"], {"k": Decimal("2.5")}],
    "empty-array": [],
    "table": {"z": 1, "a": {"deeper": [{"b": 2, "a": 1}]}, "m": "x"},
    "empty-table": {},
}


def typed(value):
    """A comparable image of a field value that keeps types (and float bits)."""
    if isinstance(value, dict):
        return ("table", [(k, typed(v)) for k, v in value.items()])  # order kept
    if isinstance(value, list):
        return ("array", [typed(v) for v in value])
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, Decimal):
        return ("Decimal", value.as_tuple())
    if isinstance(value, datetime.datetime):
        return ("datetime", value.isoformat())
    return (type(value).__name__, value)


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "definitions.db")


@pytest.fixture
def store(path):
    s = DefinitionStore(path)
    yield s
    s.close()


# -- field tables ------------------------------------------------------------------


def test_every_field_type_round_trips_exactly():
    back = decode_table(encode_table(EVERY_TYPE))
    assert typed(back) == typed(EVERY_TYPE)
    assert list(back) == list(EVERY_TYPE)


def test_nan_round_trips():
    assert math.isnan(decode_table(encode_table({"n": float("nan")}))["n"])


def test_binding_arguments_are_sorted_at_the_top_level_only():
    one = encode_table({"b": 1, "a": {"y": 1, "x": 2}}, sort=True)
    two = encode_table({"a": {"y": 1, "x": 2}, "b": 1}, sort=True)
    assert one == two
    assert list(decode_table(one)) == ["a", "b"]
    assert list(decode_table(one)["a"]) == ["y", "x"]  # nested order is part of the identity
    assert encode_table({"a": 1}, sort=True) != encode_table({"a": 1.0}, sort=True) != encode_table({"a": True})


def test_an_unknown_type_is_refused():
    with pytest.raises(TypeError):
        encode_table({"x": object()})
    with pytest.raises(TypeError):
        encode_table({"x": {1: "non-str key"}})


# -- the store -------------------------------------------------------------------------


def test_fresh_store_is_blank_and_in_wal_mode(store, path):
    assert store.load().blank
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    other = sqlite3.connect(path)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    other.close()


def test_a_version_1_file_is_migrated_and_keeps_its_definitions(path):
    import storage.definitions as definitions

    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(definitions._SCHEMA)
    old.execute("INSERT INTO vhosts (name) VALUES ('/')")
    old.execute("INSERT INTO queues VALUES ('/', 'q', 1, 0, ?)", (encode_table({}),))
    old.execute("PRAGMA user_version=1")
    old.close()
    store = DefinitionStore(path)
    store.set_topic_permission("u", "/", "amq.topic", "^a", "^b")
    d = store.load()
    assert d.vhosts == ["/"] and d.queues == [QueueRow("/", "q", True, False, {})]
    assert d.topic_permissions == [definitions.TopicPermissionRow("u", "/", "amq.topic", "^a", "^b")]
    assert d.vhost_metadata == {"/": definitions.VhostMetadata("", [])}
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_a_version_2_file_is_migrated_and_its_vhosts_get_empty_metadata(path):
    import storage.definitions as definitions

    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(definitions._SCHEMA + definitions._MIGRATIONS[2])
    old.execute("INSERT INTO vhosts (name) VALUES ('/')")
    old.execute("INSERT INTO policies VALUES ('/', 'p', '^q', 'all', '{}', 0)")
    old.execute("PRAGMA user_version=2")
    old.close()
    store = DefinitionStore(path)
    store.upsert_vhost("described", "for tests", ["qa", "blue"])
    d = store.load()
    assert d.vhosts == ["/", "described"] and [p.name for p in d.policies] == ["p"]
    assert d.vhost_metadata == {"/": definitions.VhostMetadata("", []),
                                "described": definitions.VhostMetadata("for tests", ["qa", "blue"])}
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_upserting_a_vhost_replaces_its_description_and_tags(store):
    import storage.definitions as definitions

    store.upsert_vhost("v", "first", ["a"])
    store.upsert_vhost("v", "second", ["b", "c"])
    assert store.load().vhost_metadata == {"v": definitions.VhostMetadata("second", ["b", "c"])}
    store.upsert_vhost("v")
    assert store.load().vhost_metadata == {"v": definitions.VhostMetadata("", [])}


def test_round_trip_of_every_kind_of_definition(store):
    store.upsert_vhost("/")
    store.upsert_vhost("other")
    store.upsert_user("alice", "hash1", ["administrator", "monitoring"])
    store.set_permission("alice", "/", "^c", "^w", "^r")
    store.upsert_exchange("/", "x", "headers", True, True, True, EVERY_TYPE)
    store.upsert_queue("/", "q", True, True, {"x-max-length": 10, "nested": EVERY_TYPE})
    store.add_binding("/", "x", "queue", "q", "key", {"x-match": "any", "color": "red"})
    store.add_binding("/", "amq.fanout", "exchange", "x", "", None)
    d = store.load()
    assert d.vhosts == ["/", "other"]
    assert d.users == [UserRow("alice", "hash1", ["administrator", "monitoring"])]
    assert d.permissions == [PermissionRow("alice", "/", "^c", "^w", "^r")]
    assert d.exchanges == [ExchangeRow("/", "x", "headers", True, True, True, EVERY_TYPE)]
    assert typed(d.exchanges[0].arguments) == typed(EVERY_TYPE)
    assert d.queues == [QueueRow("/", "q", True, True, {"x-max-length": 10, "nested": EVERY_TYPE})]
    assert typed(d.queues[0].arguments["nested"]) == typed(EVERY_TYPE)
    assert d.bindings == [
        BindingRow("/", "x", "queue", "q", "key", {"color": "red", "x-match": "any"}),
        BindingRow("/", "amq.fanout", "exchange", "x", "", {}),
    ]
    assert not d.blank


def test_upserts_replace_and_duplicates_are_one_row(store):
    store.upsert_vhost("/")
    store.upsert_vhost("/")
    store.upsert_user("u", "h1", [])
    store.upsert_user("u", "h2", ["management"])
    store.set_permission("u", "/", ".*", ".*", ".*")
    store.set_permission("u", "/", "", "", "")
    store.upsert_queue("/", "q", True, False, {"a": 1})
    store.upsert_queue("/", "q", True, True, {"a": 2})
    for _ in range(2):
        store.add_binding("/", "x", "queue", "q", "k", {"b": 1, "a": 2})
    store.add_binding("/", "x", "queue", "q", "k", {"a": 2, "b": 1})  # same binding: top-level order is not identity
    store.add_binding("/", "x", "queue", "q", "k", {"a": 2.0, "b": 1})  # a different binding: 2.0 is not 2
    d = store.load()
    assert d.vhosts == ["/"]
    assert d.users == [UserRow("u", "h2", ["management"])]
    assert d.permissions == [PermissionRow("u", "/", "", "", "")]
    assert d.queues == [QueueRow("/", "q", True, True, {"a": 2})]
    assert len(d.bindings) == 2


def test_remove_binding_matches_arguments_whatever_their_order(store):
    store.add_binding("/", "x", "queue", "q", "k", {"b": 1, "a": [1, 2]})
    store.remove_binding("/", "x", "queue", "q", "k", {"a": [2, 1], "b": 1})  # not this one
    assert len(store.load().bindings) == 1
    store.remove_binding("/", "x", "queue", "q", "k", {"a": [1, 2], "b": 1})
    assert store.load().bindings == []


def test_deleting_an_exchange_deletes_its_bindings_both_ways(store):
    store.upsert_exchange("/", "x", "direct", True, False, False, {})
    store.upsert_exchange("/", "y", "fanout", True, False, False, {})
    store.upsert_queue("/", "q", True, False, {})
    store.add_binding("/", "x", "queue", "q", "k", {})  # x as source
    store.add_binding("/", "y", "exchange", "x", "", {})  # x as destination
    store.add_binding("/", "y", "queue", "q", "", {})  # unrelated
    store.add_binding("other", "x", "queue", "q", "k", {})  # same names in another vhost
    store.delete_exchange("/", "x")
    d = store.load()
    assert [x.name for x in d.exchanges] == ["y"]
    assert [(b.vhost, b.source, b.destination) for b in d.bindings] == [("/", "y", "q"), ("other", "x", "q")]


def test_deleting_a_queue_deletes_the_bindings_to_it(store):
    store.upsert_queue("/", "q", True, False, {})
    store.upsert_queue("/", "r", True, False, {})
    store.add_binding("/", "amq.direct", "queue", "q", "k", {})
    store.add_binding("/", "amq.direct", "queue", "r", "k", {})
    store.add_binding("/", "amq.direct", "exchange", "q", "k", {})  # an exchange named q: kept
    store.delete_queue("/", "q")
    d = store.load()
    assert [q.name for q in d.queues] == ["r"]
    assert [(b.destination_kind, b.destination) for b in d.bindings] == [("queue", "r"), ("exchange", "q")]


def test_deleting_a_vhost_or_user_cascades(store):
    for v in ("/", "v"):
        store.upsert_vhost(v)
        store.upsert_exchange(v, "x", "direct", True, False, False, {})
        store.upsert_queue(v, "q", True, False, {})
        store.add_binding(v, "x", "queue", "q", "", {})
    store.upsert_user("a", "h", [])
    store.upsert_user("b", "h", [])
    store.set_permission("a", "/", ".*", ".*", ".*")
    store.set_permission("a", "v", ".*", ".*", ".*")
    store.set_permission("b", "v", ".*", ".*", ".*")
    store.delete_vhost("v")
    store.delete_user("a")
    d = store.load()
    assert d.vhosts == ["/"]
    assert [u.name for u in d.users] == ["b"]
    assert d.permissions == []
    assert {x.vhost for x in d.exchanges} == {q.vhost for q in d.queues} == {b.vhost for b in d.bindings} == {"/"}


def test_a_failing_mutation_leaves_no_partial_state(store, path):
    store.upsert_queue("/", "q", True, False, {})
    store.add_binding("/", "amq.direct", "queue", "q", "k", {})
    # Make the second statement of delete_queue (the binding cascade) fail.
    other = sqlite3.connect(path)
    other.execute("CREATE TRIGGER refuse BEFORE DELETE ON bindings BEGIN SELECT RAISE(ABORT, 'refused'); END")
    other.commit()
    with pytest.raises(sqlite3.Error, match="refused"):
        store.delete_queue("/", "q")
    d = store.load()
    assert [q.name for q in d.queues] == ["q"]  # the queue row's delete was rolled back
    assert len(d.bindings) == 1
    other.execute("DROP TRIGGER refuse")
    other.commit()
    other.close()
    store.delete_queue("/", "q")  # the store is usable after the failure
    assert store.load().queues == store.load().bindings == []


def test_a_bad_argument_writes_nothing(store):
    with pytest.raises(TypeError):
        store.upsert_exchange("/", "x", "direct", True, False, False, {"bad": object()})
    with pytest.raises(TypeError):
        store.add_binding("/", "x", "queue", "q", "", {"bad": {3}})
    assert store.load().blank and store.load().exchanges == [] and store.load().bindings == []


def test_transaction_groups_mutations_and_rolls_back_on_error(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.upsert_exchange("/", "x", "direct", True, False, False, {})
            with store.transaction():  # nested: joins the outer one
                store.upsert_queue("/", "q", True, False, {})
            raise RuntimeError("boom")
    d = store.load()
    assert d.exchanges == [] and d.queues == []
    with store.transaction():
        store.upsert_exchange("/", "x", "direct", True, False, False, {})
        store.upsert_queue("/", "q", True, False, {})
    d = store.load()
    assert len(d.exchanges) == len(d.queues) == 1


def test_reopening_the_file_gives_everything_back(path):
    s = DefinitionStore(path)
    s.upsert_vhost("/")
    s.upsert_exchange("/", "x", "topic", True, False, False, {"alternate-exchange": "ae"})
    s.add_binding("/", "x", "queue", "q", "a.#", {"n": [Decimal("0.1")]})
    before = s.load()
    s.close()
    s = DefinitionStore(path)
    assert s.load() == before
    s.close()


def test_committed_changes_survive_a_process_that_dies_without_closing(path):
    script = (
        "import os\n"
        "from storage.definitions import DefinitionStore\n"
        "s = DefinitionStore(%r)\n"
        "s.upsert_vhost('/')\n"
        "s.upsert_queue('/', 'q', True, False, {'x-message-ttl': 5})\n"
        "os._exit(0)\n" % path
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)
    s = DefinitionStore(path)
    assert s.load().queues == [QueueRow("/", "q", True, False, {"x-message-ttl": 5})]
    s.close()


def test_an_unknown_schema_version_is_refused(path):
    DefinitionStore(path).close()
    other = sqlite3.connect(path)
    other.execute("PRAGMA user_version=99")
    other.commit()
    other.close()
    with pytest.raises(sqlite3.DatabaseError, match="schema version 99"):
        DefinitionStore(path)


# -- the domain writing into it ----------------------------------------------------------


def new_broker(path: str, user: str = "guest", vhost: str = "/") -> tuple[Broker, DefinitionStore]:
    store = DefinitionStore(path)
    return Broker(user, user, vhost, [], definitions=store), store


def test_defaults_are_created_on_a_blank_store_only(path):
    broker, store = new_broker(path)
    assert store.load().vhosts == ["/"]
    assert [u.name for u in store.load().users] == ["guest"]
    broker.delete_user("guest")
    broker.add_vhost("v")
    alice = broker.put_user("alice", hash_password("secret"), ["management"])
    broker.set_permissions("alice", "v", Permission("^a", "^b", "^c"))
    store.close()

    broker, store = new_broker(path, user="other", vhost="other")  # new defaults: ignored
    assert set(broker.vhosts) == {"/", "v"}
    assert set(broker.users) == {"alice"}
    restored = broker.users["alice"]
    assert restored.password_hash == alice.password_hash and restored.authenticate("secret")
    assert restored.tags == ["management"]
    assert restored.permissions == {"v": Permission("^a", "^b", "^c")}
    broker.clear_permissions("alice", "v")
    broker.delete_vhost("v")
    store.close()

    broker, store = new_broker(path)
    assert set(broker.vhosts) == {"/"}
    assert broker.users["alice"].permissions == {}
    store.close()


def test_only_durable_definitions_are_written(path):
    broker, store = new_broker(path)
    v = broker.vhosts["/"]
    owner = object()
    v.declare_exchange("dx", "direct", durable=True, arguments={"alternate-exchange": "ae"})
    v.declare_exchange("tx", "direct", durable=False)
    v.declare_queue("dq", owner, durable=True, arguments={"x-max-length": 3})
    v.declare_queue("tq", owner, durable=False)
    v.declare_queue("xq", owner, durable=True, exclusive=True)
    v.declare_queue("adq", owner, durable=True, auto_delete=True)
    for exchange in ("dx", "tx", "amq.topic"):
        for queue in ("dq", "tq", "xq", "adq"):
            v.bind_queue(queue, exchange, "k", None, owner)
    v.bind_exchange("dx", "amq.fanout", "", None)
    v.bind_exchange("tx", "dx", "", None)
    d = store.load()
    assert [x.name for x in d.exchanges] == ["dx"]
    assert d.exchanges[0].arguments == {"alternate-exchange": "ae"}
    assert [(q.name, q.auto_delete) for q in d.queues] == [("dq", False), ("adq", True)]
    assert sorted((b.source, b.destination) for b in d.bindings) == [
        ("amq.fanout", "dx"), ("amq.topic", "adq"), ("amq.topic", "dq"), ("dx", "adq"), ("dx", "dq")]

    v.unbind_queue("dq", "dx", "k", None, owner)
    v.delete_queue("adq", owner)
    v.delete_queue("xq", owner)
    assert sorted((b.source, b.destination) for b in store.load().bindings) == [
        ("amq.fanout", "dx"), ("amq.topic", "dq")]
    v.delete_exchange("dx")
    d = store.load()
    assert d.exchanges == [] and [q.name for q in d.queues] == ["dq"]
    assert [(b.source, b.destination) for b in d.bindings] == [("amq.topic", "dq")]
    store.close()


def test_auto_delete_cascades_are_written_in_one_transaction(path):
    broker, store = new_broker(path)
    v = broker.vhosts["/"]
    owner = object()
    v.declare_exchange("ad", "fanout", durable=True, auto_delete=True)
    v.declare_exchange("ad2", "fanout", durable=True, auto_delete=True)
    v.declare_queue("q", owner, durable=True)
    v.bind_queue("q", "ad", "", None, owner)
    v.bind_exchange("ad", "ad2", "", None)  # ad2 -> ad -> q
    assert [x.name for x in store.load().exchanges] == ["ad", "ad2"]
    v.delete_queue("q", owner)  # ad loses its last binding, then ad2
    d = store.load()
    assert d.exchanges == d.queues == d.bindings == []
    assert set(v.exchanges) == {name for name in v.exchanges if name.startswith("amq.")}
    store.close()


def test_restore_rebuilds_a_vhost(path):
    broker, store = new_broker(path)
    v = broker.vhosts["/"]
    owner = object()
    v.declare_exchange("h", "headers", durable=True, internal=True)
    v.declare_queue("q", owner, durable=True, auto_delete=True, arguments={"x-message-ttl": 100})
    v.bind_queue("q", "h", "", {"x-match": "any", "a": 1}, owner)
    v.bind_exchange("h", "amq.headers", "", {"b": 2})
    store.close()

    broker, store = new_broker(path)
    v = broker.vhosts["/"]
    x = v.exchanges["h"]
    assert (x.type, x.durable, x.auto_delete, x.internal) == ("headers", True, False, True)
    q = v.queues["q"]
    assert (q.durable, q.auto_delete, q.exclusive_owner, q.arguments) == (True, True, None, {"x-message-ttl": 100})
    assert sorted(v.bindings(), key=lambda binding: binding[0]) == [
        ("amq.headers", Destination("exchange", "h"), "", {"b": 2}),
        ("h", Destination("queue", "q"), "", {"a": 1, "x-match": "any"}),
    ]
    assert [q.name for q in v.route("amq.headers", [""], {"a": 1, "b": 2})] == ["q"]
    # Unbinding a restored binding reaches the store.
    v.unbind_queue("q", "h", "", {"a": 1, "x-match": "any"}, object())
    assert [(b.source, b.destination) for b in store.load().bindings] == [("amq.headers", "h")]
    store.close()


def test_detached_broker_writes_nothing(path):
    broker, store = new_broker(path)
    v = broker.vhosts["/"]
    v.declare_queue("q", object(), durable=True)
    broker.detach_definitions()
    v.remove_queue(v.queues["q"])
    v.declare_exchange("x", "direct", durable=True)
    assert [q.name for q in store.load().queues] == ["q"]
    assert store.load().exchanges == []
    store.close()
