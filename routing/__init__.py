"""Pure routing: binding tables per exchange type and exchange-to-exchange resolution.

Stdlib only; knows names, not queues or connections.  See each module for its invariants.
"""

from .destination import Destination
from .direct import DirectTable
from .exchange_types import EXCHANGE_TYPES, table_for
from .fanout import FanoutTable
from .headers import HeadersTable, headers_match
from .resolve import resolve
from .topic import TopicTable, topic_matches

__all__ = [
    "Destination",
    "DirectTable",
    "FanoutTable",
    "TopicTable",
    "HeadersTable",
    "table_for",
    "EXCHANGE_TYPES",
    "topic_matches",
    "headers_match",
    "resolve",
]
