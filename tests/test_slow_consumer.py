"""A consumer that stops reading its socket (autoack, no prefetch limit)
while a producer keeps publishing to its queue: the broker's memory stays
bounded (it stops reading the producer instead of buffering the stream), and
another connection is served as usual meanwhile."""
from __future__ import annotations

import time

from pamqp import commands

from amqp_raw import RawClient
from helpers import connect, drain, unique, wait_for
from http_api import call

BODY = b"s" * 4096
MESSAGES = 100_000  # 400 MiB if the broker buffered it all
BOUND = 64 * 1024 * 1024  # what it holds: 2000 queued messages, bounded output, socket buffers


def rss(pid: int) -> int:
    with open("/proc/%d/status" % pid) as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_stalled_consumer_bounds_memory_and_spares_other_connections(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    queue = unique("stalled")
    consumer = RawClient.connected(broker.port, channels=(1,))
    consumer.send_frame(commands.Queue.Declare(queue=queue, auto_delete=True), 1)
    consumer.expect(commands.Queue.DeclareOk, 1)
    consumer.send_frame(commands.Basic.Consume(queue=queue, no_ack=True), 1)
    consumer.expect(commands.Basic.ConsumeOk, 1)
    before = rss(broker.process.pid)

    publisher = RawClient.connected(broker.port, channels=(1,))
    message = publisher.publish_bytes(queue, BODY)
    publisher.sock.setblocking(False)
    sent, pending = 0, b""
    stalled_since = None
    # Publish until the broker has not accepted a byte for a second (it
    # stopped reading us) or the whole stream went in.
    while sent < MESSAGES:
        if not pending:
            pending = message
        try:
            written = publisher.sock.send(pending)
        except BlockingIOError:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1.0:
                break
            time.sleep(0.01)
            continue
        stalled_since = None
        pending = pending[written:]
        if not pending:
            sent += 1
    assert sent < MESSAGES, "the broker read the whole stream although nobody consumed it"
    assert rss(broker.process.pid) - before < BOUND

    # The stalled pair is stuck; another connection is not.
    rows = call(broker.ports["HTTP"], "GET", "/api/connections").body
    assert "flow" in {row["state"] for row in rows}
    other = connect(broker.port)
    channel = other.channel()
    mine = channel.queue_declare(unique("other"), exclusive=True).method.queue
    for i in range(200):
        channel.basic_publish("", mine, b"o%d" % i)
    wait_for(lambda: channel.queue_declare(mine, passive=True).method.message_count == 200)
    assert [body for _m, _p, body in drain(channel, mine)] == [b"o%d" % i for i in range(200)]
    other.close()
    assert rss(broker.process.pid) - before < BOUND
