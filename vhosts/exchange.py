"""An exchange: its declaration, its binding table (from `routing`) and the
definition of the policy that applies to it (vhosts.policies)."""
from __future__ import annotations

import routing
from vhosts.delayed import DELAYED
from vhosts.stats import ExchangeStats

# The exchanges every virtual host starts with, as RabbitMQ predeclares them.
PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
# The firehose's exchange (RabbitMQ's trace_on): predeclared too, internal,
# so only the broker publishes to it (vhosts.firehose).
TRACE_EXCHANGE = "amq.rabbitmq.trace"


class Exchange:
    __slots__ = ("name", "type", "durable", "auto_delete", "internal", "arguments", "table", "builtin", "policy",
                 "stats")

    def __init__(
        self,
        name: str,
        type: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
        builtin: bool = False,
    ) -> None:
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        # A delayed-message exchange routes as its x-delayed-type (vhosts.delayed).
        self.table = routing.table_for(self.arguments["x-delayed-type"] if type == DELAYED else type)
        self.builtin = builtin
        self.policy: dict | None = None
        self.stats = ExchangeStats()

    @property
    def alternate_exchange(self) -> str | None:
        """The argument, else the policy's (RabbitMQ: the argument wins)."""
        value = self.arguments.get("alternate-exchange")
        if isinstance(value, str):
            return value
        return self.policy.get("alternate-exchange") if self.policy is not None else None
