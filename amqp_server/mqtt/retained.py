"""Retained messages: the last retained PUBLISH of each topic, per vhost.

RabbitMQ keeps them per vhost and hands one to a subscription only when its
filter is that exact topic; hutch matches wildcard filters too, as the MQTT
spec asks, and keeps them across restarts in `storage.retained` (written on
the storage writer thread, never on the event loop). An empty payload
clears a topic's retained message.
"""
from __future__ import annotations

from typing import Callable

from amqp_server.mqtt import topics


class RetainedMessages:
    def __init__(self, store=None, writer=None) -> None:
        self.store = store
        self.writer = writer
        self.by_vhost: dict[str, dict[str, tuple[bytes, int]]] = store.load() if store is not None else {}

    def retain(self, vhost: str, topic: str, payload: bytes, qos: int, done: Callable | None = None) -> bool:
        """Keep (or, with an empty payload, forget) `topic`'s retained message;
        True when `done` will be called once it is on disk."""
        kept = self.by_vhost.setdefault(vhost, {})
        if payload:
            kept[topic] = (payload, qos)
        elif kept.pop(topic, None) is None:
            return False
        if self.store is None:
            return False
        store = self.store
        if payload:
            self.writer.run(lambda: store.put(vhost, topic, payload, qos), done and (lambda _result: done()))
        else:
            self.writer.run(lambda: store.delete(vhost, topic), done and (lambda _result: done()))
        return done is not None

    def forget_vhost(self, vhost: str) -> None:
        """The vhost was deleted: so are its retained messages (the caller
        deletes them on disk, `MQTTStore.delete_vhost`)."""
        self.by_vhost.pop(vhost, None)

    def matching(self, vhost: str, granted: list[tuple[str, int]]):
        """(topic, payload, qos) for each retained message a new subscription
        matches, at the lower of its published QoS and the best granted one."""
        kept = self.by_vhost.get(vhost)
        if not kept:
            return
        for topic, (payload, published_qos) in kept.items():
            qos = max((q for f, q in granted if topics.matches(f, topic)), default=None)
            if qos is not None:
                yield topic, payload, min(qos, published_qos)
