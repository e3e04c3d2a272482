"""The time port of the domain: what time it is and "call me back later".

Queues read the time only where a feature needs it (message TTL, x-death
times) and arm at most one message-expiry timer, one queue-expiry timer and
one pacing timer (credit flow, while publishers wait) each; tests of the
pure parts give them a manual clock instead.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> int:
        """Milliseconds since the epoch."""

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle: ...


class LoopClock:
    """Wall-clock time, timers on the running asyncio loop."""

    __slots__ = ()

    def now(self) -> int:
        return int(time.time() * 1000)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000, callback)
