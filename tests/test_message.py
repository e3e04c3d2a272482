"""storage.message.Message keeps the content header as published and reads
only what it needs from the raw bytes; pamqp's ContentHeader decoder is the
oracle.

Content headers are built here property by property (pamqp.encode for each
value), not with pamqp's Properties.marshal, so that headers pamqp would never
produce (empty-string properties, delivery modes other than 1 and 2, a
continuation flags word, any wire type in the headers table) are covered too.
"""
from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pamqp import commands, encode
from pamqp import header as pamqp_header

from storage.message import Message, delivery_mode, priority, reply_to, with_reply_to

PROPS = commands.Basic.Properties
NAMES = list(PROPS.__slots__)


def build_header(props: dict, body_size: int = 0, continuation: bool = False, weight: int = 0) -> bytes:
    """A basic content header payload with exactly the given properties present
    (a value of None means the flag is set nowhere; "" is a present, empty one)."""
    flags, values = 0, []
    for name in NAMES:  # wire order
        if name in props and props[name] is not None:
            flags |= PROPS.flags[name]
            values.append(encode.by_type(props[name], PROPS.amqp_type(name)))
    words = struct.pack(">H", flags | 1) + struct.pack(">H", 0) if continuation else struct.pack(">H", flags)
    return struct.pack(">HHQ", 60, weight, body_size) + words + b"".join(values)


def pamqp_decode(header: bytes) -> pamqp_header.ContentHeader:
    decoded = pamqp_header.ContentHeader()
    decoded.unmarshal(header)
    return decoded


def as_dict(properties) -> dict:
    return {name: getattr(properties, name) for name in NAMES}


shortstrs = st.text(max_size=30).map(lambda s: s.encode("utf-8")[:255].decode("utf-8", errors="ignore"))
keys = st.text(min_size=1, max_size=12).filter(lambda k: len(k.encode("utf-8")) <= 255)
field_values = st.recursive(
    st.one_of(
        st.text(max_size=20),
        st.integers(-2**63, 2**63 - 1),
        st.booleans(),
        st.none(),
        st.floats(width=32, allow_nan=False, allow_infinity=False),  # pamqp writes floats as 'f'
    ),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=3)),
    max_leaves=8,
)
tables = st.dictionaries(keys, field_values, max_size=5)
timestamps = st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(9999, 1, 1),
                          timezones=st.just(datetime.timezone.utc)).map(lambda d: d.replace(microsecond=0))


@st.composite
def property_sets(draw, headers=tables):
    props = {}
    for name in NAMES:
        kind = PROPS.amqp_type(name)
        if name == "cluster_id" or not draw(st.booleans()):
            continue
        if kind == "shortstr":
            props[name] = draw(shortstrs)
        elif kind == "octet":
            # any octet: RabbitMQ passes delivery modes other than 1/2 through
            props[name] = draw(st.one_of(st.sampled_from([1, 2]), st.integers(0, 255)))
        elif kind == "table":
            props[name] = draw(headers)
        elif kind == "timestamp":
            props[name] = draw(timestamps)
    return props


body_sizes = st.integers(0, 2**63 - 1)


@given(property_sets(), body_sizes, st.booleans())
@example({}, 0, False)
@example({"delivery_mode": 2}, 1, False)
@example({"content_type": "", "content_encoding": "", "headers": {}, "delivery_mode": 1}, 0, True)
@example({"content_type": "x" * 255, "content_encoding": "y" * 255, "headers": {"k": "v" * 300},
          "delivery_mode": 2}, 10, False)
def test_delivery_mode_and_flags_read_from_raw_bytes_match_pamqp(props, body_size, continuation):
    header = build_header(props, body_size, continuation)
    decoded = pamqp_decode(header)
    message = Message("ex", "rk", header, b"")
    assert delivery_mode(header) == (decoded.properties.delivery_mode or 0) == (props.get("delivery_mode") or 0)
    assert message.persistent is (decoded.properties.delivery_mode == 2)
    assert message.has_headers is (decoded.properties.headers is not None) is ("headers" in props)
    assert message.header is header  # kept as published


@given(property_sets(), st.booleans())
def test_properties_decode_equals_pamqp(props, continuation):
    header = build_header(props, 5, continuation)
    message = Message("ex", "rk", header, b"hello")
    assert as_dict(message.properties) == as_dict(pamqp_decode(header).properties)
    assert message.properties is message.properties  # decoded once
    assert message.headers == props.get("headers")
    assert message.size == 5


def test_properties_are_decoded_lazily():
    # Everything up to delivery_mode is well formed; the timestamp after it is
    # cut short, so only a full decode can fail.
    header = build_header({"headers": {"a": 1}, "delivery_mode": 2})
    header = header[:12] + struct.pack(">H", struct.unpack_from(">H", header, 12)[0] | PROPS.flags["timestamp"]) \
        + header[14:] + b"\x00\x00"
    message = Message("ex", "rk", header, b"")
    assert message.persistent and message.has_headers
    with pytest.raises(Exception):
        pamqp_decode(header)
    with pytest.raises(Exception):
        message.properties  # noqa: B018


# -- remove_header ----------------------------------------------------------------

tables_with_bcc = st.tuples(tables, field_values, st.integers(0, 5)).map(
    lambda t: dict(list(t[0].items())[:t[2]] + [("BCC", t[1])] + list(t[0].items())[t[2]:]))


@given(property_sets(headers=st.one_of(tables_with_bcc, tables)), body_sizes, st.booleans())
@example({"content_type": "", "headers": {"BCC": ["q"], "k": 1}, "delivery_mode": 2, "app_id": ""}, 3, False)
@example({"headers": {"BCC": ["q"]}}, 0, True)
def test_remove_bcc_keeps_everything_else(props, body_size, continuation):
    header = build_header(props, body_size, continuation, weight=0)
    original = pamqp_decode(header)
    message = Message("ex", "rk", header, b"")
    message.remove_header("BCC")
    had_bcc = "BCC" in (props.get("headers") or {})
    if not had_bcc:
        assert message.header == header
    after = pamqp_decode(message.header)
    expected = as_dict(original.properties)
    if had_bcc:
        expected["headers"] = {k: v for k, v in expected["headers"].items() if k != "BCC"}
    assert as_dict(after.properties) == expected
    assert (after.class_id, after.weight, after.body_size) == (60, 0, body_size)
    assert message.headers == expected["headers"]
    assert delivery_mode(message.header) == delivery_mode(header)
    assert message.has_headers is ("headers" in props)
    # a fresh message over the new bytes sees the same
    assert as_dict(Message("ex", "rk", message.header, b"").properties) == expected


def _entry(key: bytes, type_and_value: bytes) -> bytes:
    return bytes((len(key),)) + key + type_and_value


def test_remove_bcc_keeps_the_other_entries_byte_for_byte():
    # wire types pamqp would not choose itself ('I' for 1, 's' short, 'l' for 2):
    # a client with typed headers must get them back as it sent them.
    before = _entry(b"a", b"I\x00\x00\x00\x01") + _entry(b"b", b"s\x00\x07")
    bcc = _entry(b"BCC", b"A\x00\x00\x00\x06S\x00\x00\x00\x01q")
    after = _entry(b"c", b"l" + struct.pack(">q", 2)) + _entry(b"bcc", b"t\x01")
    table = before + bcc + after
    props = b"\x00" + struct.pack(">I", len(table)) + table + b"\x02"  # content_type "", headers, delivery_mode
    header = struct.pack(">HHQH", 60, 0, 9, 0x8000 | 0x2000 | 0x1000) + props
    message = Message("", "q", header, b"123456789")
    message.remove_header("BCC")
    kept = before + after
    assert message.header == struct.pack(">HHQH", 60, 0, 9, 0x8000 | 0x2000 | 0x1000) + b"\x00" + struct.pack(
        ">I", len(kept)) + kept + b"\x02"
    assert message.headers == {"a": 1, "b": 7, "c": 2, "bcc": True}
    assert message.persistent


def test_remove_only_bcc_leaves_an_empty_headers_table():
    header = build_header({"headers": {"BCC": ["x"]}, "priority": 3})
    message = Message("", "", header, b"")
    message.remove_header("BCC")
    assert pamqp_decode(message.header).properties.headers == {}
    assert pamqp_decode(message.header).properties.priority == 3
    assert message.has_headers


@pytest.mark.parametrize("props", [{}, {"headers": {}}, {"headers": {"bcc": ["x"], "CC": ["y"]}}])
def test_remove_absent_header_changes_nothing(props):
    header = build_header(props)
    message = Message("", "", header, b"")
    message.remove_header("BCC")
    assert message.header == header


@given(property_sets(), st.booleans())
@example({"priority": 7}, False)
@example({"content_type": "", "headers": {"a": 1}, "delivery_mode": 2, "priority": 255}, True)
def test_priority_read_from_raw_bytes_matches_pamqp(props, continuation):
    header = build_header(props, 0, continuation)
    assert priority(header) == (pamqp_decode(header).properties.priority or 0) == (props.get("priority") or 0)


@given(property_sets(), st.booleans(), shortstrs)
@example({"reply_to": "amq.rabbitmq.reply-to", "headers": {"a": 1}, "expiration": "5"}, False,
         "amq.rabbitmq.reply-to.abc+/=.def==")
def test_reply_to_read_and_replaced_in_raw_bytes_match_pamqp(props, continuation, replacement):
    """Direct reply-to reads reply_to and swaps it without decoding the rest:
    every other property decodes as before."""
    header = build_header(props, 3, continuation)
    expected = props.get("reply_to")
    assert reply_to(header) == (None if expected is None else expected.encode("utf-8"))
    if expected is None:
        return
    replaced = with_reply_to(header, replacement.encode("utf-8"))
    assert as_dict(pamqp_decode(replaced).properties) == {**as_dict(pamqp_decode(header).properties),
                                                          "reply_to": replacement}
    assert replaced[:12] == header[:12]  # class, weight, body size
