"""storage.priority_queue.PriorityQueue over in-memory levels against a model:
a ready message is served highest priority first, then in publish order
(requeued ones back at their place), and the counts always add up."""
from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from storage import MemoryQueue, Message
from storage.priority_queue import PriorityQueue

TOP = 4


def message(body: bytes, priority: int | None) -> Message:
    if priority is None:
        header = struct.pack(">HHQH", 60, 0, len(body), 0)
    else:
        header = struct.pack(">HHQHB", 60, 0, len(body), 0x0800, priority)
    return Message("", "q", header, body)


operations = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.one_of(st.none(), st.integers(0, 9))),
    st.tuples(st.just("fetch"), st.none()),
    st.tuples(st.just("requeue"), st.integers(0, 5)),
    st.tuples(st.just("ack"), st.integers(0, 5)),
    st.tuples(st.just("purge"), st.none()),
), max_size=60)


@given(operations)
def test_served_by_priority_then_publish_order(ops):
    queue = PriorityQueue([MemoryQueue() for _ in range(TOP + 1)])
    ready: list[tuple[int, int, bytes]] = []  # (level, publish number, body)
    unacked: list[tuple] = []  # (entry, model item)
    for number, (op, arg) in enumerate(ops):
        if op == "publish":
            body = b"%d" % number
            queue.publish(message(body, arg))
            ready.append((min(arg or 0, TOP), number, body))
        elif op == "fetch":
            entry = queue.fetch()
            if not ready:
                assert entry is None
                continue
            best = min(ready, key=lambda item: (-item[0], item[1]))
            ready.remove(best)
            assert entry.message.body == best[2]
            unacked.append((entry, best))
        elif op in ("requeue", "ack") and unacked:
            entry, item = unacked.pop(arg % len(unacked))
            if op == "requeue":
                queue.requeue([entry])
                ready.append(item)
            else:
                queue.ack([entry])
        elif op == "purge":
            assert queue.purge() == len(ready)
            ready.clear()
        assert queue.ready == len(ready) == sum(queue.state_counts().values())
        assert queue.ready_bytes == sum(len(item[2]) for item in ready)
