"""Direct exchange: a message goes to the destinations bound with exactly its routing key.

Invariants:
- ``_by_key[k][d]`` is the number of live bindings (d, k, any arguments); entries at zero are
  deleted, and a key with no destinations has no entry.
- ``_frozen[k]``, when present, equals ``frozenset(_by_key[k])``; every bind/unbind on ``k``
  drops it, so it is rebuilt lazily on the next route and never goes stale.

``route`` with one key returns that shared frozenset (no allocation on the hot path); callers
must treat results as read-only, which a frozenset enforces.
"""

from collections.abc import Mapping, Sequence

from .destination import Destination
from .table import BindingId, BindingTable

_NOTHING: frozenset = frozenset()


class DirectTable(BindingTable):
    __slots__ = ("_by_key", "_frozen")

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, dict[Destination, int]] = {}
        self._frozen: dict[str, frozenset] = {}

    def _attach(self, bid: BindingId, arguments: dict) -> None:
        dest, key, _ = bid
        counts = self._by_key.setdefault(key, {})
        counts[dest] = counts.get(dest, 0) + 1
        self._frozen.pop(key, None)

    def _detach(self, bid: BindingId) -> None:
        dest, key, _ = bid
        counts = self._by_key[key]
        if counts[dest] > 1:
            counts[dest] -= 1
            return
        del counts[dest]
        if not counts:
            del self._by_key[key]
        self._frozen.pop(key, None)

    def _match(self, key: str) -> frozenset:
        found = self._frozen.get(key)
        if found is None:
            counts = self._by_key.get(key)
            if counts is None:
                return _NOTHING
            found = self._frozen[key] = frozenset(counts)
        return found

    def route(self, routing_keys: Sequence[str], headers: Mapping | None) -> frozenset | set:
        if len(routing_keys) == 1:
            return self._match(routing_keys[0])
        found: set[Destination] = set()
        for key in routing_keys:
            found |= self._match(key)
        return found
