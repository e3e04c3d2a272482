"""Sorting, column selection and pagination of list answers (RabbitMQ's
`sort`, `sort_reverse`, `columns`, `page`, `page_size`, `name`, `use_regex`
query parameters).

Lists stay cheap when they are long (10,000 queues): a handler may pass
domain objects with `shape` (object -> JSON) and `name_of`; a paged answer
that is not sorted, or sorted by name, is then filtered, sorted and sliced
on the names and only the page's objects are shaped. Any other sort needs
every object's JSON, as RabbitMQ's does.
"""
from __future__ import annotations

import math
import re

from amqp_server.management.errors import bad_request

MAX_PAGE_SIZE = 500


def _lookup(item: dict, dotted: str):
    value = item
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _sort_key(value):
    """Mixed types sort as RabbitMQ shows them: missing first, then by text."""
    if value is None:
        return (0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, value)
    return (2, str(value))


def _columns(items: list[dict], columns: str) -> list[dict]:
    out = []
    for item in items:
        picked: dict = {}
        for dotted in columns.split(","):
            value = _lookup(item, dotted)
            if value is None and dotted.split(".")[0] not in item:
                continue
            target = picked
            parts = dotted.split(".")
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = value
        out.append(picked)
    return out


def query_integer(query: dict, key: str, default: int, minimum: int = 1) -> int:
    """An integer query parameter (`default` when absent); a 400 with
    RabbitMQ's paging texts when it is not a number or under `minimum`."""
    text = query.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise bad_request("%s should be a number" % key) from None
    if value < minimum:
        raise bad_request("%s must be greater than %d" % (key, minimum - 1))
    return value


def _shaped(item):
    return item


def _json_name(item: dict) -> str:
    return str(item.get("name", ""))


def present(items: list, query: dict, shape=None, name_of=None):
    """The list as the query asks for it: sorted, filtered, paged, trimmed.
    `items` are JSON objects, or domain objects when `shape` and `name_of`
    are given (see the module's note)."""
    sort = query.get("sort")
    if shape is None or "page" not in query or sort not in (None, "", "name"):
        if shape is not None:
            items = [shape(item) for item in items]
        shape, name_of = _shaped, _json_name
        if sort:
            items = sorted(items, key=lambda item: _sort_key(_lookup(item, sort)))
    elif sort:
        items = sorted(items, key=name_of)
    if query.get("sort_reverse", "").lower() == "true":
        items = list(reversed(items))
    if "page" not in query:
        return _columns(items, query["columns"]) if query.get("columns") else items
    page = query_integer(query, "page", 1)
    page_size = query_integer(query, "page_size", 100)
    if page_size > MAX_PAGE_SIZE:
        raise bad_request("page_size must be less than or equal to %d" % MAX_PAGE_SIZE)
    total = len(items)
    name = query.get("name")
    if name:
        if query.get("use_regex", "").lower() == "true":
            try:
                pattern = re.compile(name)
            except re.error:
                raise bad_request("invalid regex") from None
            items = [item for item in items if pattern.search(name_of(item))]
        else:
            items = [item for item in items if name.lower() in name_of(item).lower()]
    filtered = len(items)
    page_count = max(1, math.ceil(filtered / page_size))
    if page > page_count:
        raise bad_request("page_out_of_range")
    chunk = [shape(item) for item in items[(page - 1) * page_size:page * page_size]]
    if query.get("columns"):
        chunk = _columns(chunk, query["columns"])
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": page_count, "page_size": page_size, "total_count": total}
