"""A consumer: one subscription of one channel to one queue.

The channel it belongs to is a port (`ConsumerChannel`): the domain asks it
whether it may take another message and hands it deliveries, and never learns
about frames.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from storage import Message, QueueEntry
    from vhosts.queue import Queue


class ConsumerChannel(Protocol):
    output_blocked: bool  # held back by its connection's output only

    def can_deliver(self, consumer: "Consumer") -> bool: ...

    def deliver(self, consumer: "Consumer", queue: "Queue", entry: "QueueEntry") -> None: ...

    # A message just published, to a no-ack consumer that can take it now, with no queue entry.
    def deliver_fresh(self, consumer: "Consumer", queue: "Queue", message: "Message") -> None: ...

    def consumer_cancelled(self, consumer: "Consumer") -> None: ...


class Consumer:
    __slots__ = ("tag", "queue", "channel", "no_ack", "exclusive", "prefetch_count", "unacked", "arguments",
                 "priority", "remote_id")

    def __init__(
        self,
        tag: str,
        queue: "Queue",
        channel: ConsumerChannel,
        no_ack: bool,
        exclusive: bool,
        prefetch_count: int,
        arguments: dict,
        priority: int = 0,
    ) -> None:
        self.tag = tag
        self.queue = queue
        self.channel = channel
        self.no_ack = no_ack
        self.exclusive = exclusive
        # Per-consumer limit (basic.qos global=false, RabbitMQ 3.3+ semantics);
        # 0 = unlimited. `unacked` counts this consumer's outstanding deliveries.
        self.prefetch_count = prefetch_count
        self.unacked = 0
        self.arguments = arguments
        # x-priority: higher-priority consumers are served first (see vhosts.queue).
        self.priority = priority
        # Its id at the shard that owns its queue, when another does (amqp_server.shards.port).
        self.remote_id = 0
