"""Large message bodies through a real broker: what it costs the broker's process.

A body of 1 MiB is copied a few times on its way (its frames joined, the
delivery built): with glibc's defaults each copy was a fresh mmap whose 256
pages faulted in one by one (amqp_server.shared.allocator). The kernel counts those
faults per process, so a client can see whether the broker reuses memory.
"""
from __future__ import annotations

import pika

from helpers import unique

MIB = 1 << 20
PAGE = 4096


def minor_faults(pid: int) -> int:
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rpartition(")")[2].split()[7])  # minflt, field 10 of proc(5)


def relay(channel, queue: str, count: int) -> None:
    """Publish and get back `count` messages of 1 MiB, one at a time (a steady flow)."""
    body = bytes(range(256)) * (MIB // 256)
    for _ in range(count):
        channel.basic_publish("", queue, body)
        method, _props, received = channel.basic_get(queue)
        assert method is not None and received == body
        channel.basic_ack(method.delivery_tag)


def test_relaying_1_mib_messages_reuses_memory_instead_of_faulting_in_every_page(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        queue = unique("large")
        channel.queue_declare(queue)
        relay(channel, queue, 10)  # the heap grows once to what this flow needs
        before = minor_faults(broker.process.pid)
        relay(channel, queue, 100)
        faults = minor_faults(broker.process.pid) - before
        channel.queue_delete(queue)
    finally:
        connection.close()
    # One fault per page copied would be 256 per message and copy; a quarter of one copy's
    # pages per message is far above what reuse leaves (first-touch of a few new heap pages).
    assert faults < 100 * (MIB // PAGE) // 4, "%d page faults for 100 messages of 1 MiB" % faults
