"""A follower's end of the replication connection: keeps its data directory a
copy of the leader's. It passes the cluster handshake (amqp_server.cluster.
handshake: both ends prove they hold the secret; the leader names its term),
sends LISTING, applies what arrives (the snapshot's differences, then the
live records) on an applier thread (storage.replica.Applier), and
acknowledges a position once everything up to it is applied and synced
(amqp_server.cluster.replication explains the leader's side).

Invariants:
- a follower never applies a stream of a lower term than one it has
  followed (`term`): a deposed leader that still runs cannot feed it;
  every SNAPSHOT_END and HEARTBEAT must carry the handshake's term;
- at most APPLY_BUFFER bytes wait for the applier: beyond that it stops
  reading, and the leader's side of the bound takes over (it drops a
  follower that falls `max_lag_bytes` behind);
- it sends HEARTBEAT every `timeout`/4 and gives up on a connection that
  brought nothing for `timeout` seconds (a partition, a frozen leader):
  the node then finds the leader again and reconnects.

`synced` is what an election compares (amqp_server.cluster.node): (the
leader's term, the position) its data directory holds exactly, applied and
synced; None while a snapshot or a record is half applied, and in a
process that has not followed anyone yet (the node then reads the position
its data directory kept: `record` persists each one, amqp_server.cluster.state).
"""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading

from amqp_server.cluster import handshake
from amqp_server.cluster.stream import ACK, HEARTBEAT, LISTING, MAX_CONTROL, SNAPSHOT_END, Frames, control
from storage import replica

log = logging.getLogger("hutch.cluster")

APPLY_BUFFER = 64 * 1024 * 1024  # bytes received and not applied yet, at most (about)


class TermRefused(ConnectionError):
    """A leader whose term is lower than one this node followed."""


class Follower:
    """Keeps `root` a copy of the leader's data directory."""

    def __init__(self, name: str, root: str, fsync: bool, secret: bytes, tls, timeout: float) -> None:
        self.name = name
        self.root = root
        self.fsync = fsync
        self.secret = secret
        self.tls = tls  # ssl.SSLContext (the replication stream in TLS) or None
        self.timeout = timeout
        self.term = 0  # the highest leader term followed (the node starts it from its directory's)
        self.state = "syncing"
        self.position = 0  # received (not necessarily applied yet)
        self.reached_live = False  # the last connection applied its snapshot
        self.synced: tuple[int, int] | None = None  # (term, position); written by the applier thread
        self._applier: threading.Thread | None = None  # the last connection's
        # Persists `synced` (amqp_server.cluster.state), on the applier thread;
        # given None before a connection's first change is applied.
        self.record = lambda mark: None

    async def idle(self) -> None:
        """Until the last connection's applier has applied what it received
        (a cancelled `follow` may leave it running): then `synced` is final,
        and another connection may start applying."""
        thread = self._applier
        if thread is not None and thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    async def follow(self, host: str, port: int, aside: str | None = None) -> None:
        """Until the connection ends (then the caller finds the leader again);
        `aside`: where the snapshot moves the files it replaces or removes."""
        loop = asyncio.get_running_loop()
        sock, term = await handshake.dial(host, port, self.secret, self.name, "replicate")
        if term < self.term:
            sock.close()
            raise TermRefused("its term %d is older than term %d, already followed" % (term, self.term))
        self.term = term
        self.reached_live = False
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                sock=sock, ssl=self.tls, server_hostname=host if self.tls else None), handshake.HANDSHAKE_SECONDS)
        except BaseException:
            sock.close()
            raise
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        applier = replica.Applier(self.root, self.fsync, aside)
        failed: list[BaseException] = []
        waiting = [0]  # bytes queued for the applier (changed on the loop only)
        room = asyncio.Event()
        room.set()

        def applied(size: int, position: int | None) -> None:
            waiting[0] -= size
            if waiting[0] <= APPLY_BUFFER // 2:
                room.set()
            if position is not None:
                self.reached_live = True  # the snapshot is applied and synced
                if not writer.is_closing():
                    writer.write(control(ACK, {"position": position}))

        def apply_loop() -> None:
            first = True
            try:
                while True:
                    job = jobs.get()
                    if job is None:
                        return
                    records, mark, size = job
                    if first:  # a snapshot begins: the directory holds no known position until it ends
                        self.record(None)
                        first = False
                    self.synced = None  # until this job is applied and synced
                    for kind, payload in records:
                        applier.apply(kind, memoryview(payload))
                    applier.sync()
                    if mark is not None:
                        applier.aside = None  # the snapshot is applied: the live stream follows
                        self.record(mark)
                        self.synced = mark
                    loop.call_soon_threadsafe(applied, size, mark[1] if mark is not None else None)
            except BaseException as exc:  # noqa: BLE001 - reported to the loop, which disconnects
                failed.append(exc)
                loop.call_soon_threadsafe(writer.close)
                loop.call_soon_threadsafe(room.set)  # a reader waiting for room reads the end now
            finally:
                applier.close()

        async def beat() -> None:
            while not writer.is_closing():
                writer.write(control(HEARTBEAT, {"term": term}))
                await asyncio.sleep(self.timeout / 4)

        thread = self._applier = threading.Thread(target=apply_loop, name="hutch-applier", daemon=True)
        beating = loop.create_task(beat())
        try:
            listing = await loop.run_in_executor(None, replica.listing, self.root)
            writer.write(control(LISTING, {"files": listing}))
            thread.start()
            frames = Frames(MAX_CONTROL)
            position = None  # known from SNAPSHOT_END on
            self.state = "syncing"
            while True:
                while not room.is_set():
                    await room.wait()
                try:
                    data = await asyncio.wait_for(reader.read(1 << 20), self.timeout)
                except asyncio.TimeoutError:
                    raise ConnectionError("nothing from the leader for %.1f s" % self.timeout) from None
                if not data:
                    break
                batch = []
                for kind, payload, size in frames.feed(data):
                    if kind in (SNAPSHOT_END, HEARTBEAT):
                        message = json.loads(payload)
                        if message.get("term") != term:
                            raise ValueError("a record of term %r on a connection of term %d" %
                                             (message.get("term"), term))
                        if kind == SNAPSHOT_END:
                            position = message["position"]
                    elif kind < 16:
                        batch.append((kind, payload))
                        if position is not None:
                            position += size
                    else:
                        raise ValueError("unexpected record kind %d" % kind)
                if batch or position is not None:
                    waiting[0] += len(data)
                    if waiting[0] > APPLY_BUFFER:
                        room.clear()
                    jobs.put((batch, (term, position) if position is not None else None, len(data)))
                    if position is not None:
                        self.position = position
                        self.state = "following"
        finally:
            beating.cancel()
            jobs.put(None)
            writer.close()
            await self.idle()
            self.state = "syncing"
        if failed:
            raise failed[0]
