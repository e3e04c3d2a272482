"""Dead-lettering: the message a dead letter exchange receives, and RabbitMQ's
cycle rule.

`dead_lettered` builds it as RabbitMQ 3.10 does (rabbit_dead_letter):
- published to the dead letter exchange with the dead letter routing key when
  the queue has one (and then without its CC header), else with the keys it
  was published with (its routing key and CC; BCC never reaches a queue);
- the expiration property is dropped (kept as `original-expiration`);
- `x-death` gets, at its front, the entry for (this queue, this reason): an
  existing one with its count raised by one (its other fields as they were),
  or a new one with count 1, reason, queue, time (seconds), exchange,
  routing-keys and original-expiration; the first death also sets
  `x-first-death-reason/queue/exchange`. Beyond 3.10 (as RabbitMQ 3.13):
  every death sets `x-last-death-reason/queue/exchange`.
Every other header keeps its bytes (storage.message.Message.header_with).

A cycle (`is_cycle`): the message already died in the target queue and no
death since then (that one included) was a rejection: then RabbitMQ drops it
for that target instead of looping forever. Rejections never count as cycles.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

from storage import Message
from storage.message import encode_value


@dataclass(frozen=True, slots=True)
class Death:
    """What the dead-letter hooks learn about one message that died."""

    reason: str  # rejected, expired, maxlen or delivery_limit
    queue: str
    time: int  # ms since the epoch
    exchange: str  # the exchange it was published to
    routing_keys: list[str]
    dead_letter_exchange: str | None  # where it goes next (None: dropped)
    deliveries: int = 0  # times it was given back after a delivery (x-delivery-count)


def routing_keys(message: Message) -> list[str]:
    """The keys it was routed with: its routing key, then the CC header's strings."""
    headers = message.headers
    cc = headers.get("CC") if headers else None
    if not isinstance(cc, list):
        return [message.routing_key]
    return [message.routing_key] + [k.decode("utf-8") if isinstance(k, bytes) else k
                                    for k in cc if isinstance(k, (str, bytes))]


def dead_lettered(message: Message, death: Death, routing_key: str | None) -> tuple[Message, list[str], list]:
    """(the message for the dead letter exchange, the keys to route it with,
    its new x-death)."""
    headers = message.headers or {}
    reason, queue = death.reason, death.queue
    deaths = headers.get("x-death")
    entries: dict[str, bytes] = {}
    if not isinstance(deaths, list):
        deaths = []
        for key, value in (("reason", reason), ("queue", queue), ("exchange", death.exchange)):
            entries["x-first-death-" + key] = encode_value(value)
    matched = None
    others = []
    for d in deaths:
        if matched is None and isinstance(d, dict) and d.get("queue") == queue and d.get("reason") == reason:
            matched = d
        else:
            others.append(d)
    if matched is not None:
        count = matched.get("count")
        first = dict(matched, count=count + 1 if isinstance(count, int) else 1)
    else:
        first = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": datetime.datetime.fromtimestamp(death.time // 1000, datetime.timezone.utc),
            "exchange": death.exchange,
            "routing-keys": death.routing_keys,
        }
        expiration = message.properties.expiration if message.has_expiration else None
        if expiration is not None:
            first["original-expiration"] = expiration
    if deaths:
        first = dict(sorted(first.items()))  # as RabbitMQ's sort_field_table on an existing x-death
    deaths = [first] + others
    entries["x-death"] = encode_value(deaths)
    for key, value in (("reason", reason), ("queue", queue), ("exchange", death.exchange)):
        entries["x-last-death-" + key] = encode_value(value)
    keys = death.routing_keys if routing_key is None else [routing_key]
    header = message.header_with(entries, remove=("CC",) if routing_key is not None else (),
                                 drop_expiration=True)
    return Message(death.dead_letter_exchange, keys[0], header, message.body), keys, deaths


def is_cycle(queue: str, deaths: list) -> bool:
    """RabbitMQ's rule (see the module docstring); `deaths` is the x-death
    header of the message about to be delivered to `queue`."""
    for death in deaths:
        if not isinstance(death, dict):
            return False  # a client put it there: not a fully automatic cycle
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == queue:
            return True
    return False
