"""MQTT retained messages on disk: one SQLite file per node, one row per
(vhost, topic) holding the last retained payload and its QoS.

Writes are blocking: the broker runs `put` and `delete` on the storage
writer thread (`GroupCommitWriter.run`), which is why the connection may be
used from a thread other than the one that opened it (only one thread uses
it at a time: `load` before serving, then only the writer thread).
"""
from __future__ import annotations

import sqlite3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
    vhost TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    PRIMARY KEY (vhost, topic)
)
"""


class RetainedStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def load(self) -> dict[str, dict[str, tuple[bytes, int]]]:
        """vhost -> topic -> (payload, qos)."""
        found: dict[str, dict[str, tuple[bytes, int]]] = {}
        for vhost, topic, payload, qos in self._db.execute("SELECT vhost, topic, payload, qos FROM retained"):
            found.setdefault(vhost, {})[topic] = (bytes(payload), qos)
        return found

    def put(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO retained (vhost, topic, payload, qos) VALUES (?, ?, ?, ?)",
                         (vhost, topic, payload, qos))

    def delete(self, vhost: str, topic: str) -> None:
        self._db.execute("DELETE FROM retained WHERE vhost = ? AND topic = ?", (vhost, topic))

    def close(self) -> None:
        self._db.close()
