"""Unit tests of the four binding tables: identity, bind/unbind, remove_destination, listing."""

from decimal import Decimal

import pytest

from routing import (EXCHANGE_TYPES, Destination, DirectTable, FanoutTable, HeadersTable,
                     TopicTable, table_for)

Q1 = Destination("queue", "q1")
Q2 = Destination("queue", "q2")
X1 = Destination("exchange", "x1")

ALL_TABLES = [DirectTable, FanoutTable, TopicTable, HeadersTable]


def test_table_for_known_and_unknown_types():
    assert EXCHANGE_TYPES == {"direct", "fanout", "topic", "headers"}
    for name, cls in zip(["direct", "fanout", "topic", "headers"], ALL_TABLES):
        table = table_for(name)
        assert type(table) is cls and len(table) == 0
        assert table_for(name) is not table
    with pytest.raises(KeyError):
        table_for("x-consistent-hash")


@pytest.mark.parametrize("cls", ALL_TABLES)
def test_binding_identity_includes_arguments(cls):
    table = cls()
    assert table.bind(Q1, "k", None) is True
    assert table.bind(Q1, "k", {}) is False  # None and {} are the same empty table
    assert table.bind(Q1, "k", {"a": 1}) is True
    assert table.bind(Q1, "k", {"a": True}) is True  # 1 and True are different arguments
    assert table.bind(Q1, "k", {"a": 1.0}) is True
    assert table.bind(Q1, "k", {"a": Decimal("1.0")}) is True
    assert table.bind(Q1, "k", {"a": Decimal("1.00")}) is True
    assert table.bind(Q1, "k", {"a": 1}) is False
    assert table.bind(Q1, "k2", {"a": 1}) is True
    assert len(table) == 7
    assert table.unbind(Q1, "k", {"a": 2}) is False
    assert table.unbind(Q2, "k", None) is False
    assert table.unbind(Q1, "k", {"a": True}) is True
    assert table.unbind(Q1, "k", {"a": True}) is False
    assert len(table) == 6


@pytest.mark.parametrize("cls", ALL_TABLES)
def test_argument_order_is_not_identity_at_top_level(cls):
    table = cls()
    assert table.bind(Q1, "k", {"a": 1, "b": {"c": 1, "d": 2}})
    assert not table.bind(Q1, "k", {"b": {"c": 1, "d": 2}, "a": 1})
    # nested tables keep their order, as in RabbitMQ
    assert table.bind(Q1, "k", {"a": 1, "b": {"d": 2, "c": 1}})
    assert table.unbind(Q1, "k", {"b": {"c": 1, "d": 2}, "a": 1})


@pytest.mark.parametrize("cls", ALL_TABLES)
def test_bindings_listing_and_copies(cls):
    table = cls()
    args = {"x-match": "any", "h": "v"}
    table.bind(Q1, "a", args)
    table.bind(X1, "b", None)
    args["h"] = "changed"  # the table kept its own copy
    listed = sorted(table.bindings(), key=lambda binding: binding[:2])
    assert listed == [(X1, "b", {}), (Q1, "a", {"x-match": "any", "h": "v"})]
    for _, _, listed_args in table.bindings():
        listed_args["junk"] = 1
    assert all("junk" not in a for _, _, a in table.bindings())


@pytest.mark.parametrize("cls", ALL_TABLES)
def test_remove_destination(cls):
    table = cls()
    table.bind(Q1, "a", None)
    table.bind(Q1, "b", None)
    table.bind(Q1, "b", {"z": 1})
    table.bind(Q2, "a", None)
    assert table.has_destination(Q1) and table.has_destination(Q2)
    assert table.remove_destination(Q1) == 3
    assert not table.has_destination(Q1)
    assert table.remove_destination(Q1) == 0
    assert len(table) == 1
    assert list(table.bindings()) == [(Q2, "a", {})]
    assert Q1 not in table.route(["a"], {}) and Q1 not in table.route(["b"], {})


def test_direct_exact_key_and_multiple_keys():
    table = DirectTable()
    table.bind(Q1, "a", None)
    table.bind(Q2, "b", None)
    table.bind(X1, "", None)
    assert table.route(["a"], None) == {Q1}
    assert table.route(["A"], None) == frozenset()
    assert table.route([""], None) == {X1}
    assert table.route(["a", "b", "c"], None) == {Q1, Q2}
    assert table.route(["a", "a"], None) == {Q1}
    assert table.route([], None) == set()


def test_direct_route_result_follows_unbind():
    table = DirectTable()
    table.bind(Q1, "a", None)
    table.bind(Q1, "a", {"v": 1})
    first = table.route(["a"], None)
    assert first == {Q1} and isinstance(first, frozenset)
    assert table.route(["a"], None) is first  # shared, no allocation per message
    table.unbind(Q1, "a", None)
    assert table.route(["a"], None) == {Q1}  # the other binding still routes
    table.bind(Q2, "a", None)
    assert table.route(["a"], None) == {Q1, Q2}
    table.unbind(Q1, "a", {"v": 1})
    assert table.route(["a"], None) == {Q2}
    table.remove_destination(Q2)
    assert table.route(["a"], None) == set()


def test_fanout_ignores_keys_and_headers():
    table = FanoutTable()
    assert table.route(["a"], None) == set()
    table.bind(Q1, "a", None)
    table.bind(Q1, "b", None)
    table.bind(X1, "", None)
    assert table.route(["zzz"], {"h": 1}) == {Q1, X1}
    assert table.route([], None) == {Q1, X1}
    table.unbind(Q1, "a", None)
    assert table.route(["a"], None) == {Q1, X1}
    table.unbind(Q1, "b", None)
    assert table.route(["a"], None) == {X1}


def test_topic_table_basics():
    table = TopicTable()
    table.bind(Q1, "stock.*.nyse", None)
    table.bind(Q2, "stock.#", None)
    table.bind(X1, "#", None)
    assert table.route(["stock.ibm.nyse"], None) == {Q1, Q2, X1}
    assert table.route(["stock"], None) == {Q2, X1}
    assert table.route(["bond"], None) == {X1}
    assert table.route(["stock.ibm.nyse", "bond"], None) == {Q1, Q2, X1}
    table.unbind(X1, "#", None)
    assert table.route(["bond"], None) == set()


def test_headers_table_ignores_keys():
    table = HeadersTable()
    table.bind(Q1, "ignored", {"a": 1})
    table.bind(Q2, "", {"x-match": "any", "a": 2, "b": 2})
    assert table.route(["whatever"], {"a": 1}) == {Q1}
    assert table.route([], {"a": 2}) == {Q2}
    assert table.route(["k"], {"a": 1, "b": 2}) == {Q1, Q2}
    assert table.route(["k"], None) == set()
    table.bind(Q1, "", {})  # empty "all" matches everything
    assert table.route(["k"], None) == {Q1}
