"""The message storage of one virtual host: its two message stores and the
indexes of its durable queues (layout in docs/storage.md).

Start-up order (all blocking, before the broker serves): `recover_queue` for
every durable queue restored from the definitions (each index tells which
message-store entries it still references), then `finish_recovery`, which
rebuilds the persistent store's reference counts from those, wipes the
transient store and removes the directories of queues that no longer exist.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections import Counter
from dataclasses import dataclass

from storage.dead_letter_log import DeadLetterLog, DeadLetterLogSettings
from storage.msg_store import MessageStore
from storage.queue_index import QueueIndex
from storage.variable_queue import VariableQueue
from storage.writer import GroupCommitWriter

log = logging.getLogger("hutch.storage")


@dataclass
class StorageSettings:
    msg_store_file_size: int = 16777216
    embed_below: int = 4096
    segment_entries: int = 4096
    unclean_start: bool = False  # no clean-shutdown marker: recovered messages count as delivered
    dead_letter_log: DeadLetterLogSettings | None = None  # None: no dead-letter log


def dir_name(name: str) -> str:
    """A directory name for any vhost or queue name: no name can reach
    outside the data directory, whatever characters it holds."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


class VhostStorage:
    def __init__(self, directory: str, writer: GroupCommitWriter, monitor, settings: StorageSettings) -> None:
        self.directory = directory
        self.writer = writer
        self.monitor = monitor
        self.settings = settings
        os.makedirs(os.path.join(directory, "queues"), exist_ok=True)
        self.persistent = MessageStore(
            os.path.join(directory, "msg_store_persistent"), writer, settings.msg_store_file_size)
        self.transient = MessageStore(
            os.path.join(directory, "msg_store_transient"), writer, settings.msg_store_file_size)
        self.dead_letters: DeadLetterLog | None = None
        if settings.dead_letter_log is not None:
            self.dead_letters = DeadLetterLog(os.path.join(directory, "dead_letters"), writer, settings.dead_letter_log)
            self.dead_letters.recover()
        self._refcounts: Counter = Counter()
        self._recovered: set[str] = set()

    def _index(self, queue: str) -> QueueIndex:
        return QueueIndex(
            os.path.join(self.directory, "queues", dir_name(queue)),
            self.writer,
            embed_below=self.settings.embed_below,
            segment_entries=self.settings.segment_entries,
        )

    def new_queue(self, queue: str, durable: bool) -> VariableQueue:
        """The backing queue of a queue declared now. A non-durable one uses
        the disk only to page messages out, and its files go at the next
        start (only durable queues are recovered)."""
        return VariableQueue(self._index(queue), self.persistent, self.transient, self.monitor, durable=durable)

    def recover_queue(self, queue: str) -> VariableQueue:
        """At start: a durable queue restored from the definitions, with the
        messages its index still holds as delta (read back as consumed)."""
        index = self._index(queue)
        _loaded, report = index.recover(max_entries=0)
        self._refcounts.update(report.store_refs)
        self._recovered.add(dir_name(queue))
        backing = VariableQueue(index, self.persistent, self.transient, self.monitor, next_seq=report.next_seq)
        backing.recovered(report.first_seq, report.entries, report.entry_bytes, self.settings.unclean_start,
                          report.segment_expiry)
        return backing

    def finish_recovery(self) -> None:
        self.transient.wipe()
        report = self.persistent.recover(dict(self._refcounts))
        if report.missing:
            log.error("%s: %d message(s) referenced by queue indexes were not found in the message store",
                      self.directory, len(report.missing))
        self._refcounts.clear()
        queues_dir = os.path.join(self.directory, "queues")
        for entry in os.listdir(queues_dir):
            if entry not in self._recovered:
                shutil.rmtree(os.path.join(queues_dir, entry), ignore_errors=True)
        self._recovered.clear()
