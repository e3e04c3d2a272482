"""Server-side tracking of one stream: consumer offsets (store/query offset)
and publisher sequences (deduplication by publisher reference), as RabbitMQ
keeps them in a stream's tracking chunks.

Theory of operation
- A publish by a named publisher writes its reference and publishing id
  into the record itself (vhosts.stream_records), so the record and what
  deduplication knows of it reach the disk together. `sequences` holds, per
  reference, the highest publishing id whose record is durable (advanced in
  the record's durable callback); `accepted` also counts the ones still in
  flight, so a resend of a pending id is recognised too.
- A snapshot (`tracking.json` in the stream's log directory: the offsets,
  the sequences and the log's next offset when taken) is written by the
  group-commit writer (write, fsync, rename through storage.files, so a
  cluster's followers get it too) at most once per SNAPSHOT_EVERY seconds
  while something changed. Loading reads the snapshot, then replays
  the records from its next offset to the end of the log for their
  publisher sequences: after a crash, deduplication knows every durable
  record's publishing id (invariant), and stored offsets are at most
  SNAPSHOT_EVERY seconds old (RabbitMQ's store offset is asynchronous too:
  the command has no response).
- Until loaded, requests that need the state wait in `_waiting`. The
  snapshot is read by the writer, after what was queued before (a deleted
  stream's removal among them).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Callable

from storage import files
from storage.writer import GroupCommitWriter
from vhosts.stream_records import publisher_of

log = logging.getLogger("hutch.stream")

FILE = "tracking.json"
SNAPSHOT_EVERY = 1.0
REPLAY_RECORDS = 1024


class Tracking:
    def __init__(self, queue, writer: GroupCommitWriter, loop) -> None:
        self.queue = queue
        self.writer = writer
        self.loop = loop
        self.offsets: dict[str, int] = {}
        self.sequences: dict[str, int] = {}  # durable
        self.accepted: dict[str, int] = {}  # durable or in flight
        self.loaded = False
        self._waiting: list[Callable[[], None]] = []
        self._dirty = False
        self._timer = None
        self._start()

    @property
    def path(self) -> str:
        return os.path.join(self.queue.log.directory, FILE)

    # -- loading -------------------------------------------------------------

    def _start(self) -> None:
        # Read on the writer thread, after every job queued before: a stream
        # deleted and declared again under the same name shares the directory,
        # and the old one's removal must come first (no stale sequences).
        path = self.path

        def read() -> dict | None:
            try:
                with open(path, encoding="utf-8") as f:
                    return json.load(f)
            except FileNotFoundError:
                return None
        self.writer.run(read, self._snapshot_read)

    def _snapshot_read(self, snapshot) -> None:
        start = 0
        if snapshot is not None:
            try:
                if isinstance(snapshot, Exception):
                    raise snapshot
                self.offsets = {str(k): int(v) for k, v in snapshot.get("offsets", {}).items()}
                self.sequences = {str(k): int(v) for k, v in snapshot.get("sequences", {}).items()}
                start = int(snapshot.get("next_offset", 0))
            except (OSError, ValueError, AttributeError, TypeError) as exc:
                # The records still carry every publisher sequence: replay them all.
                log.warning("stream %s: unreadable tracking snapshot (%s), replaying the whole log",
                            self.queue.name, exc)
                self.offsets, self.sequences, start = {}, {}, 0
        self._replay(max(start, self.queue.log.first_offset))

    def _replay(self, start: int) -> None:
        limit = self.queue.log.next_offset
        if start >= limit or self.queue.deleted:
            self._loaded()
            return

        def records(found) -> None:
            if isinstance(found, Exception) or not found:
                if isinstance(found, Exception):
                    log.error("stream %s: cannot replay publisher sequences: %s", self.queue.name, found)
                self._loaded()
                return
            for _offset, _stamp, payload in found:
                publisher = publisher_of(payload)
                if publisher is not None:
                    reference = publisher[0].decode("utf-8", "replace")
                    if publisher[1] > self.sequences.get(reference, 0):
                        self.sequences[reference] = publisher[1]
            self._replay(found[-1][0] + 1)
        self.queue.log.read(start, REPLAY_RECORDS, records)

    def _loaded(self) -> None:
        self.loaded = True
        for reference, sequence in self.sequences.items():
            self.accepted[reference] = max(self.accepted.get(reference, 0), sequence)
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()

    def when_loaded(self, callback: Callable[[], None]) -> None:
        if self.loaded:
            callback()
        else:
            self._waiting.append(callback)

    # -- changes -------------------------------------------------------------

    def store_offset(self, reference: str, offset: int) -> None:
        self.offsets[reference] = offset
        self._changed()

    def durable(self, reference: str, publishing_id: int) -> None:
        if publishing_id > self.sequences.get(reference, 0):
            self.sequences[reference] = publishing_id
            self._changed()

    def _changed(self) -> None:
        self._dirty = True
        if self._timer is None and not self.queue.deleted:
            self._timer = self.loop.call_later(SNAPSHOT_EVERY, self.snapshot)

    def snapshot(self) -> None:
        """Write the state (on the writer thread), if it changed."""
        self._timer = None
        if not self._dirty or self.queue.deleted:
            return
        self._dirty = False
        data = json.dumps({"next_offset": self.queue.log.next_offset, "offsets": self.offsets,
                           "sequences": self.sequences}).encode()
        path = self.path
        sync = self.writer.durability == "fsync"

        def write() -> None:
            # An empty stream has no directory yet (its first segment makes it).
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = path + ".tmp"
            with open(temporary, "wb") as f:
                f.write(data)
                if sync:
                    os.fsync(f.fileno())
            files.replace(temporary, path)  # reported to the cluster's replication, as every file change

        self.writer.run(write, self._written)

    def _written(self, result: object) -> None:
        if isinstance(result, Exception) and not self.queue.deleted:
            log.error("stream %s: cannot write its tracking snapshot: %s", self.queue.name, result)
            self._changed()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
