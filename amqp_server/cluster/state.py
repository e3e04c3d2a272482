"""What a data directory knows of its cluster, kept in the directory itself
(fsynced), so that it survives a restart and a loss of etcd's keys.

- `cluster_state` (JSON, replaced atomically): the cluster identity (a UUID
  written at the cluster's first election, kept in etcd's `cluster` key too;
  None for a directory that never was in a cluster), the highest term seen,
  the lineage of the stream this directory holds (one entry per election:
  [term, the term before it, the position in that term's stream the new
  leader held when elected]), and the in-sync set last seen.
- `cluster_position` (a fixed 24-byte record rewritten in place): the term
  and the position in that term's stream the directory holds, applied and
  synced (a follower's `Follower.synced`; a leader writes LEADING: it holds
  its whole stream, however far it got), or UNKNOWN while a snapshot is
  half applied. A torn or missing record reads as UNKNOWN.

Neither file is replicated (storage.replica's local names): each node says
what it holds itself.

Invariant: a directory's identity changes only from None, when a node with
no data of its own first follows a leader (it adopts that leader's), or when
it founds a cluster. A node never replaces its files with those of a leader
of another identity (amqp_server.cluster.node).
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import struct
import uuid
import zlib
from dataclasses import dataclass, field

from storage import replica

log = logging.getLogger("hutch.cluster")

STATE = "cluster_state"
POSITION = "cluster_position"
FORCE_BOOT = "force_boot"  # written by `hutchctl force_boot --data-dir`
LEADING = (1 << 63) - 1  # a leader's position: the whole of its own stream
_RECORD = struct.Struct(">qqI")  # term, position, CRC-32 of the 16 bytes before
LINEAGE_KEPT = 200  # elections remembered


def new_identity() -> str:
    return str(uuid.uuid4())


@dataclass
class ClusterState:
    cluster: str | None = None
    term: int = 0  # the highest term seen
    lineage: list = field(default_factory=list)  # [[term, previous term, previous position]]
    in_sync: list = field(default_factory=list)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DataDirectory:
    """The cluster files of one data directory (blocking calls: small files)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._position_fd: int | None = None

    def load(self) -> ClusterState:
        try:
            with open(os.path.join(self.root, STATE)) as f:
                raw = json.load(f)
        except FileNotFoundError:
            return ClusterState()
        return ClusterState(raw.get("cluster"), int(raw.get("term") or 0), list(raw.get("lineage") or []),
                            list(raw.get("in_sync") or []))

    def save(self, state: ClusterState) -> None:
        path = os.path.join(self.root, STATE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"cluster": state.cluster, "term": state.term, "lineage": state.lineage[-LINEAGE_KEPT:],
                       "in_sync": state.in_sync}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_directory(self.root)

    def position(self) -> tuple[int, int] | None:
        """(term, position) held, or None (unknown)."""
        try:
            with open(os.path.join(self.root, POSITION), "rb") as f:
                raw = f.read(_RECORD.size)
        except FileNotFoundError:
            return None
        if len(raw) != _RECORD.size:
            return None
        term, position, crc = _RECORD.unpack(raw)
        if crc != zlib.crc32(raw[:16]) or term < 0:
            return None
        return term, position

    def record_position(self, mark: tuple[int, int] | None, fsync: bool = True) -> None:
        """Rewrite the position record in place (one sector: it is written whole
        or, torn, fails its CRC and reads as unknown)."""
        if self._position_fd is None:
            self._position_fd = os.open(os.path.join(self.root, POSITION), os.O_WRONLY | os.O_CREAT, 0o644)
        term, position = mark if mark is not None else (-1, -1)
        head = struct.pack(">qq", term, position)
        os.pwrite(self._position_fd, head + struct.pack(">I", zlib.crc32(head)), 0)
        if fsync:
            os.fdatasync(self._position_fd)

    def close(self) -> None:
        fd, self._position_fd = self._position_fd, None
        if fd is not None:
            os.close(fd)

    def holds_data(self) -> bool:
        """Whether the directory holds anything a broker wrote (a definitions
        store, queues, messages): a node that never ran has nothing."""
        if not os.path.isdir(self.root):
            return False
        for directory, dirs, names in os.walk(self.root):
            if directory == self.root and replica.SHARDS in dirs:
                dirs.remove(replica.SHARDS)  # the other shards' (each its own group's)
            for name in names:
                if name.endswith(".db") or replica.replicated(name):
                    return True
        return False

    def force_boot(self) -> bool:
        return os.path.exists(os.path.join(self.root, FORCE_BOOT))

    def clear_force_boot(self) -> None:
        try:
            os.remove(os.path.join(self.root, FORCE_BOOT))
        except FileNotFoundError:
            pass

    def aside_directory(self) -> str:
        """A new dated directory beside the data directory, for files a
        follower must give up to follow its leader (never erased)."""
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        base = os.path.abspath(self.root).rstrip("/") + ".set-aside-" + stamp
        path, n = base, 1
        while os.path.exists(path):
            n += 1
            path = "%s-%d" % (base, n)
        os.makedirs(path)
        for name in (STATE, POSITION):  # what the set-aside copy was
            try:
                shutil.copy2(os.path.join(self.root, name), path)
            except FileNotFoundError:
                pass
        return path


def rank(position: tuple[int, int] | None) -> tuple[int, int]:
    """How much of the cluster's history a position holds: by term, then by
    position in that term's stream; unknown holds least."""
    return tuple(position) if position is not None else (-1, -1)


def diverged(position: tuple[int, int] | None, leader_term: int, lineage: list) -> bool:
    """Whether a directory holding `position` holds changes that a leader of
    `leader_term` with `lineage` never had (so following it would remove
    them): its term ended, in the leader's history, before the position it
    holds, or is not in that history at all."""
    if position is None:
        return False  # a half-applied snapshot: a copy of some leader's, nothing of its own
    term, held = position
    if term == leader_term:
        return False  # the same stream: this copy can only be behind
    for entry_term, previous_term, previous_position in lineage:
        if previous_term == term:
            return held > previous_position
    return True
