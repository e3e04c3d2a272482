"""The exchange types this broker knows, by their AMQP names.

Invariant: EXCHANGE_TYPES is exactly the key set of _TABLES; ``table_for`` always returns a
fresh, empty table (tables are never shared between exchanges).
"""

from .direct import DirectTable
from .fanout import FanoutTable
from .headers import HeadersTable
from .topic import TopicTable

_TABLES = {"direct": DirectTable, "fanout": FanoutTable,
           "topic": TopicTable, "headers": HeadersTable}

EXCHANGE_TYPES: frozenset[str] = frozenset(_TABLES)


def table_for(exchange_type: str) -> DirectTable | FanoutTable | TopicTable | HeadersTable:
    """A new empty binding table for ``exchange_type``; KeyError if the type is unknown."""
    return _TABLES[exchange_type]()
