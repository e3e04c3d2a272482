"""The x-delayed-message exchange type (RabbitMQ's community plugin
rabbitmq_delayed_message_exchange): an exchange that routes as its
`x-delayed-type` does, except that a message published to it with a
positive `x-delay` header (milliseconds, at most 2^32-1) is held and routed
only once the delay has passed.

Theory of operation:
- `Delayer` (one per vhost) keeps the held messages in a heap ordered by
  (due time, arrival), and one timer, set for the earliest due time: never a
  task or timer per message. When it fires, every message due is routed by
  its exchange (if the exchange still exists; otherwise it is dropped, as
  the plugin drops it) and enqueued.
- As the plugin: a delayed publish reaches no queue at publish time, so a
  mandatory one is returned with NO_ROUTE at once, unless the exchange has an
  alternate exchange: that one routes it at once (RabbitMQ sends a message
  its exchange routes nowhere there). The delivered message carries `x-delay`
  negated (signedint), so a consumer can tell it was delayed and a second
  delayed exchange does not delay it again.
- Durability: a persistent message published to a durable delayed exchange
  is written to the vhost's `DelayedStore` (a publisher confirm waits for
  that) and removed from it once enqueued (the removal goes through the
  same writer after the queues' own records, so a crash in between leaves
  it in both places, never in neither). At start `recover` schedules what
  the store still holds; messages overdue by then go out at once. Due times
  are wall-clock milliseconds, so a delay also runs while the broker is
  down.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from decimal import Decimal
from typing import Callable

from storage import Message
from vhosts.errors import AMQPError, COMMAND_INVALID, PRECONDITION_FAILED

DELAYED = "x-delayed-message"
MAX_DELAY = 4294967295  # the plugin's limit (Erlang's maximum timer)


def check_delayed_type(arguments: dict, known_types) -> None:
    """A new delayed exchange's x-delayed-type, validated as the plugin does."""
    delayed_type = arguments.get("x-delayed-type")
    if not isinstance(delayed_type, str) or delayed_type == DELAYED:
        raise AMQPError(PRECONDITION_FAILED, "Invalid argument, 'x-delayed-type' must be an existing exchange type")
    if delayed_type not in known_types:
        raise AMQPError(COMMAND_INVALID, "unknown exchange type '%s'" % delayed_type)


def delay_of(headers: dict | None) -> int:
    """The delay (ms) an x-delay header asks for, 0 for none: integers as
    they are, floats truncated, numeric strings parsed (the plugin's rules);
    anything else, or a delay out of range, means no delay."""
    if not headers:
        return 0
    value = headers.get("x-delay")
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, (float, Decimal)):
        value = int(value)
    elif isinstance(value, (str, bytes)):
        try:
            value = int(value)
        except ValueError:
            return 0
    if not isinstance(value, int) or not 0 < value <= MAX_DELAY:
        return 0
    return value


def _routing_keys(message: Message) -> list[str]:
    """A recovered message's routing keys: its own and its CC header's (BCC
    was removed before it was stored)."""
    headers = message.headers or {}
    cc = headers.get("CC")
    return [message.routing_key] + ([k for k in cc if isinstance(k, str)] if isinstance(cc, list) else [])


class Delayer:
    def __init__(self, deliver: Callable[[Message, list[str]], None], store=None) -> None:
        # `deliver(message, routing_keys)`: route by the message's exchange and enqueue.
        self._deliver = deliver
        # A `storage.delayed_store.DelayedStore`, or None (nothing is durable).
        self.store = store
        self._heap: list[tuple] = []  # (due ms, arrival, message, routing keys, store seq or None)
        self._arrival = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0

    def held(self, exchange: str) -> int:
        """How many messages `exchange` holds (the plugin's messages_delayed; for listings)."""
        return sum(1 for item in self._heap if item[2].exchange == exchange)

    def recover(self) -> None:
        """At start: schedule what the store still holds."""
        if self.store is None:
            return
        for seq, due, message in self.store.recover():
            heapq.heappush(self._heap, (due, next(self._arrival), message, _routing_keys(message), seq))
        self._schedule()

    def delay(self, message: Message, delay: int, routing_keys: list[str], durable: bool,
              on_durable: Callable[[], None] | None) -> bool:
        """Hold a copy of `message` (with x-delay negated) for `delay` ms;
        True when `on_durable` was taken (it is called once the copy is on
        disk). The message itself is left as it is: an alternate exchange
        may route it now."""
        message = Message(message.exchange, message.routing_key, message.header, message.body)
        message.set_signed_header("x-delay", -delay)
        due = int(time.time() * 1000) + delay
        seq = None
        waits = False
        if durable and message.persistent and self.store is not None:
            seq = self.store.add(message, due, on_durable)
            waits = on_durable is not None
        heapq.heappush(self._heap, (due, next(self._arrival), message, routing_keys, seq))
        self._schedule()
        return waits

    def _schedule(self) -> None:
        if not self._heap:
            return
        due = self._heap[0][0]
        if self._timer is not None:
            if self._timer_due <= due:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, (due - time.time() * 1000) / 1000), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.time() * 1000
        heap = self._heap
        while heap and heap[0][0] <= now:
            _due, _arrival, message, routing_keys, seq = heapq.heappop(heap)
            self._deliver(message, routing_keys)
            if seq is not None:
                self.store.remove(seq)
        self._schedule()
