"""From a publish on one exchange to the set of queues it reaches (rabbit_exchange:route1).

A worklist of exchanges starts at ``source``; ``seen`` holds every exchange ever put on it,
starting with ``source``, so each exchange is routed at most once and cycles of exchange
bindings or alternate exchanges terminate.  For each exchange taken off the list:
- a missing exchange (``exchange(name)`` is None) contributes nothing;
- its table's matches: queues join the result, exchanges not yet seen join the worklist;
- only when the matches are empty (no queue and no exchange, even one already seen or since
  deleted) does its alternate exchange, if set and not yet seen, join the worklist.
The result does not depend on the worklist order: what an exchange contributes depends only on
its own table and the message.  The default exchange ("") is the caller's business.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from .destination import QUEUE


class ExchangeView(Protocol):
    table: object  # one of the *Table classes; needs route(routing_keys, headers)
    alternate_exchange: str | None


def resolve(source: str, routing_keys: Sequence[str], headers: Mapping | None,
            exchange: Callable[[str], ExchangeView | None]) -> set[str]:
    queues: set[str] = set()
    seen = {source}
    work = [source]
    while work:
        found = exchange(work.pop())
        if found is None:
            continue
        dests = found.table.route(routing_keys, headers)
        if not dests:
            alternate = found.alternate_exchange
            if alternate is not None and alternate not in seen:
                seen.add(alternate)
                work.append(alternate)
            continue
        for kind, name in dests:
            if kind == QUEUE:
                queues.add(name)
            elif name not in seen:
                seen.add(name)
                work.append(name)
    return queues
