"""The backing queue of a durable queue: RabbitMQ's variable queue, simplified.

A ready message is in one of the states of DESIGN.md section 3:
- alpha: message and position in RAM (in `_requeued`, `_head` or `_tail`);
  `entry.store` says whether it is also on disk (gamma for a persistent
  message, whose index record and body were written when it was published);
- delta: only on disk: the queue keeps a seq range `[_delta_start,
  _delta_end)` and how many ready messages it holds (`_delta_count`), and
  reads it back one index segment at a time as consumers advance.

Invariants:
- seqs in `_requeued` < seqs in `_head` < the delta range < seqs in `_tail`;
  `_tail` is empty whenever delta is (new messages join `_head` directly).
- Every message in delta is on disk (index record, and body in a message
  store unless embedded in the index).
- `ready` / `ready_bytes` count every ready message, RAM or disk;
  `ram_bytes` only the bodies in RAM, which the memory monitor budgets.
- A persistent message's publish calls `on_durable` only after its index
  record (written after its body) went through a group commit.
- Paging out takes the messages next to delta, so the range stays contiguous:
  the oldest of `_tail`, then the newest of `_head`.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterable

from storage.backing_queue import QueueEntry
from storage.message import Message
from storage.msg_store import MessageStore
from storage.queue_index import QueueIndex

# Keep at least this many messages in RAM at the head, and read the next
# delta segment once fewer remain.
HEAD_LOW = 256
_EMBEDDED = "index"  # entry.store for a message embedded in the queue index


class VariableQueue:
    def __init__(
        self,
        index: QueueIndex,
        store: MessageStore,
        transient_store: MessageStore,
        monitor,
        next_seq: int = 0,
        durable: bool = True,
    ) -> None:
        # Only a durable queue keeps persistent messages across restarts; any
        # queue writes messages to disk when it pages them out.
        self.durable = durable
        self.index = index
        self.store = store
        self.transient_store = transient_store
        self.monitor = monitor
        self._next_seq = next_seq
        self._requeued: list[QueueEntry] = []
        self._head: deque[QueueEntry] = deque()
        self._tail: deque[QueueEntry] = deque()
        self._delta_start = next_seq
        self._delta_end = next_seq
        self._delta_count = 0
        self._loading = False
        self._deleted = False
        self.ready = 0
        self.ready_bytes = 0
        self.ram_bytes = 0
        # Called when messages read back from delta become available.
        self.on_available: Callable[[], None] | None = None
        monitor.register(self)

    # -- BackingQueue --------------------------------------------------------

    def persists(self, message: Message) -> bool:
        return self.durable and message.persistent

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None) -> QueueEntry:
        seq = self._next_seq
        self._next_seq = seq + 1
        entry = QueueEntry(seq, message)
        size = len(message.body)
        self.ready += 1
        self.ready_bytes += size
        if self.durable and message.persistent:
            self._write(entry, on_durable)
        (self._tail if self._delta_count else self._head).append(entry)
        self.ram_bytes += size
        self.monitor.charge(size)
        return entry

    def fetch(self) -> QueueEntry | None:
        if self._requeued:
            entry = heapq.heappop(self._requeued)
        elif self._head:
            entry = self._head.popleft()
        else:
            if self._delta_count:
                self._load_delta()
            return None
        size = len(entry.message.body)
        self.ready -= 1
        self.ready_bytes -= size
        self.ram_bytes -= size
        self.monitor.charge(-size)
        if entry.store is not None:
            self.index.deliver((entry.seq,))
        if self._delta_count and len(self._head) < HEAD_LOW:
            self._load_delta()
        return entry

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        seqs = []
        for entry in entries:
            store = entry.store
            if store is None:
                continue
            if store is not _EMBEDDED:
                store.remove(entry.message.msg_id)
            seqs.append(entry.seq)
        if seqs and not self._deleted:
            self.index.ack(seqs)

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for entry in entries:
            entry.redelivered = True
            heapq.heappush(self._requeued, entry)
            size = len(entry.message.body)
            self.ready += 1
            self.ready_bytes += size
            self.ram_bytes += size
            self.monitor.charge(size)

    def purge(self) -> int:
        count = self.ready
        in_ram = list(self._requeued) + list(self._head) + list(self._tail)
        self._requeued.clear()
        self._head.clear()
        self._tail.clear()
        self.ack(in_ram)
        self._drop_delta()
        self.monitor.charge(-self.ram_bytes)
        self.ready = self.ready_bytes = self.ram_bytes = 0
        return count

    def delete(self) -> None:
        """The queue is gone: release its messages, then its index files."""
        self.purge()
        self._deleted = True
        self.monitor.unregister(self)
        self.index.delete()

    def state_counts(self) -> dict[str, int]:
        """Ready messages per state: alpha (message in RAM only), gamma (in
        RAM and on disk), delta (on disk only); for the CLI and metrics."""
        gamma = sum(1 for q in (self._requeued, self._head, self._tail) for e in q if e.store is not None)
        in_ram = len(self._requeued) + len(self._head) + len(self._tail)
        return {"alpha": in_ram - gamma, "gamma": gamma, "delta": self._delta_count}

    # -- disk ----------------------------------------------------------------

    def _write(self, entry: QueueEntry, done: Callable[[], None] | None) -> None:
        """Index record (and body in a store unless small enough to embed);
        `done` after the group commit that holds the index record, which was
        submitted after the body."""
        message = entry.message
        payload = message.to_bytes()
        persistent = self.durable and message.persistent
        if len(payload) < self.index.embed_below:
            entry.store = _EMBEDDED
        else:
            store = self.store if persistent else self.transient_store
            store.write(message.msg_id, payload)
            entry.store = store
        self.index.publish(entry.seq, message.msg_id, len(message.body), payload,
                           persistent=persistent, done=done)

    def _to_delta_end(self, entry: QueueEntry) -> None:
        if entry.store is None:
            self._write(entry, None)
        if not self._delta_count:
            self._delta_start = entry.seq
        self._delta_end = entry.seq + 1
        self._delta_count += 1

    def page_out(self, goal: int) -> int:
        """Move up to `goal` bytes of bodies from RAM to delta; returns how
        many were freed."""
        freed = 0
        while freed < goal and self._tail:
            entry = self._tail.popleft()
            self._to_delta_end(entry)
            freed += len(entry.message.body)
        while freed < goal and len(self._head) > HEAD_LOW:
            entry = self._head.pop()
            if entry.store is None:
                self._write(entry, None)
            if not self._delta_count:
                self._delta_end = entry.seq + 1
            self._delta_start = entry.seq
            self._delta_count += 1
            freed += len(entry.message.body)
        self.ram_bytes -= freed
        return freed

    def _load_delta(self) -> None:
        """Read the next segment of delta back into the head (off the loop)."""
        if self._loading or not self._delta_count or self._deleted:
            return
        self._loading = True
        segment = self._delta_start // self.index.segment_entries
        self.index.read_segment(segment, lambda result: self._segment_read(segment, result))

    def _segment_read(self, segment: int, result) -> None:
        self._loading = False
        if self._deleted:
            return
        if isinstance(result, Exception):
            raise result
        if not self._delta_count:
            return
        if segment != self._delta_start // self.index.segment_entries:
            # Paging moved delta's start to an earlier segment meanwhile.
            self._load_delta()
            return
        start, end = self._delta_start, self._delta_end
        found = [e for e in result if start <= e.seq < end]
        segment_end = (segment + 1) * self.index.segment_entries
        pending = [e for e in found if e.payload is None]
        loaded: dict[int, QueueEntry] = {}

        def finish() -> None:
            # Bookkeeping first, memory charge last: the charge may page
            # messages (these very ones) back out, which must see a
            # consistent delta range.
            added = 0
            for item in found:
                entry = loaded.get(item.seq)
                if entry is None:
                    continue  # its body was lost: reported by the store's recovery
                self._head.append(entry)
                added += len(entry.message.body)
            self.ram_bytes += added
            self._delta_count -= len(found)
            self._delta_start = min(segment_end, end)
            if self._delta_count <= 0 or self._delta_start >= end:
                self._delta_count = 0
                self._delta_start = self._delta_end = self._next_seq
                self._head.extend(self._tail)
                self._tail.clear()
            self.monitor.charge(added)
            if self.on_available is not None:
                self.on_available()

        for item in found:
            if item.payload is not None:
                loaded[item.seq] = self._entry_from(item, Message.from_bytes(item.payload, item.msg_id), _EMBEDDED)
        if not pending:
            finish()
            return
        remaining = [len(pending)]
        for item in pending:
            store = self.store if item.persistent else self.transient_store

            def got(payload, item=item, store=store) -> None:
                if not isinstance(payload, Exception):
                    loaded[item.seq] = self._entry_from(item, Message.from_bytes(payload, item.msg_id), store)
                remaining[0] -= 1
                if not remaining[0]:
                    finish()

            store.read(item.msg_id, got)

    @staticmethod
    def _entry_from(item, message: Message, store) -> QueueEntry:
        entry = QueueEntry(item.seq, message)
        entry.redelivered = item.delivered
        entry.store = store
        return entry

    def _drop_delta(self) -> None:
        """Ack everything in delta (purge/delete), reading segment by segment
        to learn which bodies to release from the stores."""
        if not self._delta_count:
            return
        start, end = self._delta_start, self._delta_end
        self._delta_count = 0
        self._delta_start = self._delta_end = self._next_seq
        size = self.index.segment_entries
        for segment in range(start // size, (end - 1) // size + 1):
            self.index.read_segment(segment, lambda result: self._drop_read(result, start, end))

    def _drop_read(self, result, start: int, end: int) -> None:
        if isinstance(result, Exception):
            return
        seqs = []
        for item in result:
            if start <= item.seq < end:
                if item.payload is None:
                    (self.store if item.persistent else self.transient_store).remove(item.msg_id)
                seqs.append(item.seq)
        if seqs and not self._deleted:
            self.index.ack(seqs)

    # -- recovery ------------------------------------------------------------

    def recovered(self, first_seq: int, count: int, ready_bytes: int) -> None:
        """At start: `count` ready messages (their bytes) wait on disk from
        `first_seq` on; they form delta and are read back as consumed."""
        if count:
            self._delta_start = first_seq
            self._delta_end = self._next_seq
            self._delta_count = count
            self.ready = count
            self.ready_bytes = ready_bytes
