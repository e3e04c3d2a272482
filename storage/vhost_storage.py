"""The message storage of one virtual host: its two message stores and the
indexes of its durable queues (layout in docs/storage.md).

Start-up order (all blocking, before the broker serves): `recover_queue` for
every durable queue restored from the definitions (each index tells which
message-store entries it still references), then `finish_recovery`, which
rebuilds the persistent store's reference counts from those, wipes the
transient store and removes the directories of queues that no longer exist.

Deleting the vhost (`destroy`) renames its directory aside at once (one
metadata operation on the loop, like creating it), so a vhost of the same
name added right afterwards starts empty, and removes the renamed tree on
the writer thread after every job already queued for its files.

After a clean stop (`write_summaries`, storage/summary.py) each index loads
its summary instead of scanning when the summary matches its files; the
persistent store loads its own only when every queue whose references it
counted came back from its summary, and every other queue holds no store
reference (its counts are then exactly what the scans would rebuild).
Otherwise the store is scanned, with the references of the indexes that
came from summaries read from their segment files.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass

from storage import files
from storage.delayed_store import DelayedStore
from storage.dead_letter_log import DeadLetterLog, DeadLetterLogSettings
from storage.msg_store import MessageStore
from storage.queue_index import QueueIndex
from storage.stream_log import LogSettings, StreamLog
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


# Threads writing queue index summaries at a clean stop (VhostStorage.write_summaries).
SUMMARY_THREADS = 16


def _write_index_summary(backing: VariableQueue) -> bool:
    try:
        backing.index.write_summary(backing.persistent_bytes)
        return True
    except OSError as exc:
        log.error("queue index %s: no recovery summary written: %s", backing.index.directory, exc)
        return False


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
            os.path.join(directory, "msg_store_transient"), writer, settings.msg_store_file_size, durable=False)
        self.dead_letters: DeadLetterLog | None = None
        if settings.dead_letter_log is not None:
            self.dead_letters = DeadLetterLog(os.path.join(directory, "dead_letters"), writer, settings.dead_letter_log)
            self.dead_letters.recover()
        self._refcounts: Counter = Counter()
        self._recovered: set[str] = set()
        self._recovered_streams: set[str] = set()
        self._from_summary: dict[str, QueueIndex] = {}  # recovered from their summaries, by directory
        # By directory: whose summaries a clean stop writes (a deleted queue's
        # entry goes with its last reference).
        self._durable: weakref.WeakValueDictionary[str, VariableQueue] = weakref.WeakValueDictionary()

    def _index(self, queue: str, durable: bool = True) -> QueueIndex:
        return QueueIndex(
            os.path.join(self.directory, "queues", dir_name(queue)),
            self.writer,
            embed_below=self.settings.embed_below,
            segment_entries=self.settings.segment_entries,
            durable=durable,
        )

    def new_queue(self, queue: str, durable: bool) -> VariableQueue:
        """The backing queue of a queue declared now. A non-durable one uses
        the disk only to page messages out, and its files go at the next
        start (only durable queues are recovered)."""
        backing = VariableQueue(self._index(queue, durable), self.persistent, self.transient, self.monitor,
                                durable=durable)
        if durable:
            self._durable[dir_name(queue)] = backing
        return backing

    def recover_queue(self, queue: str) -> VariableQueue:
        """At start: a durable queue restored from the definitions, with the
        messages its index still holds as delta (read back as consumed)."""
        index = self._index(queue)
        name = dir_name(queue)
        report = None if self.settings.unclean_start else index.recover_summary()
        if report is None:
            _loaded, report = index.recover(max_entries=0)
            self._refcounts.update(report.store_refs)
        else:
            self._from_summary[name] = index
        self._recovered.add(name)
        backing = VariableQueue(index, self.persistent, self.transient, self.monitor, next_seq=report.next_seq)
        backing.recovered(report.first_seq, report.entries, report.entry_bytes, self.settings.unclean_start,
                          report.segment_expiry)
        self._durable[name] = backing
        return backing

    def stream_log(self, queue: str, settings: LogSettings, restoring: bool = False) -> StreamLog:
        """The log of a stream queue (docs/streams.md); at start (`restoring`)
        recovered from its files. A new stream's directory is made by the
        writer before its first segment."""
        name = dir_name(queue)
        stream = StreamLog(os.path.join(self.directory, "streams", name), self.writer, settings)
        if restoring:
            stream.recover()
            self._recovered_streams.add(name)
        return stream

    def delayed_store(self) -> DelayedStore:
        """Where the delayed messages of this vhost's durable delayed-message
        exchanges are kept (`recover` it at start)."""
        return DelayedStore(os.path.join(self.directory, "delayed"), self.writer, self.settings.segment_entries)

    def finish_recovery(self) -> None:
        self.transient.wipe()
        report = None
        if self._refcounts and not self.settings.unclean_start:
            log.info("message store %s: recovery summary not used (queues recovered without a summary "
                     "hold references): scanning", self.persistent.directory)
        elif not self.settings.unclean_start:
            report = self.persistent.recover_summary(set(self._from_summary))
        if report is None:
            for index in self._from_summary.values():
                self._refcounts.update(index.store_refs())
            report = self.persistent.recover(dict(self._refcounts))
        self._from_summary.clear()
        if report.missing:
            log.error("%s: %d message(s) referenced by queue indexes were not found in the message store",
                      self.directory, len(report.missing))
        self._refcounts.clear()
        queues_dir = os.path.join(self.directory, "queues")
        for entry in os.listdir(queues_dir):
            if entry not in self._recovered:
                shutil.rmtree(os.path.join(queues_dir, entry), ignore_errors=True)
        self._recovered.clear()
        streams_dir = os.path.join(self.directory, "streams")
        for entry in os.listdir(streams_dir) if os.path.isdir(streams_dir) else ():
            if entry not in self._recovered_streams:  # its queue was deleted while its files were being removed
                shutil.rmtree(os.path.join(streams_dir, entry), ignore_errors=True)
        self._recovered_streams.clear()

    def destroy(self) -> None:
        """The vhost is deleted: remove its directory (its queues were deleted first)."""
        doomed = "%s.deleted-%s" % (self.directory, uuid.uuid4().hex[:8])
        try:
            os.rename(self.directory, doomed)
        except FileNotFoundError:
            return
        self.persistent.close()
        self.transient.close()
        if self.dead_letters is not None:
            self.dead_letters.close()
        directory = self.directory

        def remove() -> None:
            shutil.rmtree(doomed, ignore_errors=True)
            files.removed(directory)  # after the writer's last job in it

        self.writer.run(remove)

    def write_summaries(self) -> None:
        """At a clean stop, once the writer has stopped (blocking; the loop
        is blocked too, so nothing changes meanwhile): the summary of each
        durable queue index that has files (one without scans in no time),
        then the persistent store's, naming the queues summarized. The
        indexes are written by SUMMARY_THREADS threads: each summary costs
        two fsyncs, which the file system commits together when they come
        at once (about 5x faster for 200 queues here). A failure is logged
        and leaves that summary out: the next start scans what it does not
        cover."""
        backings = {name: backing for name, backing in self._durable.items()
                    if not backing.index.deleted and backing.index.segments_on_disk}
        with ThreadPoolExecutor(SUMMARY_THREADS, thread_name_prefix="hutch-summary") as pool:
            written = list(pool.map(_write_index_summary, backings.values()))
        referrers = [name for name, ok in zip(backings, written) if ok]
        try:
            self.persistent.write_summary(referrers)
        except OSError as exc:
            log.error("message store %s: no recovery summary written: %s", self.persistent.directory, exc)
