"""The durable store of a virtual host's delayed messages (held by
x-delayed-message exchanges until due).

It is a queue index (storage.queue_index) used as a log: each message is one
PUBLISH record with the whole message embedded and its due time (ms since
the epoch) in the record's expiry field; delivering it writes the ACK. The
index deletes a segment file once every message in it is acked, and
`recover` reads back what is still held at start. Nothing goes to the
shared message store, so recovery does not depend on it.
"""
from __future__ import annotations

from typing import Callable

from storage.message import Message
from storage.queue_index import QueueIndex
from storage.writer import GroupCommitWriter

# Every record embeds its message, whatever its size.
_EMBED_ALL = 1 << 62


class DelayedStore:
    def __init__(self, directory: str, writer: GroupCommitWriter, segment_entries: int) -> None:
        self.index = QueueIndex(directory, writer, embed_below=_EMBED_ALL, segment_entries=segment_entries)
        self._next_seq = 0

    def recover(self) -> list[tuple[int, int, Message]]:
        """At start (blocking), before any `add`: (seq, due, message) of every
        message still held, in the order they were added."""
        loaded, report = self.index.recover(max_entries=None)
        self._next_seq = report.next_seq
        return [(entry.seq, entry.expiry, Message.from_bytes(entry.payload, entry.msg_id)) for entry in loaded]

    def add(self, message: Message, due: int, done: Callable[[], None] | None) -> int:
        """Keep `message` until `remove`; `done` once it is on disk. Returns its seq."""
        seq = self._next_seq
        self._next_seq = seq + 1
        self.index.publish(seq, message.msg_id, len(message.body), message.to_bytes(), expiry=due, done=done)
        return seq

    def remove(self, seq: int) -> None:
        self.index.ack((seq,))
