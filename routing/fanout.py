"""Fanout exchange: every message goes to every bound destination; keys and headers are ignored.

Invariants:
- ``_counts[d]`` is the number of live bindings to ``d`` (any key, any arguments), never zero.
- ``_frozen`` is None or ``frozenset(_counts)``; every change that adds or removes a
  destination resets it, so it is rebuilt lazily on the next route and never goes stale.

``route`` returns that shared frozenset; callers must treat it as read-only.
"""

from collections.abc import Mapping, Sequence

from .destination import Destination
from .table import BindingId, BindingTable


class FanoutTable(BindingTable):
    __slots__ = ("_counts", "_frozen")

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[Destination, int] = {}
        self._frozen: frozenset | None = frozenset()

    def _attach(self, bid: BindingId, arguments: dict) -> None:
        dest = bid[0]
        count = self._counts.get(dest, 0)
        self._counts[dest] = count + 1
        if not count:
            self._frozen = None

    def _detach(self, bid: BindingId) -> None:
        dest = bid[0]
        count = self._counts[dest]
        if count > 1:
            self._counts[dest] = count - 1
        else:
            del self._counts[dest]
            self._frozen = None

    def route(self, routing_keys: Sequence[str], headers: Mapping | None) -> frozenset:
        found = self._frozen
        if found is None:
            found = self._frozen = frozenset(self._counts)
        return found
