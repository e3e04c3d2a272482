"""Moving messages out of a queue into another queue or through an exchange
(e.g. replaying a dead-letter queue once the cause is fixed).

Theory of operation:
- Messages are taken from the source's head in batches, as a consumer takes
  them: while in flight they are unacked, owned by the move, and the
  source's consumers get the messages behind them.
- Each is published to its destination queues with the callback a publisher
  confirm waits for (`Queue.publish(..., on_durable)`), so the batch is
  acked in the source only once every destination holds every message,
  on disk when the message is persistent and the queue durable. A crash in
  between leaves a message in both queues, never in neither (at least once).
- A message the destination routes nowhere goes back to the source
  (requeued at its place, redelivered) with the rest of its batch, and the
  move stops there: nothing is dropped.
- `limit` is fixed at the start ("all" = the ready count then), so a move
  ends even while publishers keep filling the source.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from storage import Message, QueueEntry
from vhosts.queue import Queue

BATCH = 256


async def move(source: Queue, route: Callable[[Message], tuple[Message, list[Queue]]], limit: int) -> int:
    """Move up to `limit` messages; `route(message)` gives the message to
    publish and the queues it reaches. Returns how many moved."""
    moved = 0
    while moved < limit and not source.deleted:
        batch = await _take(source, min(BATCH, limit - moved))
        if not batch:
            break
        held = await _publish(batch, route)
        source.ack(batch[:held])
        moved += held
        if held < len(batch):
            source.requeue(batch[held:])
            break
    return moved


async def _take(source: Queue, count: int) -> list[QueueEntry]:
    """Up to `count` ready entries from the head; waits only while the head
    is read back from disk and nothing was taken yet."""
    batch: list[QueueEntry] = []
    while len(batch) < count:
        entry = source.get()
        if entry is not None:
            batch.append(entry)
            continue
        if batch or not source.message_count or source.deleted:
            break
        available = asyncio.get_running_loop().create_future()
        source.when_available(lambda: available.done() or available.set_result(None))
        await available
    return batch


async def _publish(batch: list[QueueEntry], route) -> int:
    """Publish the batch in order until a message reaches no queue; returns
    how many were published, once all of them are held."""
    held = asyncio.get_running_loop().create_future()
    waiting = [1]

    def one_held() -> None:
        waiting[0] -= 1
        if not waiting[0] and not held.done():
            held.set_result(None)

    published = 0
    for entry in batch:
        message, targets = route(entry.message)
        if not targets:
            break
        for queue in targets:
            if queue.publish(message, one_held):
                waiting[0] += 1
        published += 1
    one_held()
    await held
    return published
