"""The backing queue of a durable queue: RabbitMQ's variable queue, simplified.

A ready message is in one of the states of docs/storage.md, "Message states":
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
  `ram_bytes` what the messages in RAM cost (body + ENTRY_OVERHEAD each),
  which the memory monitor budgets; at most max(RAM_MESSAGES, HEAD_LOW +
  one segment) in the head and RAM_MESSAGES_LOW in the tail per queue.
- A persistent message's publish calls `on_durable` once: after its index
  record (written after its body) went through a group commit, or when it is
  acked before that (`_unconfirmed`), whichever comes first. A message
  consumed and acked has been handled, so its confirm no longer waits for
  the disk (RabbitMQ's message store confirms a message removed before its
  write the same way); nothing confirmed is lost by a crash that follows:
  it is on disk or it was acked.
- Paging out takes the messages next to delta, so the range stays contiguous:
  the oldest of `_tail`, then the newest of `_head`.
- `remove` (expiry) marks RAM entries OUT and leaves them in place; `fetch`
  and `page_out` skip them, and the containers are rebuilt once they are
  more than half of what is held (`_removed` counts them). A paged-out
  entry is marked PAGED (the queue's expiry heap then skips it).
- Expiry in delta: `_segment_expiry[segment]` is a lower bound of the
  expiries of the messages of that index segment in delta (no key: none has
  one), kept from what was paged out (or recovered). `delta_expiry` is the
  earliest of them, but never before SCAN_INTERVAL after the last scan, so
  expiries on disk are batched. `expire_delta` reads only the segments whose
  bound has passed, one at a time (off the loop), takes every expired
  message out of the ready set (counts drop at once) and hands them over,
  read back, to be dead-lettered; like fetched entries they wait for `ack`.
  Their seqs stay in `_taken` until then, and any read of delta (scan, read
  back, purge) keeps only seqs that are still live in the index and not
  taken, so nothing is counted or served twice. A scanned segment's bound
  becomes the earliest expiry it still holds (or what was paged into it
  meanwhile).
"""
from __future__ import annotations

import heapq
from collections import deque
from itertools import islice
from typing import Callable, Iterable

from storage.backing_queue import OUT, PAGED, READY, QueueEntry
from storage.message import Message
from storage.msg_store import MessageStore
from storage.queue_index import QueueIndex

# Keep at least this many messages in RAM at the head, and read the next
# delta segment once fewer remain.
HEAD_LOW = 256
# Each queue keeps at most this many ready messages in its head, whatever the
# memory budget (as RabbitMQ 3.12+ classic queues do); past it, it pages its
# newest ones out down to RAM_MESSAGES_LOW. While delta is read back, the
# head holds what was read (up to one segment) and only the tail pages out,
# once it has more than RAM_MESSAGES_LOW messages: paging the head would
# write out again what was just read, and a consumer would wait for the
# same segment over and over.
RAM_MESSAGES = 2048
RAM_MESSAGES_LOW = 1024
# What a message held in RAM costs beyond its body (entry, message object,
# header bytes): the memory monitor is charged body + this.
ENTRY_OVERHEAD = 400
_EMBEDDED = "index"  # entry.store for a message embedded in the queue index
COMPACT_ABOVE = 1024  # removed entries tolerated in RAM before a rebuild is considered
SCAN_INTERVAL = 100  # ms: at least this long between two scans of delta for expired messages


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
        # The segment being read back, and whether delta changed there (or
        # below) since the read was asked for: then the read is done again.
        self._loading_segment = -1
        self._reload = False
        self._deleted = False
        self._removed = 0
        self._segment_expiry: dict[int, int] = {}
        self._next_scan = 0
        self._scanning = False
        self._taken: set[int] = set()
        # seq -> `on_durable` of the persistent publishes not yet confirmed.
        self._unconfirmed: dict[int, Callable[[], None]] = {}
        # Seqs below this were recovered after an unclean shutdown: delivered
        # or not, they go out redelivered (see `recovered`).
        self._delivered_below = 0
        self.ready = 0
        self.ready_bytes = 0
        self.ram_bytes = 0
        # Body bytes of the persistent entries live in the index (ready or
        # not): what a restart recovers (the index summary records it).
        self.persistent_bytes = 0
        # Called when messages read back from delta become available.
        self.on_available: Callable[[], None] | None = None
        # Called with the entries read back from delta, before `on_available`.
        self.on_loaded: Callable[[list[QueueEntry]], None] | None = None
        monitor.register(self)

    # -- BackingQueue --------------------------------------------------------

    def persists(self, message: Message) -> bool:
        return self.durable and message.persistent

    def publish(self, message: Message, on_durable: Callable[[], None] | None = None,
                expiry: int = 0) -> QueueEntry:
        seq = self._next_seq
        self._next_seq = seq + 1
        entry = QueueEntry(seq, message, expiry)
        size = len(message.body)
        self.ready += 1
        self.ready_bytes += size
        if self.durable and message.persistent:
            self._write(entry, on_durable)
        (self._tail if self._delta_count else self._head).append(entry)
        cost = size + ENTRY_OVERHEAD
        self.ram_bytes += cost
        self.monitor.charge(cost)
        if self._delta_count:
            if len(self._tail) > RAM_MESSAGES_LOW:
                freed = self._page_out_tail(self.ram_bytes)
                self.ram_bytes -= freed
                self.monitor.charge(-freed)
        elif len(self._head) > RAM_MESSAGES:
            average = self.ram_bytes // (len(self._head) + len(self._requeued))
            self.monitor.charge(-self.page_out((len(self._head) - RAM_MESSAGES_LOW) * average))
        return entry

    def publish_delivered(self, message: Message, on_durable: Callable[[], None] | None = None) -> QueueEntry:
        """BackingQueue.publish_delivered: the entry never joins the ready
        messages in RAM. A persistent message in a durable queue is written
        with a record that marks it delivered as well."""
        seq = self._next_seq
        self._next_seq = seq + 1
        entry = QueueEntry(seq, message)
        entry.state = OUT
        if self.durable and message.persistent:
            self._write(entry, on_durable, delivered=True)
        return entry

    def _confirm(self, seq: int) -> None:
        on_durable = self._unconfirmed.pop(seq, None)
        if on_durable is not None:
            on_durable()

    def fetch(self) -> QueueEntry | None:
        while True:
            if self._requeued:
                entry = heapq.heappop(self._requeued)
            elif self._head:
                entry = self._head.popleft()
            else:
                if self._delta_count:
                    self._load_delta()
                return None
            if entry.state == READY:
                break
            self._removed -= 1
        entry.state = OUT
        size = len(entry.message.body)
        self.ready -= 1
        self.ready_bytes -= size
        self.ram_bytes -= size + ENTRY_OVERHEAD
        self.monitor.charge(-size - ENTRY_OVERHEAD)
        if entry.store is not None:
            self.index.deliver((entry.seq,))
        if self._delta_count and len(self._head) < HEAD_LOW:
            self._load_delta()
        return entry

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        seqs = []
        removed = []
        persistent_bytes = 0
        taken = self._taken
        for entry in entries:
            store = entry.store
            if store is None:
                continue
            if taken:
                taken.discard(entry.seq)
            if store is not _EMBEDDED:
                removed.append((store, entry.message.msg_id))
            if entry.message.persistent:
                persistent_bytes += len(entry.message.body)
            seqs.append(entry.seq)
        if self.durable:
            self.persistent_bytes -= persistent_bytes
        # ACK records first: a removal may compact or delete the store file
        # (writer jobs, run in submission order), and a crash in between must
        # not leave an unacked index entry whose body is gone.
        if seqs and not self._deleted:
            self.index.ack(seqs)
        for store, msg_id in removed:
            store.remove(msg_id)
        if self._unconfirmed:
            for seq in seqs:
                self._confirm(seq)

    def remove(self, entries: Iterable[QueueEntry]) -> list[QueueEntry]:
        """Take ready entries in RAM out of the ready set; returns those that were."""
        removed = []
        freed = 0
        for entry in entries:
            if entry.state != READY:
                continue
            entry.state = OUT
            size = len(entry.message.body)
            self.ready -= 1
            self.ready_bytes -= size
            freed += size + ENTRY_OVERHEAD
            removed.append(entry)
        self._removed += len(removed)
        self.ram_bytes -= freed
        self.monitor.charge(-freed)
        held = len(self._requeued) + len(self._head) + len(self._tail)
        if self._removed > COMPACT_ABOVE and self._removed * 2 > held:
            self._requeued = [e for e in self._requeued if e.state == READY]
            heapq.heapify(self._requeued)
            self._head = deque(e for e in self._head if e.state == READY)
            self._tail = deque(e for e in self._tail if e.state == READY)
            self._removed = 0
        return removed

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        for entry in entries:
            entry.redelivered = True
            entry.state = READY
            heapq.heappush(self._requeued, entry)
            size = len(entry.message.body)
            self.ready += 1
            self.ready_bytes += size
            self.ram_bytes += size + ENTRY_OVERHEAD
            self.monitor.charge(size + ENTRY_OVERHEAD)

    def purge(self) -> int:
        count = self.ready
        in_ram = [e for q in (self._requeued, self._head, self._tail) for e in q if e.state == READY]
        for entry in in_ram:
            entry.state = OUT
        self._requeued.clear()
        self._head.clear()
        self._tail.clear()
        self._removed = 0
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
        gamma = sum(1 for q in (self._requeued, self._head, self._tail) for e in q
                    if e.store is not None and e.state == READY)
        in_ram = len(self._requeued) + len(self._head) + len(self._tail) - self._removed
        return {"alpha": in_ram - gamma, "gamma": gamma, "delta": self._delta_count}

    def peek(self, count: int, done: Callable[[list[QueueEntry] | Exception], None]) -> None:
        """RAM entries as they are; delta read back segment by segment as
        copies (reads queued behind pending writes, off the loop), nothing
        changed. Delta's range and the tail are taken at the call: what
        consumers take meanwhile is left out, as a later read finds it acked."""
        found = heapq.nsmallest(count, self._requeued)
        found.extend(islice(self._head, count - len(found)))
        tail = list(islice(self._tail, count - len(found)))
        if len(found) >= count or not self._delta_count:
            done(found + tail[:count - len(found)])
            return
        start, end = self._delta_start, self._delta_end
        size = self.index.segment_entries
        segments = iter(range(start // size, (end - 1) // size + 1))

        def next_segment() -> None:
            segment = next(segments, None)
            if segment is None or len(found) >= count:
                done(found + tail[:count - len(found)])
            else:
                self.index.read_segment(segment, read)

        def read(result) -> None:
            if isinstance(result, Exception):
                done(result)
                return
            items = [item for item in result if start <= item.seq < end][:count - len(found)]
            copies: dict[int, QueueEntry] = {}
            waiting = [sum(1 for item in items if item.payload is None) + 1]

            def copied() -> None:
                waiting[0] -= 1
                if not waiting[0]:
                    found.extend(copies[item.seq] for item in items if item.seq in copies)
                    next_segment()

            for item in items:
                if item.payload is not None:
                    copies[item.seq] = self._entry_from(item, Message.from_bytes(item.payload, item.msg_id), None)
                else:
                    def got(payload, item=item) -> None:
                        if not isinstance(payload, Exception):  # consumed and acked meanwhile
                            copies[item.seq] = self._entry_from(item, Message.from_bytes(payload, item.msg_id), None)
                        copied()
                    (self.store if item.persistent else self.transient_store).read(item.msg_id, got)
            copied()

        next_segment()

    # -- disk ----------------------------------------------------------------

    def _write(self, entry: QueueEntry, on_durable: Callable[[], None] | None = None,
               delivered: bool = False) -> None:
        """Index record (and body in a store unless small enough to embed);
        `on_durable` once, after the group commit that holds the index record
        (submitted after the body) or at the entry's ack if that comes first
        (`_unconfirmed`). `delivered`: the entry is taken already (the record
        marks it delivered)."""
        done = None
        if on_durable is not None:
            seq = entry.seq
            self._unconfirmed[seq] = on_durable
            done = lambda: self._confirm(seq)  # noqa: E731
        message = entry.message
        payload = message.to_bytes()
        persistent = self.durable and message.persistent
        if persistent:
            self.persistent_bytes += len(message.body)
        if len(payload) < self.index.embed_below:
            entry.store = _EMBEDDED
        else:
            store = self.store if persistent else self.transient_store
            store.write(message.msg_id, payload)
            entry.store = store
        self.index.publish(entry.seq, message.msg_id, len(message.body), payload, expiry=entry.expiry,
                           persistent=persistent, done=done, delivered=delivered)

    def _delta_added(self, seq: int) -> None:
        """`seq` joined delta: a read in flight of its segment (or of a later
        one) did not see it, so it must not move delta's start past it."""
        if self._loading and seq // self.index.segment_entries <= self._loading_segment:
            self._reload = True

    def _to_delta_end(self, entry: QueueEntry) -> None:
        self._paged_expiry(entry)
        if entry.store is None:
            self._write(entry)
        self._delta_added(entry.seq)
        if not self._delta_count:
            self._delta_start = entry.seq
        self._delta_end = entry.seq + 1
        self._delta_count += 1

    def page_out(self, goal: int) -> int:
        """Move messages worth `goal` bytes of RAM (bodies and overhead) to
        delta (the tail first, then the newest of the head); returns how much
        was freed."""
        freed = self._page_out_tail(goal)
        while freed < goal and len(self._head) > HEAD_LOW:
            entry = self._head.pop()
            if entry.state != READY:
                self._removed -= 1
                continue
            entry.state = PAGED
            self._paged_expiry(entry)
            if entry.store is None:
                self._write(entry)
            self._delta_added(entry.seq)
            if not self._delta_count:
                self._delta_end = entry.seq + 1
            self._delta_start = entry.seq
            self._delta_count += 1
            freed += len(entry.message.body) + ENTRY_OVERHEAD
        self.ram_bytes -= freed
        return freed

    def _page_out_tail(self, goal: int) -> int:
        """The oldest of the tail to delta's end, `goal` bytes' worth at
        least (or all of it); returns the bytes freed, which the caller
        takes off `ram_bytes`."""
        freed = 0
        while freed < goal and self._tail:
            entry = self._tail.popleft()
            if entry.state != READY:
                self._removed -= 1
                continue
            entry.state = PAGED
            self._to_delta_end(entry)
            freed += len(entry.message.body) + ENTRY_OVERHEAD
        return freed

    @property
    def delta_expiry(self) -> int:
        """When the next message on disk expires (0: none will)."""
        if not self._segment_expiry:
            return 0
        return max(min(self._segment_expiry.values()), self._next_scan)

    def disk_due(self, now: int) -> int:
        """The first seq of delta when a message there may have expired by
        `now` (a segment's bound has passed, or a scan is under way), else -1."""
        if self._delta_count and (self._scanning or any(bound <= now for bound in self._segment_expiry.values())):
            return self._delta_start
        return -1

    def _paged_expiry(self, entry: QueueEntry) -> None:
        expiry = entry.expiry
        if expiry:
            segment = entry.seq // self.index.segment_entries
            known = self._segment_expiry.get(segment)
            if known is None or expiry < known:
                self._segment_expiry[segment] = expiry

    def _usable(self, item, start: int, end: int) -> bool:
        """Whether an entry read from delta still belongs there."""
        return start <= item.seq < end and item.seq not in self._taken and self.index.is_live(item.seq)

    def expire_delta(self, now: int, done: Callable[[list[QueueEntry]], None]) -> None:
        """Take the messages of delta expired at `now` out of the ready set
        (see the module docstring); `done(entries)` runs on the loop with
        them read back, once the scan is over."""
        if self._scanning or self._deleted:
            return
        due = sorted(segment for segment, expiry in self._segment_expiry.items() if expiry <= now)
        if not due:
            return
        self._scanning = True
        self._next_scan = now + SCAN_INTERVAL
        for segment in due:  # what is paged into them during the scan sets a new bound
            del self._segment_expiry[segment]
        expired: list = []

        def read_next() -> None:
            if self._deleted:
                self._scanning = False
            elif not due:
                self._finish_scan(expired, done)
            else:
                segment = due.pop(0)
                self.index.read_segment(segment, lambda result: scanned(segment, result))

        def scanned(segment: int, result) -> None:
            if isinstance(result, Exception):
                raise result
            start, end = self._delta_start, self._delta_end
            left = 0
            for item in result:
                if not item.expiry or not self._usable(item, start, end):
                    continue
                if item.expiry <= now:
                    self._taken.add(item.seq)
                    self._delta_count -= 1
                    self.ready -= 1
                    self.ready_bytes -= item.size
                    expired.append(item)
                elif not left or item.expiry < left:
                    left = item.expiry
            if left:
                known = self._segment_expiry.get(segment)
                self._segment_expiry[segment] = left if known is None else min(known, left)
            read_next()

        read_next()

    def _finish_scan(self, expired: list, done) -> None:
        if self._delta_count <= 0 and not self._loading:
            self._delta_emptied()
        entries: list[QueueEntry] = []
        pending = [len(expired)]

        def finish() -> None:
            self._scanning = False
            for entry in entries:
                entry.state = OUT
            done(entries)

        if not expired:
            finish()
            return
        for item in expired:
            if item.payload is not None:
                entries.append(self._entry_from(item, Message.from_bytes(item.payload, item.msg_id), _EMBEDDED))
                pending[0] -= 1
                continue
            store = self.store if item.persistent else self.transient_store

            def got(payload, item=item, store=store) -> None:
                if isinstance(payload, Exception):  # its body is lost (logged by the store)
                    self._taken.discard(item.seq)
                    self.index.ack((item.seq,))
                else:
                    entries.append(self._entry_from(item, Message.from_bytes(payload, item.msg_id), store))
                pending[0] -= 1
                if not pending[0]:
                    finish()

            store.read(item.msg_id, got)
        if not pending[0]:
            finish()

    def _load_delta(self) -> None:
        """Read the next segment of delta back into the head (off the loop)."""
        if self._loading or not self._delta_count or self._deleted:
            return
        self._loading = True
        segment = self._delta_start // self.index.segment_entries
        self._loading_segment = segment
        self._reload = False
        self.index.read_segment(segment, lambda result: self._segment_read(segment, result))

    def _segment_read(self, segment: int, result) -> None:
        self._loading = False
        if self._deleted:
            return
        if isinstance(result, Exception):
            raise result
        if not self._delta_count:
            return
        if self._reload or segment != self._delta_start // self.index.segment_entries:
            # Paging moved delta's start to an earlier segment meanwhile, or
            # added entries the read did not see: read again.
            self._load_delta()
            return
        start, end = self._delta_start, self._delta_end
        found = [e for e in result if self._usable(e, start, end)]
        segment_end = (segment + 1) * self.index.segment_entries
        pending = [e for e in found if e.payload is None]
        loaded: dict[int, QueueEntry] = {}

        def finish() -> None:
            self._loading = False
            if self._reload:  # delta changed while the bodies were read (paging, a purge)
                self._load_delta()
                return
            # acked or expired (expire_delta) while the bodies were read
            found[:] = [item for item in found if item.seq not in self._taken and self.index.is_live(item.seq)]
            # Bookkeeping first, memory charge last: the charge may page
            # messages (these very ones) back out, which must see a
            # consistent delta range.
            added = 0
            lost = []
            read_back = []
            for item in found:
                entry = loaded.get(item.seq)
                if entry is None:
                    # Its body was lost (logged by the store): it is no longer
                    # ready, and acked so the index forgets it.
                    lost.append(item.seq)
                    self.ready -= 1
                    self.ready_bytes -= item.size
                    if item.persistent:
                        self.persistent_bytes -= item.size
                    continue
                self._head.append(entry)
                read_back.append(entry)
                added += len(entry.message.body) + ENTRY_OVERHEAD
            if lost:
                self.index.ack(lost)
            self.ram_bytes += added
            self._delta_count -= len(found)
            self._delta_start = min(segment_end, end)
            self._segment_expiry.pop(segment, None)
            if self._delta_count <= 0 or self._delta_start >= end:
                self._delta_emptied()
            self.monitor.charge(added)
            if self.on_loaded is not None:
                self.on_loaded(read_back)
            if self.on_available is not None:
                self.on_available()

        for item in found:
            if item.payload is not None:
                loaded[item.seq] = self._entry_from(item, Message.from_bytes(item.payload, item.msg_id), _EMBEDDED)
        if not pending:
            finish()
            return
        self._loading = True  # until `finish`: changes to delta meanwhile set `_reload`
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

    def _entry_from(self, item, message: Message, store) -> QueueEntry:
        entry = QueueEntry(item.seq, message, item.expiry)
        entry.redelivered = item.delivered or item.seq < self._delivered_below
        entry.store = store
        return entry

    def _delta_emptied(self) -> None:
        """Nothing is left in delta: new messages join the head again."""
        self._delta_count = 0
        self._delta_start = self._delta_end = self._next_seq
        self._segment_expiry.clear()
        self._head.extend(self._tail)
        self._tail.clear()

    def _drop_delta(self) -> None:
        """Ack everything in delta (purge/delete), reading segment by segment
        to learn which bodies to release from the stores."""
        if not self._delta_count:
            return
        start, end = self._delta_start, self._delta_end
        self._delta_count = 0
        self._delta_start = self._delta_end = self._next_seq
        self._segment_expiry.clear()
        self._reload = self._loading  # a read back in flight must not add these to the head
        size = self.index.segment_entries
        for segment in range(start // size, (end - 1) // size + 1):
            self.index.read_segment(segment, lambda result: self._drop_read(result, start, end))

    def _drop_read(self, result, start: int, end: int) -> None:
        if isinstance(result, Exception):
            return
        seqs = [item for item in result if self._usable(item, start, end)]
        # Ack records first, as in `ack`: a crash must never leave an index
        # entry whose body the store already let go.
        if seqs and not self._deleted:
            self.index.ack([item.seq for item in seqs])
        for item in seqs:
            if item.persistent:
                self.persistent_bytes -= item.size
            if item.payload is None:
                (self.store if item.persistent else self.transient_store).remove(item.msg_id)

    # -- recovery ------------------------------------------------------------

    def recovered(self, first_seq: int, count: int, ready_bytes: int, unclean: bool = False,
                  segment_expiry: dict[int, int] | None = None) -> None:
        """At start: `count` ready messages (their bytes) wait on disk from
        `first_seq` on; they form delta and are read back as consumed.
        `unclean`: the broker was not stopped cleanly, so a delivery may have
        reached a client before its DELIVER record reached the disk; as
        RabbitMQ after an unclean shutdown, every recovered message is
        delivered with redelivered=true."""
        if unclean:
            self._delivered_below = self._next_seq
        if count:
            self._delta_start = first_seq
            self._delta_end = self._next_seq
            self._delta_count = count
            self.ready = count
            self.ready_bytes = self.persistent_bytes = ready_bytes
            self._segment_expiry = dict(segment_expiry or {})
