"""Random bind/unbind/remove_destination sequences against a brute-force model of each table."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import Destination, headers_match, table_for, topic_matches

DESTS = [Destination("queue", "q1"), Destination("queue", "q2"), Destination("exchange", "x")]
KEYS = {
    "direct": ["", "a", "b", "a.b"],
    "fanout": ["", "a"],
    "topic": ["", "a", "a.b", "#", "*", "a.#", "#.b", "*.*", "a..b", "#.#"],
    "headers": ["", "k"],
}
ARGS = [None, {"h": 1}, {"x-match": "any", "h": 1, "g": "v"}, {"g": None}]
ROUTING = ["", "a", "b", "a.b", "a.c.b", ".", "a..b"]
HEADERS = [None, {}, {"h": 1}, {"g": "v"}, {"h": 2, "g": 0}, {"h": True}]


def model_route(kind, bindings, routing_keys, headers):
    def hit(key, args):
        if kind == "direct":
            return key in routing_keys
        if kind == "topic":
            return any(topic_matches(key, rk) for rk in routing_keys)
        if kind == "headers":
            return headers_match(args or {}, headers)
        return True
    return {dest for dest, key, args in bindings if hit(key, dict(args))}


def ops(kind):
    binding = st.tuples(st.sampled_from(DESTS), st.sampled_from(KEYS[kind]),
                        st.sampled_from(range(len(ARGS))))
    return st.lists(st.one_of(
        st.tuples(st.just("bind"), binding),
        st.tuples(st.just("unbind"), binding),
        st.tuples(st.just("remove"), st.sampled_from(DESTS))), max_size=40)


def check(kind, table, model):
    assert len(table) == len(model)
    listed = {(d, k, tuple(sorted(a.items()))) for d, k, a in table.bindings()}
    assert listed == model
    for dest in DESTS:
        assert table.has_destination(dest) == any(d == dest for d, _, _ in model)
    for rk in ROUTING:
        for headers in HEADERS:
            for keys in ([rk], [rk, "b"]):
                assert table.route(keys, headers) == model_route(kind, model, keys, headers)


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_table_matches_model(kind, data):
    table = table_for(kind)
    model: set = set()
    for op, arg in data.draw(ops(kind)):
        if op == "remove":
            removed = {b for b in model if b[0] == arg}
            assert table.remove_destination(arg) == len(removed)
            model -= removed
        else:
            dest, key, i = arg
            entry = (dest, key, tuple(sorted((ARGS[i] or {}).items())))
            if op == "bind":
                assert table.bind(dest, key, ARGS[i]) == (entry not in model)
                model.add(entry)
            else:
                assert table.unbind(dest, key, ARGS[i]) == (entry in model)
                model.discard(entry)
        check(kind, table, model)
