"""The replication stream: the leader sends every change to its data files to
the followers, in order, and holds durability replies until they have it.

Theory of operation (leader side, `Replicator`):
- It is `storage.files.hook`: every file change the storage makes becomes a
  record (storage.replica) appended, under a lock, to the pending stream;
  `position` counts the bytes of all records ever produced. The records go
  out on the loop, to every follower link, in production order.
- It is the storage writer's `gate`: a batch's callbacks (publisher
  confirms among them) are held with the position at the batch's end, and
  run once the lease is valid (fencing) and the followers have it:
  - `min_in_sync` 0 (unset): every *required* follower has acknowledged
    that position (without followers they run at once);
  - `min_in_sync` N: N followers *in sync* (recorded in etcd's set) have
    acknowledged it; joining followers neither count nor are waited for,
    and while fewer than N are in sync nothing is released. The others may
    lack the change: the election takes the running in-sync node that
    holds the most of this stream (amqp_server.cluster.node), so a
    confirmed change survives while one of the N followers that had it
    is still running and in the in-sync set.
- A follower connects to the replication port, passes the cluster
  handshake (amqp_server.cluster.gateway: only a running member holding
  the secret gets a `FollowerLink`) and sends LISTING, its files. At a
  point P of the stream (a writer job: no write is half done) the leader
  notes its files' sizes and starts queueing the records after P for it;
  it then sends the differences (storage.replica.differences), the SQLite
  databases whole, SNAPSHOT_END(P) and the queued records. The follower
  acknowledges positions once records are applied and synced.
- Memory towards a follower is bounded: the snapshot is read from disk only
  as fast as the follower takes it (at most SNAPSHOT_BUFFER bytes wait in
  its connection's buffer); the records produced meanwhile, and the live
  stream's unsent bytes, may reach `max_lag_bytes`, beyond which the
  follower is dropped (it reconnects and syncs again, by checksum).
- Both ends send HEARTBEAT every `timeout`/4 and close a connection that
  brought nothing for `timeout` seconds: a follower cut off by a partition
  is dropped (and leaves the in-sync set), and reconnects once it heals.
- Joining: once a follower has applied the snapshot and is within
  `max_lag_bytes`, it becomes *required* at the current position J; when it
  acknowledges J it holds every change ever confirmed, and is recorded in
  etcd's in-sync set (only such nodes may be elected).
- Leaving: a required follower further behind than `max_lag_bytes`, or
  holding back a reply for longer than `max_lag_seconds` (with N set: an
  in-sync one that has not acknowledged a reply still short of N), or
  disconnected, is removed from etcd's in-sync set *first*, and only then
  stops being required: with `min_in_sync` 0 an electable node never
  misses a confirmed change.
- The stream's positions are this leader's: SNAPSHOT_END carries its
  `term` (its lease id), so a follower can say which stream its position
  counts (the election compares positions of one term only).

The follower's end: amqp_server.cluster.follower; the framing: stream.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import threading
import time
from typing import Callable

from amqp_server.cluster.stream import ACK, HEARTBEAT, LISTING, MAX_CONTROL, SNAPSHOT_END, Frames, control
from storage import files, replica

log = logging.getLogger("hutch.cluster")

CHECK_SECONDS = 0.1
SNAPSHOT_BUFFER = 4 * 1024 * 1024  # bytes of snapshot waiting in a follower's connection, at most (about)


class FollowerLink(asyncio.Protocol):
    """One follower's replication connection, on the leader, once the
    handshake named it (amqp_server.cluster.gateway)."""

    def __init__(self, replicator: "Replicator", name: str) -> None:
        self.replicator = replicator
        self.frames = Frames(MAX_CONTROL)
        self.transport = None
        self.name = name
        self.state = "syncing"  # -> following -> joining -> recording -> in sync; dropped, closed
        self.listed = False  # LISTING received
        self.backlog: list[bytes] | None = None  # records after the snapshot point, until it is sent
        self.backlog_bytes = 0
        self.snapshot_end = 0  # the snapshot point P
        self.acked = 0
        self.acked_at = time.monotonic()
        self.joined_at: int | None = None  # position J at which it became required
        self.heard = self.told = time.monotonic()  # last bytes from it, last heartbeat to it
        self._room = asyncio.Event()  # its connection's buffer is under the high mark
        self._room.set()

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=SNAPSHOT_BUFFER)
        self.replicator.connected.add(self)
        log.info("follower %s connected", self.name)

    def data_received(self, data: bytes) -> None:
        self.heard = time.monotonic()
        try:
            for kind, payload, _size in self.frames.feed(data):
                message = json.loads(payload)
                if kind == LISTING and not self.listed:
                    self.listed = True
                    files = message["files"]
                    if not isinstance(files, dict):
                        raise ValueError("a listing that is not an object")
                    log.info("follower %s: %d files to compare", self.name, len(files))
                    self.replicator.start_snapshot(self, files)
                elif kind == ACK and self.listed:
                    self.acked = int(message["position"])
                    self.acked_at = time.monotonic()
                    self.replicator.acknowledged(self)
                elif kind != HEARTBEAT:
                    raise ValueError("unexpected record kind %d" % kind)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("follower %s: %s; closing", self.name, exc)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        log.info("follower %s disconnected", self.name)
        self.state = "closed"
        self._room.set()  # a snapshot waiting for room ends
        self.replicator.lost(self)

    def pause_writing(self) -> None:
        self._room.clear()

    def resume_writing(self) -> None:
        self._room.set()

    def send(self, records: list[tuple[int, bytes]], data: bytes) -> None:
        """`records`: (position after it, record), in order; `data`: all of them."""
        if self.state in ("closed", "dropped"):
            return
        limit = self.replicator.max_lag_bytes
        if self.backlog is not None:
            for end, record in records:
                if end > self.snapshot_end:
                    self.backlog.append(record)
                    self.backlog_bytes += len(record)
            if self.backlog_bytes > limit:
                self.replicator.drop(self, "%d bytes of changes waiting while it syncs" % self.backlog_bytes)
            return
        self.transport.write(data)
        waiting = self.transport.get_write_buffer_size()
        if waiting > limit:
            self.replicator.drop(self, "%d bytes waiting to be sent to it" % waiting)

    async def put(self, record: bytes) -> None:
        """A snapshot's record, once its connection's buffer has room
        (amqp_server.cluster.replication's bound on memory)."""
        while not self._room.is_set():
            await self._room.wait()
        if self.state in ("closed", "dropped"):
            raise ConnectionError("follower %s disconnected" % self.name)
        self.transport.write(record)


class Replicator:
    def __init__(self, loop: asyncio.AbstractEventLoop, root: str, writer, definitions, mqtt_store,
                 lease_valid: Callable[[], bool], term: int, min_in_sync: int, max_lag_bytes: int,
                 max_lag_seconds: float, record_in_sync: Callable[[list[str]], "asyncio.Future"],
                 timeout: float) -> None:
        self.loop = loop
        self.root = os.path.abspath(root)
        self.writer = writer
        self.definitions = definitions
        self.mqtt_store = mqtt_store
        self.lease_valid = lease_valid
        self.term = term  # names this leader's stream (its lease id)
        self.min_in_sync = min_in_sync
        self.max_lag_bytes = max_lag_bytes
        self.max_lag_seconds = max_lag_seconds
        self.record_in_sync = record_in_sync  # async: write etcd's in-sync list (followers' names)
        self.timeout = timeout  # seconds of silence after which a follower is dropped
        self._lock = threading.Lock()
        self.position = 0
        self._pending: list[tuple[int, bytes]] = []  # (position after it, record)
        self._holds: list[tuple[int, Callable[[], None]]] = []
        self._scheduled = False
        self.connected: set[FollowerLink] = set()  # every follower's connection (heartbeats, timeouts)
        self.links: list[FollowerLink] = []  # those the stream goes to: from their snapshot point on
        self.required: list[FollowerLink] = []
        self.in_sync: list[str] = []  # as recorded in etcd
        self.waiting: collections.deque = collections.deque()  # (position, fire, since)
        self.withheld = 0
        self._changing = asyncio.Lock()
        self._checker: asyncio.Task | None = None
        self.stopping = False

    def start(self) -> None:
        """Followers connect through the gateway (`link`) from now on."""
        self._checker = self.loop.create_task(self._check_lag())
        files.hook = self
        self.writer.gate = self.gate

    def link(self, name: str) -> FollowerLink:
        """A new connection of follower `name`: any older one of the same
        name (left half open by a partition, say) is dropped first, so that
        its leaving the in-sync set comes before the new one's joining."""
        for old in [link for link in self.connected if link.name == name and link.state not in ("dropped", "closed")]:
            self.drop(old, "it connected again")
        return FollowerLink(self, name)

    def stop(self) -> None:
        """The leader stops leading (a clean stop, a hand-over): the in-sync
        set stays as it is, so one of those followers takes over."""
        self.stopping = True
        files.hook = None
        self.writer.gate = None
        if self._checker is not None:
            self._checker.cancel()
        for link in list(self.connected):
            link.transport.close()

    # -- producing (any thread) ------------------------------------------------

    def file_changed(self, kind: int, path: str, offset: int, data: bytes) -> None:
        relative = os.path.relpath(path, self.root)
        if relative.startswith(".."):
            return
        if kind == files.RENAME:
            data = os.path.relpath(data.decode(), self.root).encode()
        if kind == files.APPEND:
            records = replica.append_records(relative, offset, data)
        elif kind == files.WRITE:
            records = replica.write_records(relative, data)
        else:
            records = [replica.file_record(kind, relative, offset, data)]
        with self._lock:
            for record in records:
                self.position += len(record)
                self._pending.append((self.position, record))
            self._wake()

    def gate(self, fire: Callable[[], None]) -> None:
        with self._lock:
            self._holds.append((self.position, fire))
            self._wake()

    def _wake(self) -> None:
        """Under the lock: one hand-over to the loop per loop turn."""
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:
                pass  # the loop is closed

    # -- on the loop -------------------------------------------------------------

    def _flush(self) -> None:
        with self._lock:
            self._scheduled = False
            pending, self._pending = self._pending, []
            holds, self._holds = self._holds, []
        if pending:
            data = b"".join(record for _end, record in pending)
            for link in self.links:
                link.send(pending, data)
        now = time.monotonic()
        for position, fire in holds:
            self.waiting.append((position, fire, now))
        self._release()

    def _satisfied(self, position: int) -> bool:
        if not self.min_in_sync:
            return all(link.acked >= position for link in self.required)
        have = sum(1 for link in self.required if link.state == "in sync" and link.acked >= position)
        return have >= self.min_in_sync

    def _holding(self, link: FollowerLink, oldest) -> bool:
        """Whether the oldest waiting reply waits for `link`: it has not
        acknowledged it and, with N set, is in sync (only those count)."""
        return oldest is not None and link.acked < oldest[0] and \
            (not self.min_in_sync or link.state == "in sync")

    def _release(self) -> None:
        waiting = self.waiting
        while waiting and self._satisfied(waiting[0][0]):
            position, fire, _since = waiting.popleft()
            if not self.lease_valid():
                self.withheld += 1
                continue  # fencing: a stale leader promises nothing
            fire()

    def acknowledged(self, link: FollowerLink) -> None:
        if link.state == "following" and link.acked >= link.snapshot_end and \
                self.position - link.acked <= self.max_lag_bytes:
            link.state = "joining"
            link.joined_at = self.position
            self.required.append(link)
        if link.state == "joining" and link.acked >= link.joined_at:
            link.state = "recording"
            self.loop.create_task(self._record(link, True))
        self._release()

    def lost(self, link: FollowerLink) -> None:
        self.connected.discard(link)
        if link in self.links:
            self.links.remove(link)
        if link in self.required and not self.stopping:
            self.loop.create_task(self._record(link, False))

    async def _record(self, link: FollowerLink, joining: bool) -> None:
        """Change etcd's in-sync set, then act on it (see the theory above)."""
        async with self._changing:
            names = [n for n in self.in_sync if n != link.name]
            if joining and link.state == "recording":
                names.append(link.name)
            if names != self.in_sync:
                await self.record_in_sync(names)
                self.in_sync = names
            if joining and link.state == "recording":
                link.state = "in sync"
                log.info("follower %s is in sync", link.name)
            elif not joining:
                if link in self.required:
                    self.required.remove(link)
                log.warning("follower %s left the in-sync set", link.name)
            self._release()

    def drop(self, link: FollowerLink, why: str) -> None:
        log.warning("follower %s: %s; dropping it (it reconnects and syncs again)", link.name, why)
        link.state = "dropped"
        link.backlog = None
        link.transport.abort()  # what waits in its buffer is freed now

    async def _check_lag(self) -> None:
        beat = control(HEARTBEAT, {"term": self.term})
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            now = time.monotonic()
            for link in list(self.connected):
                if link.state in ("dropped", "closed"):
                    continue
                if now - link.heard > self.timeout:
                    self.drop(link, "nothing heard from it for %.1f s" % (now - link.heard))
                elif now - link.told > self.timeout / 4:
                    link.told = now
                    link.transport.write(beat)
            oldest = self.waiting[0] if self.waiting else None
            for link in list(self.required):
                if link.state in ("dropped", "closed"):
                    continue
                if self.position - link.acked > self.max_lag_bytes:
                    self.drop(link, "%d bytes behind" % (self.position - link.acked))
                elif self._holding(link, oldest) and now - oldest[2] > self.max_lag_seconds:
                    self.drop(link, "no acknowledgement for %.1f s" % (now - oldest[2]))

    async def caught_up(self, name: str) -> bool:
        """A planned hand-over to follower `name`, the writer drained: until
        it has acknowledged every change (with N set the drain waited for
        N followers, perhaps not this one). False once it is out of the
        in-sync set, where it is put after `max_lag_seconds` of waiting."""
        deadline = time.monotonic() + self.max_lag_seconds
        while name in self.in_sync:
            link = next((link for link in self.required if link.name == name), None)
            if link is not None and link.state == "in sync":
                if link.acked >= self.position:
                    return True
                if time.monotonic() > deadline:
                    self.drop(link, "not caught up for the hand-over")
            await asyncio.sleep(CHECK_SECONDS)
        return False

    # -- a follower's snapshot ----------------------------------------------------

    def start_snapshot(self, link: FollowerLink, theirs: dict) -> None:
        theirs = {name: tuple(value) for name, value in theirs.items()}
        if not all(len(value) == 2 and isinstance(value[0], int) and isinstance(value[1], str)
                   for value in theirs.values()):
            raise ValueError("a listing entry that is not [size, sha1]")
        mqtt_store = self.mqtt_store

        def capture():
            # On the writer thread, between batches: no file is half written.
            # The result goes straight to the loop, not through the gate: a
            # follower's snapshot must not wait for followers.
            try:
                mqtt = mqtt_store._db.serialize() if mqtt_store is not None else None
                with self._lock:
                    point = link.snapshot_end = self.position
                    link.backlog = []  # gets the records after `point` only (FollowerLink.send)
                    self.links.append(link)
                result = (point, replica.sizes(self.root), mqtt)
            except Exception as exc:  # noqa: BLE001 - handed to the loop, which drops the follower
                result = exc
            self.loop.call_soon_threadsafe(captured, result)

        def captured(result):
            if isinstance(result, Exception) or link.state in ("closed", "dropped"):
                log.warning("follower %s: no snapshot: %s", link.name, result if isinstance(result, Exception)
                            else "disconnected")
                if link in self.links:
                    self.links.remove(link)
                if link.transport is not None:
                    link.transport.close()
                return
            point, sizes, mqtt = result
            definitions = self.definitions._db.serialize()  # on the loop that owns it; newer than `point` at worst
            threading.Thread(target=self._send_snapshot, name="hutch-snapshot", daemon=True,
                             args=(link, point, sizes, theirs, {"definitions.db": definitions, "mqtt.db": mqtt})
                             ).start()

        self.writer.run(capture)

    def _send_snapshot(self, link: FollowerLink, point: int, sizes: dict, theirs: dict, databases: dict) -> None:
        """On a thread of its own: read the differences, each once the
        follower's connection has room for it (FollowerLink.put)."""
        sent = 0
        try:
            for record in replica.differences(self.root, sizes, theirs):
                sent += len(record)
                asyncio.run_coroutine_threadsafe(link.put(record), self.loop).result()
            for name, content in databases.items():
                if content is not None:
                    for record in replica.write_records(name, bytes(content)):
                        asyncio.run_coroutine_threadsafe(link.put(record), self.loop).result()
        except (ConnectionError, RuntimeError):  # it disconnected, or the loop closed
            return
        except OSError as exc:
            log.warning("follower %s: cannot read the snapshot: %s", link.name, exc)
            self.loop.call_soon_threadsafe(link.transport.close)
            return
        self.loop.call_soon_threadsafe(self._snapshot_sent, link, point, sent)

    def _snapshot_sent(self, link: FollowerLink, point: int, sent: int) -> None:
        if link.state in ("closed", "dropped"):
            return
        link.transport.write(control(SNAPSHOT_END, {"position": point, "term": self.term}))
        backlog, link.backlog, link.backlog_bytes = link.backlog, None, 0
        if backlog:
            link.transport.write(b"".join(backlog))
        link.state = "following"
        log.info("follower %s: snapshot sent (%d bytes of differences)", link.name, sent)

    # -- status ------------------------------------------------------------------

    def followers(self) -> list[dict]:
        now = time.monotonic()
        oldest = self.waiting[0] if self.waiting else None
        out = []
        for link in self.links:
            behind = self._holding(link, oldest)
            out.append({"name": link.name, "state": link.state, "acknowledged": link.acked,
                        "lag_bytes": max(self.position - link.acked, 0),
                        "lag_seconds": round(now - oldest[2], 3) if behind else 0.0})
        return out
