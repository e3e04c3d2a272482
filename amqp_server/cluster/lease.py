"""The node's etcd lease, and fencing.

etcd ends a lease `ttl` seconds after the last refresh it *received*. The
keeper refreshes every ttl/4 and, after each successful refresh, sets
`deadline` = (the local monotonic time the refresh was *sent*) + ttl -
margin. Sent-time is before etcd's receipt, so the deadline always falls
before etcd can end the lease and elect another leader.

The keeper runs on its own thread with its own event loop and etcd client:
a broker loop busy with a long recovery or a flood of work must not let the
lease lapse, and a lapse must be noticed even while that loop is busy.

Invariant (fencing): after `deadline` this node promises nothing. `valid()`
is checked before any durability reply leaves (the storage writer's gate,
see amqp_server.cluster.node), so even a process that was frozen (SIGSTOP,
a stalled VM) and wakes up with client data pending confirms nothing; and
the keeper calls `on_lost` (from its thread) as soon as it sees the
deadline pass, which stops the node from serving at all.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Callable

from amqp_server.cluster.etcd import Etcd, EtcdUnavailable

log = logging.getLogger("hutch.cluster")


class LeaseKeeper:
    def __init__(self, make_etcd: Callable[[], Etcd], ttl: int, on_lost: Callable[[str], None]) -> None:
        self.make_etcd = make_etcd
        self.ttl = ttl
        self.margin = max(0.5, ttl * 0.2)
        self.on_lost = on_lost
        self.lease_id = 0
        self.deadline = 0.0  # monotonic; written by the keeper thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def valid(self) -> bool:
        return time.monotonic() < self.deadline

    async def start(self) -> int:
        """Grant the lease (retrying while etcd is unreachable); its id."""
        granted: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(granted)), name="hutch-lease",
                                        daemon=True)
        self._thread.start()
        return await asyncio.wrap_future(granted)

    def stop(self, revoke: bool) -> None:
        """End the keeper; `revoke`: give the lease back at once (a clean stop
        or a hand-over: the others need not wait for it to run out)."""
        if self._loop is None:
            return

        def stop() -> None:
            self._revoke = revoke
            self._stopping.set()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=self.ttl)

    async def _main(self, granted: concurrent.futures.Future) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._revoke = False
        etcd = self.make_etcd()
        await etcd.connect()
        while True:
            sent = time.monotonic()
            try:
                self.lease_id = await etcd.grant(self.ttl)
                break
            except EtcdUnavailable as exc:
                log.warning("cannot get an etcd lease: %s; retrying", exc)
                await asyncio.sleep(1)
        self.deadline = sent + self.ttl - self.margin
        granted.set_result(self.lease_id)
        try:
            await self._keep(etcd)
        finally:
            if self._revoke:
                try:
                    await etcd.revoke(self.lease_id)
                except EtcdUnavailable:
                    pass
            await etcd.close()

    async def _keep(self, etcd: Etcd) -> None:
        while not self._stopping.is_set():
            try:
                # Wake at the deadline at the latest, to notice it at once.
                pause = min(self.ttl / 4, self.deadline - time.monotonic())
                await asyncio.wait_for(self._stopping.wait(), max(pause, 0))
                return
            except asyncio.TimeoutError:
                pass
            sent = time.monotonic()
            if sent >= self.deadline:
                self.on_lost("the etcd lease ran out (no refresh answered for %.1f s)" % (self.ttl - self.margin))
                return
            try:
                alive = await asyncio.wait_for(etcd.refresh(self.lease_id), max(0.1, self.deadline - sent))
            except (EtcdUnavailable, asyncio.TimeoutError) as exc:
                log.warning("cannot refresh the etcd lease: %s", exc or "timed out")
                continue
            if not alive:
                self.deadline = 0.0
                self.on_lost("etcd ended the lease")
                return
            if time.monotonic() < self.deadline:  # an answer after the deadline revives nothing
                self.deadline = sent + self.ttl - self.margin
