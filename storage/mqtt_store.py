"""What MQTT keeps on disk besides queues, in one SQLite file per node:
retained messages (one row per (vhost, topic): the last retained payload
and its QoS) and the QoS 2 packet-id state of persistent sessions (one row
per (vhost, client id, kind, packet id); the kinds are below, their meaning
is in amqp_server.mqtt.exactly_once).

Writes are blocking: the broker runs `put` and `delete` on the storage
writer thread (`GroupCommitWriter.run`), which is why the connection may be
used from a thread other than the one that opened it (only one thread uses
it at a time: `load` before serving, then only the writer thread).
"""
from __future__ import annotations

import functools
import sqlite3

from storage import files

RECEIVED, SENT, RELEASED = "received", "sent", "released"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
    vhost TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    PRIMARY KEY (vhost, topic)
);
CREATE TABLE IF NOT EXISTS packet_ids (
    vhost TEXT NOT NULL,
    client_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    pid INTEGER NOT NULL,
    msg_id BLOB NOT NULL,
    PRIMARY KEY (vhost, client_id, kind, pid)
)
"""


def _mutation(method):
    """After a committed change: a cluster's followers get the database."""
    @functools.wraps(method)
    def change(self, *args):
        method(self, *args)
        files.wrote(self.path, self._db.serialize)
    return change


class MQTTStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def load(self) -> dict[str, dict[str, tuple[bytes, int]]]:
        """vhost -> topic -> (payload, qos)."""
        found: dict[str, dict[str, tuple[bytes, int]]] = {}
        for vhost, topic, payload, qos in self._db.execute("SELECT vhost, topic, payload, qos FROM retained"):
            found.setdefault(vhost, {})[topic] = (bytes(payload), qos)
        return found

    @_mutation
    def put(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO retained (vhost, topic, payload, qos) VALUES (?, ?, ?, ?)",
                         (vhost, topic, payload, qos))

    @_mutation
    def delete(self, vhost: str, topic: str) -> None:
        self._db.execute("DELETE FROM retained WHERE vhost = ? AND topic = ?", (vhost, topic))

    @_mutation
    def delete_vhost(self, vhost: str) -> None:
        """Everything kept for a deleted vhost: retained messages and sessions."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM retained WHERE vhost = ?", (vhost,))
            self._db.execute("DELETE FROM packet_ids WHERE vhost = ?", (vhost,))

    def load_packet_ids(self) -> dict[tuple[str, str], list[tuple[str, int, bytes]]]:
        """(vhost, client id) -> [(kind, packet id, message id)]."""
        found: dict[tuple[str, str], list[tuple[str, int, bytes]]] = {}
        for vhost, client_id, kind, pid, msg_id in self._db.execute(
                "SELECT vhost, client_id, kind, pid, msg_id FROM packet_ids"):
            found.setdefault((vhost, client_id), []).append((kind, pid, bytes(msg_id)))
        return found

    @_mutation
    def add_packet_id(self, vhost: str, client_id: str, kind: str, pid: int, msg_id: bytes = b"") -> None:
        self._db.execute("INSERT OR REPLACE INTO packet_ids (vhost, client_id, kind, pid, msg_id) VALUES (?, ?, ?, ?, ?)",
                         (vhost, client_id, kind, pid, msg_id))

    @_mutation
    def release_packet_id(self, vhost: str, client_id: str, pid: int, msg_id: bytes) -> None:
        """QoS 2 outbound, PUBREC: the id moves from "sent" to "released" in
        one transaction (a crash leaves it in one or the other, never neither)."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM packet_ids WHERE vhost = ? AND client_id = ? AND kind = ? AND pid = ?",
                             (vhost, client_id, SENT, pid))
            self._db.execute("INSERT OR REPLACE INTO packet_ids (vhost, client_id, kind, pid, msg_id) "
                             "VALUES (?, ?, ?, ?, ?)", (vhost, client_id, RELEASED, pid, msg_id))

    @_mutation
    def remove_packet_id(self, vhost: str, client_id: str, kind: str, pid: int) -> None:
        self._db.execute("DELETE FROM packet_ids WHERE vhost = ? AND client_id = ? AND kind = ? AND pid = ?",
                         (vhost, client_id, kind, pid))

    @_mutation
    def forget_session(self, vhost: str, client_id: str) -> None:
        self._db.execute("DELETE FROM packet_ids WHERE vhost = ? AND client_id = ?", (vhost, client_id))

    def close(self) -> None:
        self._db.close()
