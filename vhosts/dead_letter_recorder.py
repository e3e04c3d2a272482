"""The dead-letter log's hook on a vhost: every message that dies (the
vhost's `on_dead_letter`) becomes a record in the vhost's
`storage.dead_letter_log.DeadLetterLog`, whether or not its queue has a dead
letter exchange. The recorder returns a hold, so the message leaves its
queue only once its record is on disk (vhosts/vhost.py `dead_letter`).

On a node of several shards the node keeps one dead-letter log per vhost,
shard 0's (docs/scaling.md): another shard's recorder writes through
`ShardLog`, which hands each record to shard 0 and holds the message until
shard 0 has it on disk. So offsets stay one sequence per vhost, every reader
(the management API, hutchctl, spark_sink) reads one log, and no file is
written by two processes."""
from __future__ import annotations

from typing import Callable

from storage import Message
from storage.dead_letter_log import DeadLetterLog, from_message
from vhosts.dead_letter import Death


def death_count(message: Message, queue: str, reason: str) -> int:
    """The x-death count of (queue, reason) once this death is counted."""
    headers = message.headers
    deaths = headers.get("x-death") if headers else None
    if isinstance(deaths, list):
        for entry in deaths:
            if isinstance(entry, dict) and entry.get("queue") == queue and entry.get("reason") == reason:
                count = entry.get("count")
                return count + 1 if isinstance(count, int) else 1
    return 1


class ShardLog:
    """The vhost's dead-letter log as another shard than shard 0 writes it:
    `append` as DeadLetterLog's, the record kept by shard 0
    (vhosts.remote_queue.ShardPort.dead_letter)."""

    __slots__ = ("vhost", "port", "include_bodies")

    def __init__(self, vhost: str, port, include_bodies: bool) -> None:
        self.vhost = vhost
        self.port = port
        self.include_bodies = include_bodies

    def append(self, record, on_durable: Callable[[], None]) -> None:
        if not self.include_bodies:  # shard 0 would not keep it: it need not travel
            record.body = None
        self.port.dead_letter(self.vhost, record, on_durable)


class DeadLetterRecorder:
    __slots__ = ("vhost", "log")

    def __init__(self, vhost: str, log: DeadLetterLog | ShardLog) -> None:
        self.vhost = vhost
        self.log = log

    def __call__(self, queue, reason: str, message: Message, death: Death) -> Callable[[Callable[[], None]], None]:
        dlx = death.dead_letter_exchange
        record = from_message(
            message, self.vhost, queue.name, reason, death.time / 1000, death.routing_keys, dlx,
            queue.settings.dead_letter_routing_key if dlx is not None else None,
            death_count(message, queue.name, reason), death.deliveries)
        log = self.log

        def hold(done: Callable[[], None]) -> None:
            log.append(record, done)

        return hold
