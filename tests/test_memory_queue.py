"""storage.memory_queue.MemoryQueue against a reference model (hypothesis
stateful testing).

The model is the rule from storage.backing_queue: ready entries are served in
ascending publish order; a fetched entry is unacked until it is acked (gone) or
requeued (ready again at its original place, redelivered); counts cover ready
entries only; purge drops the ready ones and leaves unacked ones alone.
"""
from __future__ import annotations

import struct

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import MemoryQueue, Message

HEADER = struct.pack(">HHQH", 60, 0, 0, 0)


class MemoryQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = MemoryQueue()
        self.published = 0
        # model: publish order -> (message, redelivered) for ready entries
        self.ready: dict[int, tuple[Message, bool]] = {}
        self.unacked: dict[int, tuple[object, Message]] = {}  # order -> (entry, message)
        self.order_of: dict[int, int] = {}  # id(entry) -> publish order

    @rule(size=st.integers(0, 300))
    def publish(self, size):
        message = Message("ex", "rk", HEADER, bytes(size))
        entry = self.queue.publish(message)
        assert entry.message is message and entry.redelivered is False
        self.order_of[id(entry)] = self.published
        self.ready[self.published] = (message, False)
        self.published += 1

    @rule()
    def fetch(self):
        entry = self.queue.fetch()
        if not self.ready:
            assert entry is None
            return
        assert entry is not None
        order = min(self.ready)
        message, redelivered = self.ready.pop(order)
        assert self.order_of[id(entry)] == order, "fetch must return the oldest ready entry"
        assert entry.message is message
        assert entry.redelivered is redelivered
        self.unacked[order] = (entry, message)

    @precondition(lambda self: self.unacked)
    @rule(data=st.data())
    def ack(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.unacked)), unique=True, min_size=1))
        self.queue.ack([self.unacked.pop(order)[0] for order in chosen])

    @precondition(lambda self: self.unacked)
    @rule(data=st.data())
    def requeue(self, data):
        # any subset, in any order (basic.nack, basic.recover, a closed channel)
        chosen = data.draw(st.permutations(sorted(self.unacked)).flatmap(
            lambda orders: st.integers(1, len(orders)).map(lambda n: orders[:n])))
        entries = []
        for order in chosen:
            entry, message = self.unacked.pop(order)
            entries.append(entry)
            self.ready[order] = (message, True)
        self.queue.requeue(entries)
        assert all(entry.redelivered for entry in entries)

    @rule()
    def purge(self):
        assert self.queue.purge() == len(self.ready)
        self.ready.clear()

    @invariant()
    def counts_are_exact(self):
        assert self.queue.ready == len(self.ready)
        assert self.queue.ready_bytes == sum(len(message.body) for message, _ in self.ready.values())


MemoryQueueMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_memory_queue_matches_model = MemoryQueueMachine.TestCase


def test_requeued_entries_come_back_in_publish_order_before_newer_ones():
    queue = MemoryQueue()
    messages = [Message("", "", HEADER, bytes(i)) for i in range(5)]
    for message in messages:
        queue.publish(message)
    fetched = [queue.fetch() for _ in range(4)]
    queue.publish(Message("", "", HEADER, b"late"))
    queue.requeue([fetched[3], fetched[0], fetched[2]])
    order = []
    while (entry := queue.fetch()) is not None:
        order.append((entry.message.body, entry.redelivered))
    assert order == [(bytes(0), True), (bytes(2), True), (bytes(3), True), (bytes(4), False), (b"late", False)]


def test_delete_empties_the_queue():
    queue = MemoryQueue()
    queue.publish(Message("", "", HEADER, b"abc"))
    queue.delete()
    assert (queue.ready, queue.ready_bytes, queue.fetch()) == (0, 0, None)
