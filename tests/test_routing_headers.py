"""Headers matching: RabbitMQ's x-match modes and value comparison, plus an oracle property."""

from datetime import datetime, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import Destination, HeadersTable, headers_match

TS = datetime(2020, 1, 1, tzinfo=timezone.utc)

# Every case here was also checked against RabbitMQ 3.10 with pika (publish, basic.get).
RABBITMQ_CASES = [
    ({"a": 1}, {"a": "1"}, False),
    ({"a": "1"}, {"a": 1}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": 1}, {"a": True}, False),
    ({"a": 0}, {"a": False}, False),
    ({"a": False}, {"a": False}, True),
    ({"a": "x"}, {"a": b"x"}, True),
    ({"a": b"x"}, {"a": "x"}, True),
    ({"a": 2**40}, {"a": 2**40}, True),
    ({"a": 5}, {"a": 2**40}, False),
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": 1.0}, {"a": 1}, True),
    ({"a": Decimal("1")}, {"a": 1}, False),
    ({"a": Decimal("1.5")}, {"a": Decimal("1.5")}, True),
    ({"a": Decimal("1.0")}, {"a": Decimal("1.00")}, False),
    ({"a": 1577836800}, {"a": TS}, True),
    ({"a": None}, {"a": "anything"}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": "v"}, {"a": None}, False),
    ({"a": None}, {}, False),
    ({}, {}, True),
    ({"x-match": "any"}, {"a": 1}, False),
    ({"x-match": "all"}, {}, True),
    ({"x-match": "any", "x-foo": "y"}, {"x-foo": "y"}, False),
    ({"x-match": "any-with-x", "x-foo": "y"}, {"x-foo": "y"}, True),
    ({"x-match": "all-with-x", "x-foo": "y", "a": 1}, {"a": 1}, False),
    ({"x-match": "all", "x-foo": "y", "a": 1}, {"a": 1}, True),
    ({"x-match": "all-with-x", "x-match2": "y"}, {"x-match": "all-with-x", "x-match2": "y"}, True),
    ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
    ({"a": {"b": 1}}, {"a": {"b": 1}}, True),
    ({"a": [1, "x"]}, {"a": [1, "x"]}, True),
    ({"a": {"b": 1}}, {"a": {"b": "1"}}, False),
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 2, "b": 1}}, False),
    ({"a": {}}, {"a": []}, True),
    ({"a": 1, "b": 2}, {"a": 1}, False),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 0, "b": 2}, True),
]

MORE_CASES = [
    ({"a": 1}, None, False),
    ({}, None, True),
    ({"x-match": "any", "a": 1}, None, False),
    ({"x-match": "bogus", "a": 1, "b": 2}, {"a": 1}, False),  # unknown mode is "all"
    ({"x-match": b"any", "a": 1, "b": 2}, {"a": 1}, False),  # not a long string: "all"
    ({"a": {"b": 1}}, {"a": {"b": 1.0}}, False),  # nested values keep their type
    ({"a": [1]}, {"a": [True]}, False),
    ({"a": "x"}, {"a": bytearray(b"x")}, True),
    ({"a": 1577836800}, {"a": datetime(2020, 1, 1)}, True),  # naive timestamp is UTC
    ({"a": TS}, {"a": TS}, True),
    ({"x-match": "all-with-x", "x-a": None}, {"x-a": 0}, True),
    ({"x-match": "any", "a": None, "b": 1}, {"a": 5}, True),
    ({"x-match": "any", "a": "v"}, {"a": None}, False),
]


@pytest.mark.parametrize("args,headers,expected", RABBITMQ_CASES + MORE_CASES)
def test_known_cases(args, headers, expected):
    assert headers_match(args, headers) is expected
    table = HeadersTable()
    q = Destination("queue", "q")
    table.bind(q, "", args)
    assert (q in table.route(["rk"], headers)) is expected


def oracle_equal(pattern, value):
    numeric = (int, float)
    if isinstance(pattern, bool) or isinstance(value, bool):
        return type(pattern) is type(value) and pattern == value
    if isinstance(pattern, numeric) and isinstance(value, numeric):
        return pattern == value
    if isinstance(pattern, (str, bytes)) and isinstance(value, (str, bytes)):
        as_bytes = [v.encode() if isinstance(v, str) else v for v in (pattern, value)]
        return as_bytes[0] == as_bytes[1]
    return False


def oracle(args, headers):
    mode = args.get("x-match")
    if mode not in ("all", "any", "all-with-x", "any-with-x"):
        mode = "all"
    keys = [k for k in args
            if k != "x-match" and (mode.endswith("-with-x") or not k.startswith("x-"))]
    hits = [k in headers and (args[k] is None or oracle_equal(args[k], headers[k]))
            for k in keys]
    return all(hits) if mode.startswith("all") else any(hits)


keys = st.sampled_from(["a", "b", "c", "x-a", "x-match"])
values = st.sampled_from([None, 0, 1, 2, True, False, 1.0, "1", "a", b"a", ""])
modes = st.sampled_from([None, "all", "any", "all-with-x", "any-with-x", "other"])


@st.composite
def binding_args(draw):
    args = draw(st.dictionaries(keys.filter(lambda k: k != "x-match"), values, max_size=4))
    mode = draw(modes)
    if mode is not None:
        args["x-match"] = mode
    return args


header_tables = st.one_of(st.none(), st.dictionaries(keys, values, max_size=5))


@settings(max_examples=1000)
@given(binding_args(), header_tables)
def test_headers_match_agrees_with_oracle(args, headers):
    assert headers_match(args, headers) == oracle(args, headers or {})
