"""Message counters for the management API and metrics (RabbitMQ's message_stats).

Plain integer totals, bumped on the hot path with one increment each; rates
are computed by whoever samples them (amqp_server.management.rates), so
nothing here allocates or schedules per message. A queue and its vhost each
keep one `MessageStats`; the broker keeps one `Churn`.
"""
from __future__ import annotations

# RabbitMQ's message_stats keys these counters report under.
FIELDS = (
    "publish",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "redeliver",
    "ack",
    "confirm",
    "return_unroutable",
    "drop_unroutable",
)


class MessageStats:
    __slots__ = FIELDS

    def __init__(self) -> None:
        for name in FIELDS:
            setattr(self, name, 0)

    @property
    def deliver_get(self) -> int:
        """RabbitMQ's sum of every way a message left a queue for a client."""
        return self.deliver + self.deliver_no_ack + self.get + self.get_no_ack

    def totals(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in FIELDS}
        out["deliver_get"] = self.deliver_get
        return out


CHURN_FIELDS = (
    "connection_created",
    "connection_closed",
    "channel_created",
    "channel_closed",
    "queue_declared",
    "queue_created",
    "queue_deleted",
)


class Churn:
    """How many connections, channels and queues came and went (RabbitMQ's
    churn_rates); one per broker, bumped when they open or close."""

    __slots__ = CHURN_FIELDS

    def __init__(self) -> None:
        for name in CHURN_FIELDS:
            setattr(self, name, 0)

    def totals(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CHURN_FIELDS}
