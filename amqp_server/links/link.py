"""What every link (a shovel, a federation link) has in common: a task that
runs sessions until it is stopped, and the state the status routes show.

A session connects, works, and ends by raising `SessionEnded` (or any error
of a peer); the link is then "terminated" (a shovel) or in "error" (a
federation link) with the reason, waits, and starts again. The wait is the
reconnect delay, doubled after each session that never got running, up to
`MAX_BACKOFF`; a session that ran resets it. Nothing a peer does ends the
task: it ends when the link is stopped, or when the session returns (a
shovel that moved what src-delete-after asked for). A stopped link ends
also when its session did not see the cancellation (`unless_stopped`).

Access (amqp_server.links.access): before each session and every
`ACCESS_INTERVAL` while it runs, the link asks `refusal()` whether the user
who set it may still reach the vhosts it connects to; a refusal ends the
session (or keeps it from starting) with that reason.
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import random
import time

from amqp_server.links import client
from amqp_server.links.connection import connect

log = logging.getLogger("hutch.links")

MAX_BACKOFF = 30.0  # seconds: the longest wait between two sessions
MIN_WAIT = 0.05  # seconds: the shortest (a reconnect-delay of 0 or less must not spin)
ACCESS_INTERVAL = 1.0  # seconds between two checks of the owner's access while a session runs
STARTING, RUNNING = "starting", "running"


class SessionEnded(Exception):
    """A session stopped: `reason` is what the status shows; `ran` says
    whether it had been running (the back-off starts over)."""

    def __init__(self, reason: str, ran: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.ran = ran


class Link:
    failed_state = "terminated"  # the state shown while waiting to reconnect
    kind = "link"  # for logs

    def __init__(self, vhost: str, name: str, local: client.LocalNode, reconnect_delay: float) -> None:
        self.vhost = vhost
        self.name = name
        self.local = local
        self.reconnect_delay = reconnect_delay
        # why the user who set the link may not run it now, or None (set by the supervisor)
        self.refusal = lambda: None
        self.state = STARTING
        self.reason: str | None = None
        self.since = time.time()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="%s %s/%s" % (
            self.kind, self.vhost, self.name))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def set_state(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        backoff = self.reconnect_delay
        while True:
            self.set_state(STARTING)
            try:
                refused = self.refusal()
                if refused is not None:
                    raise SessionEnded(refused)
                await self.session()
                return
            except asyncio.CancelledError:
                raise
            except SessionEnded as exc:
                ran, reason = exc.ran, exc.reason
            except Exception as exc:  # noqa: BLE001 - any failure of a peer ends the session, never the broker
                ran, reason = False, describe(exc)
            self.unless_stopped()
            self.set_state(self.failed_state, reason)
            if ran:
                backoff = self.reconnect_delay
            log.warning("%s '%s' in vhost '%s': %s; reconnecting in %.1f s",
                        self.kind, self.name, self.vhost, reason, backoff)
            await asyncio.sleep(max(backoff, MIN_WAIT))
            backoff = min(max(backoff * 2, 0.1), max(MAX_BACKOFF, self.reconnect_delay))

    async def session(self) -> None:
        raise NotImplementedError

    def unless_stopped(self) -> None:
        """Raise CancelledError if the link was stopped (`stop` cancelled its
        task) and its session went on: the cancellation is not always seen
        as one. An error raised by an await on the way out (closing a channel
        the peer had closed: ensure_queue's `finally`) replaces it, and the
        AMQP client, whose methods run as tasks of their own, may lose it
        while the session sets up. Either way the link would go on beside
        the one that replaced it (a restarted shovel, a changed upstream): two
        sessions taking turns at the source and interleaving their messages
        at the destination. Checked after a session ended, before a shovel
        consumes, and before a session waits."""
        if asyncio.current_task().cancelling():
            log.info("%s '%s' in vhost '%s' was stopped while its session started or ended", self.kind,
                     self.name, self.vhost)
            raise asyncio.CancelledError

    async def connect(self, uris, end: str):
        """(uri, connection) to the first of `uris` (in random order, as
        RabbitMQ picks) that answers."""
        order = list(uris)
        random.shuffle(order)
        failures = []
        for uri in order:
            try:
                connection = await connect(client.resolve(uri, self.local),
                                           "%s %s (%s)" % (self.kind.capitalize(), self.name, end))
            except Exception as exc:  # noqa: BLE001
                failures.append("%s: %s" % (client.redacted(uri), describe(exc)))
                continue
            return uri, connection
        raise SessionEnded("cannot connect to the %s: %s" % (end, "; ".join(failures) or "no URI given"))

    async def until_closed(self, ends, done: asyncio.Future) -> None:
        """Wait until `done`, or one of `ends` ((connection or channel,
        name) pairs) closes, or the owner loses access; raises SessionEnded
        (ran=True) for a closed end (with its cause), a failed `done` or the
        refusal."""
        self.unless_stopped()
        watchers = [end.closing for end, _name in ends]
        access = asyncio.ensure_future(self._access_lost())
        try:
            finished, _pending = await asyncio.wait(watchers + [done, access], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in watchers + [access]:
                watcher.cancel()  # an observer: the end itself stays open
        if access in finished:
            raise SessionEnded(access.result(), True)
        if done in finished and done.exception() is None:
            return
        cause = done.exception() if done.done() else None
        closed = next(((end, name) for end, name in ends if end.is_closed), None)
        if closed is None:
            raise SessionEnded(describe(cause), True)
        end, name = closed
        if cause is None and not end.closing.cancelled():
            cause = end.closing.exception()
        raise SessionEnded("%s closed%s" % (name, ": " + describe(cause) if cause else ""), True)

    async def _access_lost(self) -> str:
        """The refusal, once the owner's access is gone."""
        while True:
            await asyncio.sleep(ACCESS_INTERVAL)
            refused = self.refusal()
            if refused is not None:
                return refused

    @staticmethod
    async def close(*connections) -> None:
        for connection in connections:
            if connection is not None and not connection.is_closed:
                try:
                    await asyncio.wait_for(connection.close(), 5)
                except Exception:  # noqa: BLE001 - it is going away anyway
                    pass


async def ensure_queue(connection, queue: str, arguments: dict | None = None) -> int:
    """RabbitMQ's shovel and federation: look the queue up passively and
    declare it durable only when it does not exist. Its message count."""
    from aiormq.exceptions import ChannelNotFoundEntity
    channel = await connection.channel()
    try:
        declared = await channel.queue_declare(queue, passive=True)
    except ChannelNotFoundEntity:
        channel = await connection.channel()
        declared = await channel.queue_declare(queue, durable=True, arguments=arguments or None)
    finally:
        if not channel.is_closed:
            await channel.close()
    return declared.message_count


def describe(exc: BaseException | None) -> str:
    text = str(exc) if exc is not None else ""
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def timestamp(seconds: float) -> str:
    """RabbitMQ's status timestamp: "2026-11-26 3:36:44" (local time)."""
    moment = datetime.datetime.fromtimestamp(seconds)
    return "%d-%02d-%02d %d:%02d:%02d" % (moment.year, moment.month, moment.day, moment.hour, moment.minute,
                                          moment.second)
