"""Group commit: one thread does every file write and sync, in batches.

Theory of operation:
- The event loop calls `append(file, data, done)` and `run(fn, done)`; both
  only put a job on a queue (no file I/O on the loop).
- The writer thread takes *everything* pending, performs the jobs in
  submission order, then syncs each file it appended to once (`os.fsync` in
  durability "fsync", a flush to the OS in "flush"), and only then hands the
  batch's `done` callbacks back to the loop, in submission order. A file's
  appends between two `run` jobs go out as one write: one system call for
  many small records. Files that hold message bodies (`AppendFile.bodies`:
  the message stores) are written before the others, which may hold records
  referring to those bodies (queue indexes); otherwise in the order the
  files were first appended to. So a process killed between two writes
  never leaves an index record whose body was not written (the body of a
  small message appended to an index before a large one went to the store
  would otherwise put that index's write first). A confirm
  that waits for `done` therefore never precedes the sync of its bytes, and
  the cost of one fsync is shared by every write that arrived meanwhile.
- `written` counts the appends the thread has handed to the OS (failed ones
  included: nothing more will happen to them), `submitted` those queued.
  `when_written(mark, callback)` tells the loop when the first `mark`
  appends are written, before their sync: the connection's output waits on
  it after acks (amqp_server.shared.client, docs/storage.md "Acks"). Writing and
  syncing stay on one thread: a second thread for the syncs would let a
  write overtake a sync in progress, but its hand-over cost 20 % more broker
  CPU per message at a moderate persistent rate (docs/benchmarks.md).
- Reads go to a second thread (`read`), so a deep queue being read back never
  waits behind, or delays, a batch of writes.
- `AppendFile.size` is advanced on the loop at submission, so the offset of
  a record is known before it is written.
- A cluster's leader (docs/cluster.md) sets `gate`: the writer thread hands
  each batch's callbacks to `gate(fire)` instead of the loop, and the gate
  runs `fire` once the in-sync followers hold everything written so far and
  the leader's lease is valid (so no confirm leaves a stale leader). None on
  a single node: the callbacks go straight to the loop.
- Backpressure: `pending_bytes` (data plus JOB_OVERHEAD per append; changed
  on the loop only: added at
  submission, subtracted when a batch's completion reaches the loop) above
  BACKLOG_HIGH makes `backlogged` true; publishers then wait in
  `flow_waiters` until it falls under BACKLOG_LOW (credit flow to the disk).
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from typing import Callable

from storage import files

log = logging.getLogger("hutch.storage")

DURABILITY_MODES = ("fsync", "flush")
# What a queued append costs in RAM beyond its data (the job tuple, the
# bytes object): counted too, or millions of tiny records escape the marks.
JOB_OVERHEAD = 200
BACKLOG_HIGH = 64 * 1024 * 1024
BACKLOG_LOW = 16 * 1024 * 1024


class AppendFile:
    """A file only ever appended to, through the writer thread."""

    __slots__ = ("path", "size", "_fd", "sync", "bodies", "kept")

    def __init__(self, path: str, size: int | None = None, sync: bool = True, bodies: bool = False,
                 kept: bool = True) -> None:
        """`size`: the current size when the caller knows it (a new file: 0),
        so that constructing one on the loop does no file I/O. `sync`: False
        for a file that is never fsynced (durability "flush", or one no
        restart keeps). `bodies`: it holds message bodies that records in
        other files refer to, so a batch writes it first. `kept`: False for a
        file that never has to survive a restart (a non-durable queue's
        index, the transient store): a cluster does not replicate it either."""
        self.path = path
        if size is None:
            size = os.path.getsize(path) if os.path.exists(path) else 0
        self.size = size
        self._fd: int | None = None
        self.sync = sync
        self.bodies = bodies
        self.kept = kept

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if files.hook is not None and self.kept:
            end = os.lseek(self._fd, 0, os.SEEK_CUR)
            files.hook.file_changed(files.APPEND, self.path, end - len(data), data)

    def _sync(self) -> None:
        if self._fd is not None and self.sync:
            os.fsync(self._fd)

    def close(self) -> None:
        """Only on the writer thread (through `run`) or after `stop`."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_STOP = object()
_JOB = object()  # marks the callbacks of `run` and `read` jobs (counted in `in_flight`)


class GroupCommitWriter:
    def __init__(self, loop: asyncio.AbstractEventLoop, durability: str = "fsync") -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError("durability must be one of %s" % ", ".join(DURABILITY_MODES))
        self.loop = loop
        self.durability = durability
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._reads: queue.SimpleQueue = queue.SimpleQueue()
        self.batches = 0  # how many group commits ran (metrics, tests)
        self.submitted = 0  # appends queued (loop thread only)
        self.written = 0  # appends handed to the OS (writer thread only)
        # (mark, callback) of `when_written`; the writer thread only reads
        # whether it is empty.
        self._written_waiters: list = []
        # Syncs of a batch's files and the seconds they took (metrics; written
        # by the writer thread only).
        self.fsync_count = 0
        self.fsync_seconds = 0.0
        # `run`/`read` jobs whose `done` has not run on the loop yet: their
        # callbacks may queue more writes (a purge acks what it read back),
        # so a clean stop waits for 0 (BrokerServer.stop). Loop thread only.
        self.in_flight = 0
        self.pending_bytes = 0
        # Marks on pending_bytes (BrokerServer lowers them to a small memory budget).
        self.backlog_high = BACKLOG_HIGH
        self.backlog_low = BACKLOG_LOW
        # pending_bytes > backlog_high, kept with pending_bytes (every publish
        # asks: an attribute, not a property).
        self.backlogged = False
        self.flow_waiters: set = set()
        # `soon`: what queues deferred writes at the end of this loop turn.
        self._soon: dict[Callable[[], None], None] = {}
        # A cluster leader's replication gate (see the module docstring).
        self.gate: Callable[[Callable[[], None]], None] | None = None
        self._thread = threading.Thread(target=self._write_loop, name="hutch-writer", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="hutch-reader", daemon=True)
        self._thread.start()
        self._reader.start()

    # -- on the event loop ---------------------------------------------------

    def append(self, file: AppendFile, data: bytes, done: Callable[[], None] | None = None) -> int:
        """Queue `data` for `file`; returns the offset it will have."""
        offset = file.size
        file.size += len(data)
        self.pending_bytes += len(data) + JOB_OVERHEAD
        if self.pending_bytes > self.backlog_high:
            self.backlogged = True
        self.submitted += 1
        self._jobs.put((file, data, done))
        return offset

    def soon(self, record: Callable[[], None]) -> None:
        """`record()` (which queues writes nobody waits for, e.g. a queue
        index's "delivered" marks) runs at the end of this loop turn, or
        before a clean stop (`drained`, `stop`), whichever comes first; once
        however often it was asked for meanwhile."""
        if not self._soon:
            self.loop.call_soon(self._record_soon)
        self._soon[record] = None

    def _record_soon(self) -> None:
        pending, self._soon = self._soon, {}
        for record in pending:
            record()

    def when_written(self, mark: int, callback: Callable[[], None]) -> bool:
        """True when the first `mark` appends are written to the OS; else
        False, and `callback()` runs on the loop once they are."""
        if self.written >= mark:
            return True
        waiter = (mark, callback)
        self._written_waiters.append(waiter)
        # The writer may have passed `mark` before it could see the waiter.
        if self.written >= mark:
            self._written_waiters.remove(waiter)
            return True
        return False

    def _wake_written(self) -> None:
        written = self.written
        due = [w for w in self._written_waiters if w[0] <= written]
        if due:
            self._written_waiters = [w for w in self._written_waiters if w[0] > written]
            for _mark, callback in due:
                callback()

    def _written(self, size: int) -> None:
        self.pending_bytes -= size
        self.backlogged = self.pending_bytes > self.backlog_high
        if self.flow_waiters and self.pending_bytes < self.backlog_low:
            waiters, self.flow_waiters = self.flow_waiters, set()
            for waiter in waiters:
                waiter.unblocked(self)

    def run(self, fn: Callable[[], object], done: Callable[[object], None] | None = None) -> None:
        """Run a blocking `fn` on the writer thread after everything queued
        before it; `done(result or exception)` runs on the loop afterwards."""
        if done is not None:
            self.in_flight += 1
        self._jobs.put((None, fn, done))

    def read(self, fn: Callable[[], object], done: Callable[[object], None]) -> None:
        """Run a blocking read `fn` on the reader thread; `done(result or
        exception)` on the loop."""
        self.in_flight += 1
        self._reads.put((fn, done))

    async def drained(self, timeout: float = 5.0) -> None:
        """Until no `run` or `read` job is in flight (a clean stop waits for
        this before `stop`: their callbacks may queue more writes, e.g. the
        acks of a purge); gives up after `timeout` seconds."""
        self._record_soon()
        deadline = self.loop.time() + timeout
        while self.in_flight and self.loop.time() < deadline:
            done = self.loop.create_future()
            self.run(_nothing, done.set_result)
            await done

    def stop(self) -> None:
        """Finish every queued job and sync (blocking; at shutdown)."""
        self._record_soon()
        self._jobs.put(_STOP)
        self._reads.put(_STOP)
        self._thread.join()
        self._reader.join()

    # -- on the threads ------------------------------------------------------

    def _write_loop(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._jobs.get()]
            while True:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is _STOP:
                batch.pop()
                stopping = True
            self._commit(batch)

    def _commit(self, batch: list) -> None:
        """Invariant: a `done` of an append fires only when its bytes were
        written and (in fsync mode) synced; a failed write or sync withholds
        the confirms of that file's appends in the batch (they never come:
        the client sees no confirm rather than a false one)."""
        touched: dict[int, AppendFile] = {}
        failed: set[int] = set()
        callbacks: list = []
        appends: dict[int, tuple[AppendFile, list]] = {}  # not written yet
        written = count = 0
        for file, payload, done in batch:
            if file is None:
                # A job may close, rename or delete files: what was appended
                # before it must be written and synced first, or its `done`
                # would lie.
                failed |= self._write(appends, touched)
                self._written_out(count)
                count = 0
                failed |= self._sync(touched)
                touched.clear()
                result = _call(payload)
                if done is not None:
                    callbacks.append((done, (result,), _JOB))
                continue
            written += len(payload) + JOB_OVERHEAD
            count += 1
            key = id(file)
            pending = appends.get(key)
            if pending is None:
                appends[key] = (file, [payload])
            else:
                pending[1].append(payload)
            if done is not None:
                callbacks.append((done, (), key))
        failed |= self._write(appends, touched)
        self._written_out(count)
        failed |= self._sync(touched)
        self.batches += 1
        if failed:
            callbacks = [c for c in callbacks if c[2] not in failed]
        if written:
            callbacks.append((self._written, (written,), None))
        if callbacks:
            self._deliver(callbacks)

    def _written_out(self, count: int) -> None:
        """`count` more appends are written: wake the loop if it waits."""
        if count:
            self.written += count
            if self._written_waiters:
                self._call_on_loop(self._wake_written)

    @staticmethod
    def _write(appends: dict, touched: dict[int, AppendFile]) -> set[int]:
        """Write each file's pending appends with one call, body files first
        (see the module's docstring), then forget them; returns the ids of
        the files whose write failed."""
        failed: set[int] = set()
        for key, (file, payloads) in sorted(appends.items(), key=lambda item: not item[1][0].bodies):
            try:
                file._write(payloads[0] if len(payloads) == 1 else b"".join(payloads))
                touched[key] = file
            except OSError as exc:
                log.error("write to %s failed: %s", file.path, exc)
                failed.add(key)
        appends.clear()
        return failed

    def _sync(self, touched: dict[int, AppendFile]) -> set[int]:
        """Sync the files (fsync mode); returns the ids of those that failed."""
        failed: set[int] = set()
        if self.durability != "fsync" or not touched:
            return failed
        started = time.perf_counter()
        for key, file in touched.items():
            try:
                file._sync()
            except OSError as exc:
                log.error("fsync of %s failed: %s", file.path, exc)
                failed.add(key)
        self.fsync_seconds += time.perf_counter() - started
        self.fsync_count += 1
        return failed

    def _read_loop(self) -> None:
        while True:
            job = self._reads.get()
            if job is _STOP:
                return
            fn, done = job
            self._deliver([(done, (_call(fn),), _JOB)], gated=False)

    def _deliver(self, callbacks: list, gated: bool = True) -> None:
        def fire() -> None:
            for done, args, file in callbacks:
                if file is _JOB:  # the `done` of a `run` or `read`
                    self.in_flight -= 1
                done(*args)

        gate = self.gate
        if gate is not None and gated:
            gate(fire)
            return
        self._call_on_loop(fire)

    def _call_on_loop(self, fn: Callable[[], None]) -> None:
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more


def _nothing() -> None:
    return None


def _call(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:  # handed to the caller's `done`
        log.exception("storage job failed")
        return exc
