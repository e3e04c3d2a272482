"""The node's etcd lease, and fencing.

etcd ends a lease `ttl` seconds after the last refresh it *received*. The
keeper refreshes every ttl/4 and, after each successful refresh, sets
`deadline` = (the local time the refresh was *sent*) + ttl - margin.
Sent-time is before etcd's receipt, so the deadline always falls before
etcd can end the lease and elect another leader. The clock is
CLOCK_BOOTTIME where the system has it: unlike the monotonic clock it keeps
counting while the machine is suspended, so a leader that wakes up from a
suspend knows its lease may have run out meanwhile.

The keeper runs on its own thread with its own event loop and etcd client:
a broker loop busy with a long recovery or a flood of work must not let the
lease lapse, and a lapse must be noticed even while that loop is busy.

Invariant (fencing): after `deadline` this node promises nothing. `valid()`
is checked before any durability reply leaves (the storage writer's gate,
see amqp_server.cluster.node), so even a process that was frozen (SIGSTOP,
a stalled VM) and wakes up with client data pending confirms nothing.

An etcd that does not answer is not one that ended the lease: past the
deadline the keeper goes on asking. When etcd answers that the lease is
alive (a refresh received while the leader key, on that lease, still
existed: no one else can have been elected), the lease is valid again and
`on_revived` releases what was held. When etcd answers that the lease is
gone: the leader calls `on_lost` (it stops at once and rejoins); another
node just takes a new lease (`on_renewed` registers it again). A leader
that hears nothing for `ttl` x OUTAGE_LEASES past its deadline gives up
too (`on_lost`): its clients reconnect, perhaps to a leader elected
without it.
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

OUTAGE_LEASES = 3  # a leader cut off from etcd this many ttl past its deadline restarts


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# Counts through a suspend (Linux); elsewhere the monotonic clock.
clock = _boottime if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


class LeaseKeeper:
    def __init__(self, make_etcd: Callable[[], Etcd], ttl: int, on_lost: Callable[[str], None],
                 on_renewed: Callable[[], None], on_revived: Callable[[], None],
                 leading: Callable[[], bool]) -> None:
        self.make_etcd = make_etcd
        self.ttl = ttl
        self.margin = max(0.5, ttl * 0.2)
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        self.on_revived = on_revived
        self.leading = leading  # the node leads: its lease holds the leader key
        self.lease_id = 0
        self.deadline = 0.0  # `clock`; written by the keeper thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def valid(self) -> bool:
        return clock() < self.deadline

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
        await self._grant(etcd)
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

    async def _grant(self, etcd: Etcd) -> None:
        while True:
            sent = clock()
            try:
                self.lease_id = await etcd.grant(self.ttl)
                break
            except EtcdUnavailable as exc:
                log.warning("cannot get an etcd lease: %s; retrying", exc)
                await asyncio.sleep(1)
        self.deadline = sent + self.ttl - self.margin

    async def _keep(self, etcd: Etcd) -> None:
        lapsed = False  # past the deadline, etcd silent
        while not self._stopping.is_set():
            try:
                # Wake at the deadline at the latest, to notice it at once.
                pause = self.ttl / 4 if lapsed else min(self.ttl / 4, self.deadline - clock())
                await asyncio.wait_for(self._stopping.wait(), max(pause, 0))
                return
            except asyncio.TimeoutError:
                pass
            sent = clock()
            if sent >= self.deadline and not lapsed:
                lapsed = True
                log.error("the etcd lease's deadline passed (no refresh answered for %.1f s): promising nothing "
                          "until etcd answers", self.ttl - self.margin)
            if lapsed and self.leading() and sent >= self.deadline + self.ttl * OUTAGE_LEASES:
                self.on_lost("the etcd lease ran out (no refresh answered for %.1f s)"
                             % (self.ttl * (OUTAGE_LEASES + 1) - self.margin))
                return
            try:
                alive = await asyncio.wait_for(etcd.refresh(self.lease_id), self.ttl / 2)
            except (EtcdUnavailable, asyncio.TimeoutError) as exc:
                log.warning("cannot refresh the etcd lease: %s", exc or "timed out")
                continue
            if not alive:
                self.deadline = 0.0
                if self.leading():
                    self.on_lost("the etcd lease ran out (etcd ended it)")
                    return
                log.warning("etcd ended the lease: taking a new one")
                await self._grant(etcd)
                lapsed = False
                self.on_renewed()
                continue
            # Alive when etcd received the refresh, after `sent`: the lease lasts until ttl after that.
            was_valid = clock() < self.deadline
            self.deadline = sent + self.ttl - self.margin
            if lapsed:
                log.warning("etcd answers again and the lease is alive: promising again")
            if lapsed or not was_valid:  # replies held meanwhile (an answer may come just past the deadline)
                lapsed = False
                self.on_revived()
