"""Records between shards are data with a schema (issue 39, "Shards you can
trust"; docs/scaling.md): frames are msgpack (amqp_server.shards.codec),
every record is checked against its kind (amqp_server.shards.records)
where it is handled, and an "apply" carries definition changes only.

From the outside: a raw socket on a running shard's link socket
(tests/shard_kit.py `link_socket`) sends frames no shard would, and the
shard logs each, answers on that link what it still serves (a ping, an
apply, an order), keeps the link unless the frame does not decode, and
serves pika clients after. The codec and the schema are checked in process
too: every field-table value survives the trip as the value it was, and
every kind has a handler that takes its fields.
"""
from __future__ import annotations

import datetime
import decimal
import inspect
import os
import pickle
import socket
import sqlite3
import struct
import types

import msgpack
import pika
import pytest
from pamqp import decode as amqp_decode
from pamqp import encode as amqp_encode

from amqp_server.shards import codec, link, records
from amqp_server.shards.node import ShardNode
from conftest import launch
from helpers import unique, wait_for
from shard_kit import link_socket, on_shard, pid_of_shard, queue_on
from storage.dead_letter_log import DeadLetter
from vhosts.users import Permission

_LENGTH = struct.Struct(">I")


def tup(*items) -> msgpack.ExtType:
    """A tuple as a frame holds it (ext type 1: its items, a msgpack list)."""
    return msgpack.ExtType(1, msgpack.packb(list(items)))


def frame(records_or_value) -> bytes:
    data = msgpack.packb(records_or_value)
    return _LENGTH.pack(len(data)) + data


def read_record(sock) -> list:
    """The next record the shard sends on `sock` (the raw link), skipping heartbeats."""
    buffer = b""
    while True:
        while len(buffer) < 4 or len(buffer) < 4 + _LENGTH.unpack_from(buffer)[0]:
            chunk = sock.recv(65536)
            assert chunk, "the shard closed the link"
            buffer += chunk
        length = _LENGTH.unpack_from(buffer)[0]
        got, buffer = codec.unpack(buffer[4:4 + length]), buffer[4 + length:]
        answers = [record for record in got if record[0] != "beat"]
        if answers:
            return answers[0]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = launch(tmp_path_factory.mktemp("shard-records"), "--shards", "2", "--shard-moves", "false")
    yield proc
    proc.stop()


def raw_link(node, shard: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(link_socket(pid_of_shard(node, shard)))
    sock.settimeout(10)
    return sock


def logged(node, prefix: str, lines: tuple) -> None:
    """Each of `lines`, after `prefix`, is in the node's log (which reaches the test a moment later)."""
    wait_for(lambda: all(prefix + line in node.log for line in lines), 10, what="%s%s logged" % (prefix, lines))


def serves_clients(node, shard: int) -> None:
    """A publish from a client of the other shard into a queue of `shard` is there to get."""
    connection = on_shard(node.port, 1 - shard)
    try:
        channel = connection.channel()
        name = queue_on(node, channel, shard)
        channel.confirm_delivery()
        channel.basic_publish("", name, b"after")
        assert channel.basic_get(name, auto_ack=True)[2] == b"after"
        channel.queue_delete(name)
    finally:
        connection.close()


# -- from the outside: a running node's link sockets --------------------------------------------


def test_records_of_wrong_types_unknown_kinds_or_arity_are_logged_and_skipped_and_the_link_stays(node):
    pid = pid_of_shard(node, 0)
    bad = [
        ["settle", 0, "ack", "not a list"],  # a field of another type
        ["pub", "/", ["q", 7], "", "k", b"", b"body", 0],  # a list's item of another type
        ["credit", 1],  # too few fields
        ["no-such-kind", 1],
        [1, 2],
        "not a record",
        ["tallies", {tup("connections", "u"): "many"}, None],  # a dict's value of another type
    ]
    with raw_link(node, 0) as sock:
        sock.sendall(frame(bad + [["ping", 7]]))
        assert read_record(sock) == ["pong", 7]  # the records after the bad ones were handled, on the same link
        sock.sendall(frame([["ping", 8]]))
        assert read_record(sock) == ["pong", 8]
    logged(node, "shard 0: a record from shard None skipped: ", (
        "'settle' field 'entries' is str, not list of int", "'pub' field 'queues' holds int, not str",
        "'credit' has 1 fields, not 2", "'no-such-kind' is no kind of record", "not a record: [1, 2]",
        "not a record: 'not a record'", "'tallies' field 'counts' holds str, not int"))
    assert pid_of_shard(node, 0) == pid
    serves_clients(node, 0)


def test_an_apply_naming_anything_but_a_definition_change_is_refused_and_logged(node):
    """A batch of changes from "shard 0" naming a Broker call that is no definition change
    (one that would stop the shard storing its definitions), a change of no kind the domain
    reports, and one of the wrong types: each is logged and refused, the batch is answered,
    and the shard serves on, storing its definitions."""
    pid = pid_of_shard(node, 1)
    changes = [tup("broker", "detach_definitions", tup(), {}), tup("shell", "rm -rf /"),
               tup("queue", "/", 5, True, None, False, {}, 1)]
    with raw_link(node, 1) as sock:
        sock.sendall(frame([["apply", 3, 10**9, changes]]))
        assert read_record(sock) == ["applied", 3]
    logged(node, "shard 1: a change from shard 0 refused: ", (
        "'detach_definitions' is not a definition change", "'shell' is no kind of definition change",
        "'queue' field 'name' is int, not str"))
    assert pid_of_shard(node, 1) == pid
    durable = unique("stored")
    connection = on_shard(node.port, 1)
    try:
        connection.channel().queue_declare(durable, durable=True)
    finally:
        connection.close()
    assert wait_for(lambda: _stored(node, 1, durable), 10, what="the queue in shard 1's definitions store")
    serves_clients(node, 1)


def _stored(node, shard: int, queue: str) -> bool:
    db = sqlite3.connect(os.path.join(node.data_dir, "shards", str(shard), "definitions.db"))
    try:
        return db.execute("SELECT 1 FROM queues WHERE name = ?", (queue,)).fetchone() is not None
    finally:
        db.close()


def test_an_order_of_no_amqp_method_is_refused_with_an_answer(node):
    """Shard 0 runs an order's vhost call by name: a name that is none of them is refused."""
    with raw_link(node, 0) as sock:
        sock.sendall(frame([["define", 4, tup("amqp", "_execute", "guest", "/", None, tup())]]))
        answer = read_record(sock)
    assert answer[:3] == ["refused", 4, 541]
    logged(node, "shard 0: an order from shard None refused: ", ("'_execute' is not an AMQP method shard 0 orders",))
    serves_clients(node, 0)


class _Hostile:
    """What a hostile pickle asks its reader to do: create `path` (a function call)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_frames_that_are_not_msgpack_records_close_their_link_and_run_nothing(node, tmp_path):
    """A pickle that would call a function, bytes that are not msgpack, a truncated frame, an
    unknown ext type, a Permission of the wrong fields, a frame that is not a list: each closes
    the link it came on (logged), nothing runs, and the shard serves on."""
    pid = pid_of_shard(node, 0)
    marker = tmp_path / "called"
    refused = node.log.count("an undecodable frame; closing the link")
    hostile = [
        pickle.dumps([("hello", _Hostile(str(marker)))]),
        b"not msgpack",
        msgpack.packb([["ping", 1]])[:-1],
        msgpack.packb([["ping", msgpack.ExtType(99, b"os.system")]]),
        msgpack.packb([["hello", msgpack.ExtType(3, msgpack.packb([1, 2, 3]))]]),
        msgpack.packb({"not": "records"}),
    ]
    for payload in hostile:
        with raw_link(node, 0) as sock:
            sock.sendall(_LENGTH.pack(len(payload)) + payload)
            assert sock.recv(1) == b""  # closed by the shard
    assert not marker.exists()
    wait_for(lambda: node.log.count("an undecodable frame; closing the link") == refused + len(hostile), 10,
             what="every frame logged")
    assert pid_of_shard(node, 0) == pid
    serves_clients(node, 0)


def test_field_table_values_cross_shards_as_they_were(node):
    """A headers exchange and its binding declared from shard 1 reach shard 1 as shard 0's
    "apply" of them (through shard 0's order): a message published on shard 1 routes there by
    the binding's Decimal, datetime, bytes and nested-table arguments only if each crossed as
    the value it was. Its consumer on shard 1 of a queue on shard 0, with arguments, gets it;
    the binding's byte array stays one (a client of shard 0 unbinds it by the same arguments).
    No record or change a shard sent was refused meanwhile."""
    refused = _refusals(node)
    connection = on_shard(node.port, 1)
    try:
        channel = connection.channel()
        exchange, queue = unique("headers"), queue_on(node, channel, 0)
        channel.exchange_declare(exchange, "headers", arguments={"x-note": decimal.Decimal("0.5")})
        headers = {"d": decimal.Decimal("-1.25"), "t": datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                                        tzinfo=datetime.timezone.utc),
                   "x": b"\x00\xff", "n": {"deep": [1, "two", {"k": True}]}}
        channel.queue_bind(queue, exchange, arguments={"x-match": "all", **headers})
        channel.confirm_delivery()
        channel.basic_publish(exchange, "", b"matched", pika.BasicProperties(headers=headers))
        channel.basic_publish(exchange, "", b"not", pika.BasicProperties(headers={**headers, "d": "-1.25"}))
        got = []
        channel.basic_consume(queue, lambda ch, method, _props, body: got.append(body), auto_ack=True,
                              arguments={"x-priority": 3, "x-note": {"t": headers["t"]}})
        connection.process_data_events(time_limit=0)
        wait_for(lambda: connection.process_data_events(time_limit=0.1) or got, 10, what="the message")
        connection.process_data_events(time_limit=0.5)
        assert got == [b"matched"]
        channel.basic_cancel(channel.consumer_tags[0])
        # pika sends bytes as an AMQP byte array: the binding made through the link is the one a
        # client of shard 0 names, and unbinding it there stops the routing on shard 1 too
        local = on_shard(node.port, 0)
        local.channel().queue_unbind(queue, exchange, arguments={"x-match": "all", **headers})
        local.close()
        channel.basic_publish(exchange, "", b"unbound", pika.BasicProperties(headers=headers))
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
    finally:
        connection.close()
    assert _refusals(node) == refused


def _refusals(node) -> list[str]:
    return [line for line in node.log.splitlines() if " skipped: " in line or " refused: " in line]


# -- in process: the codec and the schema ------------------------------------------------------


def test_every_field_table_value_decodes_as_it_was():
    """What an AMQP field table decodes to (pamqp) crosses as that value and type in a record
    that holds tables (a consume's arguments); a Permission and a DeadLetter are rebuilt from
    their fields; tuples stay tuples, lists lists."""
    table = amqp_encode.field_table({
        "d": decimal.Decimal("-1.250"), "t": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        "x": bytearray(b"\x00\x01"), "s": "str", "a": [1, "two", {"k": True}], "n": {"deep": {"deeper": 1.5}},
        "v": None, "i": -2**63, "f": 0.25, "b": False})
    _, arguments = amqp_decode.field_table(table)
    consume = ("consume", 1, "/", "q", "tag", False, False, 0, 0, arguments)
    nested = (1, ("key", None), [2, (3,)])
    others = ("answer", 2, [nested, {("kind", "name"): 4}, Permission("^a$", "", ".*"),
                            DeadLetter(1.5, "/", "q", "expired", "", ["k"], headers={"h": [1]}, body=b"\xff",
                                       body_size=1)])
    got_consume, got_others = link.decode(link.encode([consume, others]))
    assert got_consume == list(consume) and got_others == list(others)
    got = got_consume[9]
    assert {key: type(value) for key, value in got.items()} == {key: type(value) for key, value in arguments.items()}
    assert type(got["a"][2]) is dict and str(got["d"]) == "-1.250" and got["t"].utcoffset() == datetime.timedelta(0)
    assert type(got_others[2][0]) is tuple and type(got_others[2][0][1]) is tuple and type(got_others[2][0][2]) is list
    assert got_others[2][2].allows("configure", "a") and not got_others[2][2].allows("configure", "b")
    # elsewhere (a report's client properties, only shown) a byte array arrives as bytes
    assert link.decode(link.encode([("answer", 3, bytearray(b"x"))])) == [["answer", 3, b"x"]]


@pytest.mark.parametrize("value", [{1}, frozenset(), datetime.datetime(2026, 1, 1), 2**64, object(),
                                   types.SimpleNamespace(), Exception("x")])
def test_values_no_shard_carries_are_refused_where_they_are_packed(value):
    with pytest.raises(TypeError):
        codec.pack(["answer", 1, value])


def test_a_record_that_cannot_be_encoded_is_dropped_alone(caplog):
    data = link.encode([("ping", 1), ("answer", 2, {1, 2}), ("pong", 3)])
    assert link.decode(data) == [["ping", 1], ["pong", 3]]
    assert "a 'answer' record cannot be sent" in caplog.text


@pytest.mark.parametrize("data", [
    pickle.dumps([("ping", 1)]), b"", b"\xc1", msgpack.packb([1])[:-1] + b"\xdc",
    msgpack.packb([msgpack.ExtType(99, b"")]), msgpack.packb([msgpack.ExtType(2, b"not a number")]),
    msgpack.packb([msgpack.ExtType(3, msgpack.packb(["a", "b"]))]),
    msgpack.packb([msgpack.ExtType(4, msgpack.packb([1.0, "/"]))]),
    msgpack.packb([msgpack.ExtType(1, b"\x01")]), msgpack.packb({tup([1]): 1}), msgpack.packb({"a": 1}),
])
def test_bytes_that_hold_no_records_fail_as_a_value_error(data):
    with pytest.raises(ValueError):
        link.decode(data)


def _node() -> ShardNode:
    return ShardNode(types.SimpleNamespace(index=1, count=2), heartbeat=30.0)


def test_every_kind_of_record_has_a_handler_that_takes_its_fields():
    table = records.table(_node())
    assert set(table) == set(records.RECORDS.schema)
    for kind, fields in records.RECORDS.schema.items():
        parameters = list(inspect.signature(table[kind]).parameters.values())[1:]  # after the link
        if parameters and parameters[-1].kind is inspect.Parameter.VAR_POSITIONAL:
            assert len(parameters) - 1 <= len(fields), kind
        else:
            assert len(parameters) == len(fields), kind


def test_the_records_that_carry_a_message_weigh_its_bytes():
    """link._BODY_AT (how a frame is cut) names each kind's message field."""
    for kind, at in link._BODY_AT.items():
        name, types_ = list(records.RECORDS.schema[kind].items())[at - 1]
        assert name in ("body", "data") and bytes in (types_ if isinstance(types_, tuple) else (types_,)), kind


def test_a_record_is_checked_against_its_kind():
    fault = records.RECORDS.fault
    assert fault(["pub", "/", ["q"], "", "k", b"", b"body", 0]) is None
    assert fault(["deliver", 1, 2, True, 1, "", "k", b"", b"", None]) is None
    assert fault(["got", 1, 0, False, 0, None, 0]) is None
    assert fault(["settle", 0, "ack", [1, True]]) is None  # a bool is an int, as Python has it
    assert fault(["get", 1, "/", "q", 1]) == "'get' field 'no_ack' is int, not bool"
    assert fault(["got", 1, 0, False, 0, "body", 0]) == "'got' field 'data' is str, not bytes or NoneType"
    assert fault(["beat", 1]) == "'beat' has 1 fields, not 0"
    assert fault([]) == "not a record: []"
