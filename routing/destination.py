"""Where a binding leads: a queue or another exchange, named within one vhost.

Invariant: ``kind`` is always "queue" (QUEUE) or "exchange"; a Destination is an immutable,
hashable value so it can key dicts and sit in sets shared between tables and callers.
"""

from typing import NamedTuple

QUEUE = "queue"


class Destination(NamedTuple):
    kind: str  # "queue" or "exchange"
    name: str
