"""Message counters for the management API and metrics (RabbitMQ's message_stats).

Plain integer totals, bumped on the hot path with one increment each; rates
are computed by whoever samples them (amqp_server.management.rates), so
nothing here allocates or schedules per message. A queue and an AMQP channel
each keep one `MessageStats`, an exchange one `ExchangeStats`, a vhost one
`VhostStats`; the broker keeps one `Churn`.

No event is counted twice for the same object: a vhost's totals are *derived*
when read (`VhostStats.totals`), from its exchanges' `publish_in` and its live
channels' counters, plus its own counters, which hold what MQTT sessions and
the management API count directly and what deleted exchanges and closed
channels had counted (folded in as they go). So a delivery costs the queue's
and the channel's increments and a publish the exchange's and the channel's,
as before these objects had stats of their own (see docs/management.md).
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


class ExchangeStats:
    """An exchange's RabbitMQ `publish_in` (messages published to it) and
    `publish_out` (copies it routed to queues, through exchange-to-exchange
    bindings and its alternate exchange too; as RabbitMQ 3.10 counts it, a
    publish to the default exchange with one routing key counts one even
    when no queue has that name).
    `publish_out` is derived as `publish_in + routed_beyond_one`, the latter
    counting only publishes that went to other than one queue (by n - 1),
    so the commonest publish, to one queue, costs one increment."""

    __slots__ = ("publish_in", "routed_beyond_one")

    def __init__(self) -> None:
        self.publish_in = 0
        self.routed_beyond_one = 0

    @property
    def publish_out(self) -> int:
        return self.publish_in + self.routed_beyond_one

    def fold(self, other: "ExchangeStats") -> None:
        """Add `other`'s counts (an exchange being deleted) to these."""
        self.publish_in += other.publish_in
        self.routed_beyond_one += other.routed_beyond_one


class VhostStats(MessageStats):
    """A vhost's counters. Its own slots count what no channel or exchange
    counts (MQTT deliveries and acks, the API's gets, unroutable API
    publishes) plus what closed channels had counted (`retire`); `totals`
    adds its live channels' counters (`channels`, kept by the AMQP front
    end: `attach` when a channel opens, `retire` when it goes) and, for
    `publish`, its exchanges' `publish_in` (`exchanges()`, the default one
    and deleted ones included)."""

    __slots__ = ("channels", "exchanges")

    def __init__(self, exchanges) -> None:
        super().__init__()
        self.channels: set[MessageStats] = set()
        self.exchanges = exchanges  # () -> iterable of ExchangeStats

    def attach(self, channel: MessageStats) -> None:
        self.channels.add(channel)

    def retire(self, channel: MessageStats) -> None:
        """A channel closed: its counts become the vhost's own (once)."""
        if channel in self.channels:
            self.channels.discard(channel)
            for name in CHANNEL_FIELDS:
                setattr(self, name, getattr(self, name) + getattr(channel, name))

    def totals(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in FIELDS}
        for channel in self.channels:
            for name in CHANNEL_FIELDS:
                out[name] += getattr(channel, name)
        out["publish"] += sum(x.publish_in for x in self.exchanges())
        out["deliver_get"] = out["deliver"] + out["deliver_no_ack"] + out["get"] + out["get_no_ack"]
        return out


# What a channel counts into its vhost's totals: everything but `publish`,
# which the vhost takes from its exchanges (every publish goes to one).
CHANNEL_FIELDS = tuple(name for name in FIELDS if name != "publish")


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
