"""Binding identity and bookkeeping shared by the four exchange-type tables.

A binding is identified by (destination, binding key, arguments), as in RabbitMQ: the same
destination and key bound twice with different arguments are two bindings.  Arguments are
compared as AMQP field tables: top-level key order does not matter (RabbitMQ sorts the table),
nested tables keep their order, and values compare with their type (1, 1.0 and True are three
different arguments; so are Decimal("1.0") and Decimal("1.00")).  ``None`` and ``{}`` are the
same (an absent table is an empty one).

Invariants:
- ``_arguments`` maps every live BindingId to a private copy of its arguments, nothing else;
  ``len(table)`` is its size.
- ``_by_destination[d]`` is the non-empty set of live BindingIds leading to ``d``; a destination
  with no bindings has no entry (so ``has_destination`` is a dict lookup).
- A subclass's routing index changes only in ``_attach``/``_detach``, called exactly once per
  binding added or removed, so the index always describes exactly the live bindings.
"""

from collections.abc import Iterator, Mapping
from decimal import Decimal

from .destination import Destination

# (destination, binding key, frozen arguments)
BindingId = tuple[Destination, str, tuple]


def freeze(value: object) -> tuple:
    """A hashable, type-exact image of one decoded AMQP field value.

    Mirrors how Erlang compares a field inside a table: its type tag and its value.  Tables
    become ("table", ((key, tag, value), ...)) in their own order, arrays ("array", ((tag,
    value), ...)).  Integer and float widths are already erased by the decoder, so they are
    indistinguishable here.
    """
    if isinstance(value, Mapping):
        return ("table", tuple((k, *freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(freeze(v) for v in value))
    if isinstance(value, Decimal):
        return ("Decimal", value.as_tuple())
    if isinstance(value, bytearray):
        return (type(value).__name__, bytes(value))
    return (type(value).__name__, value)


def freeze_arguments(arguments: Mapping) -> tuple:
    """Identity of a binding's argument table: sorted by key at the top level only."""
    return tuple(sorted((k, *freeze(v)) for k, v in arguments.items()))


class BindingTable:
    """Common bind/unbind/listing logic; subclasses add ``route`` and the two index hooks."""

    __slots__ = ("_arguments", "_by_destination", "version")

    def __init__(self) -> None:
        self._arguments: dict[BindingId, dict] = {}
        self._by_destination: dict[Destination, set[BindingId]] = {}
        # Bumped by every change: a reader that keeps a copy (a federation
        # link mirroring the bindings upstream) knows when to look again.
        self.version = 0

    def bind(self, dest: Destination, binding_key: str, arguments: Mapping | None) -> bool:
        """Add a binding; False (and no change) if that exact binding already exists."""
        args = dict(arguments) if arguments else {}
        bid = (dest, binding_key, freeze_arguments(args))
        if bid in self._arguments:
            return False
        self._arguments[bid] = args
        self._by_destination.setdefault(dest, set()).add(bid)
        self._attach(bid, args)
        self.version += 1
        return True

    def unbind(self, dest: Destination, binding_key: str, arguments: Mapping | None) -> bool:
        """Remove a binding; False (and no change) if it does not exist."""
        bid = (dest, binding_key, freeze_arguments(arguments or {}))
        if self._arguments.pop(bid, None) is None:
            return False
        same_dest = self._by_destination[dest]
        same_dest.discard(bid)
        if not same_dest:
            del self._by_destination[dest]
        self._detach(bid)
        self.version += 1
        return True

    def remove_destination(self, dest: Destination) -> int:
        """Drop every binding leading to ``dest``; returns how many there were."""
        bids = self._by_destination.pop(dest, ())
        for bid in bids:
            del self._arguments[bid]
            self._detach(bid)
        if bids:
            self.version += 1
        return len(bids)

    def bindings(self) -> Iterator[tuple[Destination, str, dict]]:
        """Every binding as (destination, key, copy of arguments)."""
        for (dest, key, _), args in self._arguments.items():
            yield dest, key, dict(args)

    def has_destination(self, dest: Destination) -> bool:
        return dest in self._by_destination

    def has_binding(self, dest: Destination, binding_key: str, arguments: Mapping | None) -> bool:
        return (dest, binding_key, freeze_arguments(arguments or {})) in self._arguments

    def __len__(self) -> int:
        return len(self._arguments)

    def _attach(self, bid: BindingId, arguments: dict) -> None:
        raise NotImplementedError

    def _detach(self, bid: BindingId) -> None:
        raise NotImplementedError
