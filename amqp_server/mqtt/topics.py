"""MQTT topic names and filters <-> AMQP topic routing keys, as RabbitMQ maps them.

MQTT levels are separated by "/", AMQP words by "."; "+" (one level) is
AMQP's "*", "#" is the same in both. Like RabbitMQ's plugin the mapping is a
character swap: a "." inside an MQTT topic becomes a word separator in AMQP
and comes back to MQTT subscribers as "/".
"""
from __future__ import annotations

_TO_AMQP = str.maketrans({"/": ".", "+": "*"})
_TO_MQTT = str.maketrans({".": "/", "*": "+"})


def to_amqp(topic: str) -> str:
    return topic.translate(_TO_AMQP)


def to_mqtt(routing_key: str) -> str:
    return routing_key.translate(_TO_MQTT)


def matches(topic_filter: str, topic: str) -> bool:
    """Whether an MQTT topic name matches a topic filter (for retained messages).
    Topics starting with "$" are not matched by a leading wildcard."""
    levels = topic.split("/")
    if levels[0].startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    parts = topic_filter.split("/")
    for i, part in enumerate(parts):
        if part == "#":
            return True
        if i >= len(levels):
            return False
        if part != "+" and part != levels[i]:
            return False
    return len(parts) == len(levels)
