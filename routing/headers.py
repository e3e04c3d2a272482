"""Headers exchange: a binding's arguments are a pattern over the message's headers table.

Semantics (RabbitMQ's rabbit_exchange_type_headers, checked against RabbitMQ 3.10 with pika):
- ``x-match`` picks the mode: "all" (also when absent or not one of the four known strings;
  the broker validates it at bind time), "any", "all-with-x", "any-with-x".  The ``x-match``
  entry itself never takes part.  In "all"/"any" every other argument whose key starts with
  "x-" is ignored too; in the -with-x modes those take part.
- "all": every remaining argument is matched (so none at all matches every message);
  "any": at least one is (so none at all matches nothing).
- An argument whose value is void (None) matches when the header is present, whatever its value.
- Otherwise values match as Erlang's ``==`` compares the decoded field values: the AMQP type
  tag is dropped at the top level but the Erlang representation remains.  Hence:
  ints and floats compare numerically (1 matches 1.0); a timestamp is its integer of seconds
  (matches an int); booleans are atoms (True matches neither 1 nor "true"); long strings and
  byte arrays are both binaries (str "x" matches bytes b"x"); "1" does not match 1; decimals are
  (scale, value) pairs (Decimal("1.0") matches neither 1 nor Decimal("1.00")); a void header
  matches no non-void argument.  Nested tables and arrays keep their type tags and order, so
  inside them 1 does not match 1.0 (see table.freeze); an empty table equals an empty array.
  Integer widths (short/long/...) are invisible after decoding, where RabbitMQ tells them apart
  inside nested tables only.
- Routing keys are ignored; headers None is an empty table.

Invariants: ``_rules`` holds one compiled _Rule per live binding, keyed by its BindingId;
``route`` is a scan over them (as in RabbitMQ), skipping rules whose destination already matched.
"""

import calendar
from collections.abc import Mapping, Sequence
from datetime import datetime

from .destination import Destination
from .table import BindingId, BindingTable, freeze

_MODES = {"all": (True, False), "any": (False, False),
          "all-with-x": (True, True), "any-with-x": (False, True)}
_ABSENT = object()
_NO_HEADERS: Mapping = {}


def _erlang_image(value: object) -> object:
    """What Erlang's ``==`` sees of a top-level field value (numbers stay numbers)."""
    if isinstance(value, bool):
        return ("atom", value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return ("binary", value.encode())
    if isinstance(value, (bytes, bytearray)):
        return ("binary", bytes(value))
    if isinstance(value, datetime):
        return calendar.timegm(value.utctimetuple())  # naive means UTC, as on the wire
    if value is None:
        return ("undefined",)
    if isinstance(value, Mapping):
        return ("list", tuple((k, *freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(freeze(v) for v in value))
    return freeze(value)  # Decimal: ("Decimal", (sign, digits, exponent))


class _Rule:
    """One binding's arguments, compiled: mode and (key, void?, raw value, Erlang image)."""

    __slots__ = ("match_all", "conditions")

    def __init__(self, arguments: Mapping) -> None:
        mode = arguments.get("x-match")
        match_all, with_x = _MODES.get(mode, (True, False)) if type(mode) is str else (True, False)
        self.match_all = match_all
        self.conditions = tuple(
            (key, value is None, value, _erlang_image(value))
            for key, value in arguments.items()
            if key != "x-match" and (with_x or not key.startswith("x-"))
        )

    def matches(self, headers: Mapping) -> bool:
        for key, void, value, image in self.conditions:
            found = headers.get(key, _ABSENT)
            if found is _ABSENT:
                hit = False
            elif void:
                hit = True
            elif type(found) is type(value) and (type(value) is str or type(value) is int):
                hit = found == value  # fast path for the common same-type case
            else:
                hit = _erlang_image(found) == image
            if hit != self.match_all:
                return hit  # "any" found a hit, or "all" found a miss
        return self.match_all


def headers_match(binding_args: Mapping, headers: Mapping | None) -> bool:
    """Would a headers binding with ``binding_args`` take a message with ``headers``?"""
    return _Rule(binding_args).matches(headers or _NO_HEADERS)


class HeadersTable(BindingTable):
    __slots__ = ("_rules",)

    def __init__(self) -> None:
        super().__init__()
        self._rules: dict[BindingId, tuple[Destination, _Rule]] = {}

    def _attach(self, bid: BindingId, arguments: dict) -> None:
        self._rules[bid] = (bid[0], _Rule(arguments))

    def _detach(self, bid: BindingId) -> None:
        del self._rules[bid]

    def route(self, routing_keys: Sequence[str], headers: Mapping | None) -> set[Destination]:
        table = headers or _NO_HEADERS
        found: set[Destination] = set()
        for dest, rule in self._rules.values():
            if dest not in found and rule.matches(table):
                found.add(dest)
        return found
