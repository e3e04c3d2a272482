"""MQTT sessions of the node: who holds each client id (per vhost), the
QoS 2 state persistent sessions keep, the retained messages, and the
sessions as administrators see them.

A session is a connected client id, or a persistent one the node keeps
while its connection is away: durable subscription queues (named by
`queue_name`) or QoS 2 state. A clean session's state lives and dies with
its connection.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from amqp_server.mqtt import topics
from amqp_server.mqtt.exactly_once import ExactlyOnce
from amqp_server.mqtt.retained import RetainedMessages

if TYPE_CHECKING:
    from amqp_server.mqtt.session import MQTTConnection


QUEUE_PREFIX = "mqtt-subscription-"
# The client id is everything before the last "qos<N>" (ids may contain "qos1" too).
_QUEUE_NAME = re.compile(re.escape(QUEUE_PREFIX) + r"(.*)qos([0-2])\Z", re.DOTALL)


def queue_name(client_id: str, qos: int) -> str:
    return "%s%sqos%d" % (QUEUE_PREFIX, client_id, qos)


class Session(NamedTuple):
    """One MQTT session of a vhost, as administrators see it."""

    client_id: str
    connection: "MQTTConnection | None"  # None while a persistent session's client is away
    qos2: ExactlyOnce | None  # its QoS 2 packet-id state, if any
    queues: list  # its subscription queues, by QoS

    @property
    def clean(self) -> bool:
        return self.connection is not None and self.connection.clean


def _subscription_queues(vhost) -> dict[str, list]:
    """Client id -> the vhost's subscription queues of that client."""
    queues: dict[str, list] = {}
    for q in list(vhost.queues.values()):
        if q.name.startswith(QUEUE_PREFIX):
            match = _QUEUE_NAME.match(q.name)
            if match is not None:
                queues.setdefault(match.group(1), []).append(q)
    return queues


class Sessions:
    """What every MQTT connection of the node shares: who holds each client id
    (per vhost) and the retained messages."""

    def __init__(self, retained: RetainedMessages, store=None, writer=None) -> None:
        self.clients: dict[tuple[str, str], "MQTTConnection"] = {}
        self.retained = retained
        self.store = store
        self.writer = writer
        # (vhost, client id) -> QoS 2 state of each persistent session
        self.kept: dict[tuple[str, str], ExactlyOnce] = {}
        if store is not None:
            for (vhost, client_id), rows in store.load_packet_ids().items():
                state = self.kept[(vhost, client_id)] = ExactlyOnce(vhost, client_id, store, writer)
                state.restore(rows)

    def forget_vhost(self, vhost: str) -> None:
        """The vhost was deleted (its connections are closed by then): its
        retained messages and persistent sessions' QoS 2 state go too."""
        self.retained.forget_vhost(vhost)
        for key in [key for key in self.kept if key[0] == vhost]:
            del self.kept[key]
        store = self.store
        if store is not None:
            self.writer.run(lambda: store.delete_vhost(vhost))

    def in_vhost(self, vhost) -> list[Session]:
        """The sessions of a `vhosts.VirtualHost` by client id: every
        connected client, and every persistent session whose client is away
        but whose durable subscription queues or QoS 2 state the node keeps."""
        name = vhost.name
        queues = _subscription_queues(vhost)
        ids = {cid for vhost_name, cid in (*self.clients, *self.kept) if vhost_name == name}
        ids.update(cid for cid, found in queues.items() if any(q.durable for q in found))
        sessions = []
        for cid in sorted(ids):
            connection = self.clients.get((name, cid))
            qos2 = connection.qos2 if connection is not None else self.kept.get((name, cid))
            sessions.append(Session(cid, connection, qos2, sorted(queues.get(cid, ()), key=lambda q: q.name)))
        return sessions

    @staticmethod
    def topic_filters(vhost, exchange_name: str) -> dict[str, list[str]]:
        """Subscription queue name -> its binding keys on the MQTT exchange
        `exchange_name`, as MQTT topic filters (for the management API)."""
        exchange = vhost.exchanges.get(exchange_name)
        found: dict[str, list[str]] = {}
        if exchange is not None:
            for dest, key, _arguments in exchange.table.bindings():
                if dest.kind == "queue":
                    found.setdefault(dest.name, []).append(topics.to_mqtt(key))
        return found

    def persistent_count(self, vhosts) -> int:
        """How many persistent sessions `in_vhost` lists over `vhosts`, in one
        pass (every connected persistent session is in `kept`)."""
        keys = set(self.kept)
        for vhost in vhosts:
            keys.update((vhost.name, cid) for cid, found in _subscription_queues(vhost).items()
                        if any(q.durable for q in found))
        return len(keys)

    def end(self, vhost, session: Session) -> None:
        """An administrator ends a session: its connection closes (publishing
        the will), its queues and QoS 2 state go."""
        if session.connection is not None:
            session.connection.end_now()
        for q in session.queues:
            vhost.remove_queue(q)
        state = self.kept.pop((vhost.name, session.client_id), None)
        if state is not None:
            state.forget()

    def exactly_once(self, vhost: str, client_id: str, clean: bool) -> tuple[ExactlyOnce, bool]:
        """The QoS 2 state a CONNECT starts with, and whether a persistent
        session was kept for it; a clean session discards what one kept."""
        key = (vhost, client_id)
        if clean:
            old = self.kept.pop(key, None)
            if old is not None:
                old.forget()
            return ExactlyOnce(vhost, client_id), False
        state = self.kept.get(key)
        if state is not None:
            return state, True
        state = self.kept[key] = ExactlyOnce(vhost, client_id, self.store, self.writer)
        return state, False
