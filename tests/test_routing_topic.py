"""Topic matching: RabbitMQ's word rules, the trie against oracles, trie pruning."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing import Destination, TopicTable, topic_matches


def regex_oracle(binding_key: str, routing_key: str) -> bool:
    """Each routing word becomes "word\\0"; ``*`` is one such token, ``#`` any number."""
    words = routing_key.split(".") if routing_key else []
    subject = "".join(word + "\0" for word in words)
    parts = binding_key.split(".") if binding_key else []
    pattern = "".join(
        r"(?:[^\0]*\0)*" if p == "#" else r"[^\0]*\0" if p == "*" else re.escape(p) + "\0"
        for p in parts)
    return re.fullmatch(pattern, subject) is not None


# Every case here was also checked against RabbitMQ 3.10 with pika (publish, basic.get).
RABBITMQ_CASES = [
    ("#.#", "", True),
    ("#.*", "", False),
    ("*.#", "", False),
    ("*", "", False),
    ("", "", True),
    ("#", ".", True),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.*", "a.", True),
    ("a.*.b", "a..b", True),
    ("*.*", ".", True),
    ("#.a.#", "a", True),
    ("a#", "a#", True),
    ("a*", "ab", False),
    ("#.#.b", "b", True),
]

MORE_CASES = [
    ("#", "", True),
    ("#", "a.b.c", True),
    ("", "a", False),
    ("a", "", False),
    ("a", "a.", False),
    ("a.", "a.", True),
    ("a.", "a", False),
    ("*", ".", False),
    ("*.*", "a..b", False),
    ("*.*.*", "a..b", True),
    ("a.#", "a", True),
    ("a.#", "ab", False),
    ("#.b", "a.b.b", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("a.*.#", "a", False),
    ("a.*", "a.*", True),  # a literal "*" word is still a word
    ("a.b", "a.*", False),
]


@pytest.mark.parametrize("binding_key,routing_key,expected", RABBITMQ_CASES + MORE_CASES)
def test_known_cases(binding_key, routing_key, expected):
    assert topic_matches(binding_key, routing_key) is expected
    assert regex_oracle(binding_key, routing_key) is expected
    table = TopicTable()
    q = Destination("queue", "q")
    table.bind(q, binding_key, None)
    assert (q in table.route([routing_key], None)) is expected


binding_word = st.sampled_from(["a", "b", "", "*", "#"])
routing_word = st.sampled_from(["a", "b", "", "*", "#", "ab"])
binding_keys = st.lists(binding_word, max_size=6).map(".".join)
routing_keys = st.lists(routing_word, max_size=7).map(".".join)


@settings(max_examples=1000)
@given(binding_keys, routing_keys)
def test_topic_matches_agrees_with_regex(binding_key, routing_key):
    assert topic_matches(binding_key, routing_key) == regex_oracle(binding_key, routing_key)


@settings(max_examples=300)
@given(st.lists(binding_keys, max_size=25), st.lists(routing_keys, min_size=1, max_size=3))
def test_trie_agrees_with_oracle(keys, routing):
    table = TopicTable()
    for i, key in enumerate(keys):
        table.bind(Destination("queue", str(i)), key, None)
    expected = {Destination("queue", str(i)) for i, key in enumerate(keys)
                if any(regex_oracle(key, rk) for rk in routing)}
    assert table.route(routing, None) == expected


@settings(max_examples=200)
@given(st.lists(binding_keys, min_size=1, max_size=20), st.data())
def test_unbind_prunes_trie_to_empty(keys, data):
    table = TopicTable()
    bound = [(Destination("queue", str(i % 3)), key) for i, key in enumerate(keys)]
    for dest, key in bound:
        table.bind(dest, key, None)
    order = data.draw(st.permutations(bound))
    for dest, key in order:
        table.unbind(dest, key, None)
    root = table._root
    assert len(table) == 0
    assert not root.children and root.hash is None and not root.dests


def test_unbind_keeps_sibling_patterns():
    table = TopicTable()
    q1, q2, q3 = (Destination("queue", n) for n in ("1", "2", "3"))
    table.bind(q1, "a.#", None)
    table.bind(q2, "a.#.b", None)
    table.bind(q3, "a", None)
    table.unbind(q1, "a.#", None)
    assert table.route(["a.x.b"], None) == {q2}
    assert table.route(["a"], None) == {q3}
    table.unbind(q3, "a", None)
    assert table.route(["a.b"], None) == {q2}
    assert table.route(["a"], None) == set()


def test_many_bindings_only_matching_ones_route():
    table = TopicTable()
    for i in range(5000):
        table.bind(Destination("queue", f"q{i}"), f"orders.{i}.*", None)
    table.bind(Destination("queue", "all"), "orders.#", None)
    assert table.route(["orders.42.created"], None) == {
        Destination("queue", "q42"), Destination("queue", "all")}
