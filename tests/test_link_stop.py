"""A link that is stopped ends, also when its session did not see the
cancellation (amqp_server.links.link, `Link.unless_stopped`)."""
from __future__ import annotations

import asyncio

import pytest

from amqp_server.links.link import Link

pytestmark = pytest.mark.timeout(30)


class Unwinding(Link):
    """A session whose `finally` raises (while `raising`), as one awaiting
    the close of a channel its peer already closed does
    (links.link.ensure_queue)."""

    sessions = 0
    raising = True

    async def session(self) -> None:
        self.sessions += 1
        try:
            await asyncio.sleep(30)
        finally:
            if self.raising:
                raise RuntimeError("the channel closed while the session unwound")


class Unheeding(Link):
    """A session that loses the cancellation while it sets up (while
    `losing`) and goes on to wait, as one whose AMQP method's reply came as
    it was cancelled can."""

    sessions = 0
    losing = True

    async def session(self) -> None:
        self.sessions += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if not self.losing:
                raise
        await self.until_closed([], asyncio.get_running_loop().create_future())


def stopped_and_sessions(kind) -> tuple[bool, int]:
    """(whether stop() returned within 2 s, how many sessions ran)."""
    async def scenario() -> tuple[bool, int]:
        link = kind("/", "stopped", None, 0.01)
        link.start()
        task = link._task
        await asyncio.sleep(0.05)
        stopping = asyncio.ensure_future(link.stop())
        done, _pending = await asyncio.wait({stopping}, timeout=2)
        await asyncio.sleep(0.2)
        sessions = link.sessions
        link.raising = link.losing = False  # so that a link still running can be ended here
        task.cancel()
        await asyncio.gather(task, stopping, return_exceptions=True)
        return stopping in done, sessions

    return asyncio.run(scenario())


def test_a_stopped_link_whose_session_failed_on_its_way_out_runs_no_further_session():
    """Before the fix stop() never returned and the link went on
    reconnecting: a restarted shovel ran beside the one replacing it."""
    assert stopped_and_sessions(Unwinding) == (True, 1)


def test_a_stopped_link_whose_session_lost_the_cancellation_ends():
    """Before the fix the session went on waiting (a shovel: consuming and
    forwarding beside the one replacing it) and stop() never returned."""
    assert stopped_and_sessions(Unheeding) == (True, 1)
