"""Pure parts of the management API: path splitting and route matching,
list presentation, binding properties keys, error mapping."""
from __future__ import annotations

import pytest

from amqp_server.management.errors import ApiError, from_amqp
from amqp_server.management.http import match, split_path
from amqp_server.management.listing import present
from amqp_server.management.routes import ROUTES
from amqp_server.management.shapes import properties_key
from vhosts.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, AMQPError


@pytest.mark.parametrize("raw, segments", [
    ("/api/queues/%2F/q1", ["api", "queues", "/", "q1"]),
    ("/api/queues/%2F/a%20b?columns=name", ["api", "queues", "/", "a b"]),
    ("/api/bindings/v/e/x/q/q/a.%2523", ["api", "bindings", "v", "e", "x", "q", "q", "a.%23"]),
    ("/", []),
    ("/api/", ["api"]),
])
def test_split_path_decodes_each_segment_once(raw, segments):
    assert split_path(raw) == segments


def test_routes_match_fixed_segments_before_placeholders():
    _pattern, methods, params = match(ROUTES, ["api", "users", "without-permissions"])
    assert "GET" in methods and params == {}
    _pattern, methods, params = match(ROUTES, ["api", "users", "bob"])
    assert set(methods) == {"GET", "PUT", "DELETE"} and params == {"user": "bob"}
    assert match(ROUTES, ["api", "nothing"]) == (None, None, None)


ITEMS = [{"name": "b", "n": 2, "d": {"x": 1}}, {"name": "a", "n": 10, "d": {"x": 3}}, {"name": "c", "d": {}}]


def test_present_sorts_numbers_as_numbers_and_missing_first():
    assert [i["name"] for i in present(ITEMS, {"sort": "n"})] == ["c", "b", "a"]
    assert [i["name"] for i in present(ITEMS, {"sort": "d.x", "sort_reverse": "true"})] == ["a", "b", "c"]


def test_present_columns_keep_nesting():
    assert present(ITEMS[:1], {"columns": "name,d.x"}) == [{"name": "b", "d": {"x": 1}}]


def test_present_pages_and_filters():
    page = present(ITEMS, {"page": "1", "page_size": "2", "name": "^[ab]$", "use_regex": "true", "sort": "name"})
    assert page == {"filtered_count": 2, "item_count": 2, "items": [ITEMS[1], ITEMS[0]], "page": 1,
                    "page_count": 1, "page_size": 2, "total_count": 3}
    with pytest.raises(ApiError) as info:
        present(ITEMS, {"page": "5"})
    assert (info.value.status, info.value.reason) == (400, "page_out_of_range")
    with pytest.raises(ApiError):
        present(ITEMS, {"page": "x"})


def test_properties_key():
    assert properties_key("a.#", None) == "a.%23"
    assert properties_key("", {}) == "~"
    keyed = properties_key("k", {"a": 1})
    assert keyed.startswith("k~") and keyed == properties_key("k", {"a": 1}) != properties_key("k", {"a": 2})


@pytest.mark.parametrize("code, text, status, body", [
    (ACCESS_REFUSED, "no", 401, {"error": "not_authorised", "reason": "Access refused."}),
    (NOT_FOUND, "no queue 'q' in vhost '/'", 404, {"error": "not_found", "reason": "no queue 'q' in vhost '/'"}),
    (PRECONDITION_FAILED, "queue 'q' in vhost '/' in use", 400,
     {"error": "bad_request", "reason": "queue 'q' in vhost '/' in use"}),
])
def test_domain_errors_as_rabbitmq_answers(code, text, status, body):
    error = from_amqp(AMQPError(code, text))
    assert (error.status, error.body()) == (status, body)
