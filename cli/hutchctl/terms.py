"""Values as rabbitmqctl prints them.

rabbitmqctl shows Erlang terms: in table and CSV output a field table is
`[{"key",value},...]`, user tags are a list of atoms `[administrator]`, strings
inside a term are quoted and a missing value is empty. Its JSON output writes a
field table as `[[key, type, value], ...]`. The HTTP API hands us plain JSON,
so the two wrapper types below carry "this is a field table" and "these are
atoms" from the command that knows to the formatter. The AMQP type of an
argument is not in the API's answer; it is inferred the way a client library
encodes the value (an integer that fits 32 bits is a signedint).
"""
from __future__ import annotations

import json

from vhosts.errors import field_type


class FieldTable(dict):
    """An AMQP field table (queue, binding or consumer arguments)."""

    __slots__ = ()


class Atoms(tuple):
    """A list of Erlang atoms (user or vhost tags)."""

    __slots__ = ()


def text(value) -> str:
    """`value` as one cell of table or CSV output."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return _term(value)


def _term(value) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Atoms):
        return "[" + ", ".join(value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join("{%s,%s}" % (_term(k), _term(v)) for k, v in value.items()) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_term(item) for item in value) + "]"
    return str(value)


def json_value(value):
    """`value` as one field of rabbitmqctl's JSON output."""
    if value is None:
        return ""
    if isinstance(value, FieldTable):
        return _typed_table(value)
    if isinstance(value, Atoms):
        return list(value)
    return value


def _typed(value):
    if isinstance(value, dict):
        return _typed_table(value)
    if isinstance(value, list):
        # rabbitmqctl turns an array's [{type, value}] pairs into a map keyed by type
        return {field_type(item): _typed(item) for item in value}
    return value


def _typed_table(table: dict) -> list:
    return [[key, field_type(value), _typed(value)] for key, value in table.items()]
