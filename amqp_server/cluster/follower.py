"""A follower's end of the replication connection: keeps its data directory a
copy of the leader's. It sends HELLO with its listing, applies what arrives
(the snapshot's differences, then the live records) on an applier thread
(storage.replica.Applier), and acknowledges a position once everything up
to it is applied and synced (amqp_server.cluster.replication explains the
leader's side).

`synced` is what an election compares (amqp_server.cluster.node): (the
leader's term, the position) its data directory holds exactly, applied and
synced; None while a snapshot or a record is half applied, and in a
process that has not followed anyone yet (it cannot know).
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading

from amqp_server.cluster.stream import ACK, HELLO, MAX_CONTROL, SNAPSHOT_END, Frames, control
from storage import replica


class Follower:
    """Keeps `root` a copy of the leader's data directory."""

    def __init__(self, name: str, root: str, fsync: bool) -> None:
        self.name = name
        self.root = root
        self.fsync = fsync
        self.state = "syncing"
        self.position = 0  # received (not necessarily applied yet)
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
        reader, writer = await asyncio.open_connection(host, port)
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        applier = replica.Applier(self.root, self.fsync, aside)
        failed: list[BaseException] = []

        def acked(position: int) -> None:
            if not writer.is_closing():
                writer.write(control(ACK, {"position": position}))

        def apply_loop() -> None:
            first = True
            try:
                while True:
                    job = jobs.get()
                    if job is None:
                        return
                    records, mark = job
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
                        loop.call_soon_threadsafe(acked, mark[1])
            except BaseException as exc:  # noqa: BLE001 - reported to the loop, which disconnects
                failed.append(exc)
                loop.call_soon_threadsafe(writer.close)
            finally:
                applier.close()

        thread = self._applier = threading.Thread(target=apply_loop, name="hutch-applier", daemon=True)
        try:
            listing = await loop.run_in_executor(None, replica.listing, self.root)
            writer.write(control(HELLO, {"name": self.name, "files": listing}))
            thread.start()
            frames = Frames(MAX_CONTROL)
            term = position = None  # known from SNAPSHOT_END on
            self.state = "syncing"
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                batch = []
                for kind, payload, size in frames.feed(data):
                    if kind == SNAPSHOT_END:
                        message = json.loads(payload)
                        term, position = message["term"], message["position"]
                    elif kind < 16:
                        batch.append((kind, payload))
                        if position is not None:
                            position += size
                    else:
                        raise ValueError("unexpected record kind %d" % kind)
                if batch or position is not None:
                    jobs.put((batch, (term, position) if position is not None else None))
                    if position is not None:
                        self.position = position
                        self.state = "following"
        finally:
            jobs.put(None)
            writer.close()
            await self.idle()
            self.state = "syncing"
        if failed:
            raise failed[0]
