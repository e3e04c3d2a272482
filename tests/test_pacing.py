"""Pacing (credit flow of a queue whose backlog outgrows its RAM window, see
vhosts.queue): publishers into a queue with consumers run at the consumers'
pace once half the window is queued, yet are never held for good, and a
queue without consumers takes a deep backlog at once.

In-process with a manual clock (the rules, deterministically), then on a real
broker with real clients (what a user sees: a connection in state "flow",
every message delivered once and in order, a deep backlog accepted).
"""
from __future__ import annotations

from pamqp import commands

from amqp_raw import RawClient
from helpers import connect, unique, wait_for
from http_api import call
from test_queue_semantics_unit import ManualClock, message
from vhosts.consumer import Consumer
from vhosts.queue import PACE_ABOVE, PACE_CREDIT, PACE_FLOOR, PACE_INTERVAL
from vhosts.vhost import VirtualHost

RAM_WINDOW = 2048  # storage.variable_queue.RAM_MESSAGES: what a paced queue stays within


class Publisher:
    """A publishing connection as the vhost sees it: told to wait and to go on."""

    def __init__(self) -> None:
        self.waiting_on: set = set()
        self.throttled = 0
        self.released = 0

    def throttled_by(self, source) -> None:
        self.waiting_on.add(source)
        self.throttled += 1

    def unblocked(self, source) -> None:
        self.waiting_on.discard(source)
        self.released += 1


class Channel:
    """A consumer's channel that takes as many messages as it is allowed."""

    output_blocked = False

    def __init__(self) -> None:
        self.allowed = 0
        self.received: list[bytes] = []

    def can_deliver(self, consumer) -> bool:
        return self.allowed > 0

    def deliver(self, consumer, queue, entry) -> None:
        self.allowed -= 1
        self.received.append(entry.message.body)

    def consumer_cancelled(self, consumer) -> None:
        pass


def setup():
    clock = ManualClock()
    vhost = VirtualHost("/", clock=clock)
    queue = vhost.declare_queue("q", owner=None)
    return clock, vhost, queue


def consume(queue) -> Channel:
    channel = Channel()
    queue.add_consumer(Consumer("c", queue, channel, no_ack=False, exclusive=False, prefetch_count=0, arguments={}))
    return channel


def publish_until_throttled(vhost, publisher: Publisher, start: int, limit: int = 100_000) -> int:
    """Publish numbered messages as a connection would (one at a time, none
    while told to wait); returns the next number."""
    n = start
    while not publisher.waiting_on and n < start + limit:
        vhost.publish(message(b"%d" % n, "q"), ["q"], None, publisher)
        n += 1
    return n


def test_a_queue_without_consumers_is_never_paced():
    _clock, vhost, queue = setup()
    publisher = Publisher()
    assert publish_until_throttled(vhost, publisher, 0, limit=20_000) == 20_000
    assert publisher.throttled == 0
    assert queue.message_count == 20_000


def test_publishers_wait_for_the_consumers_past_half_the_window_and_go_on_as_they_take():
    _clock, vhost, queue = setup()
    channel = consume(queue)
    publisher = Publisher()
    sent = publish_until_throttled(vhost, publisher, 0)
    assert publisher.waiting_on == {queue}
    assert PACE_ABOVE < queue.message_count <= RAM_WINDOW

    channel.allowed = PACE_CREDIT // 2
    queue.dispatch()
    assert not publisher.waiting_on and publisher.released == 1
    sent = publish_until_throttled(vhost, publisher, sent)
    assert publisher.waiting_on == {queue}
    assert queue.message_count <= RAM_WINDOW

    channel.allowed = 10 ** 6
    queue.dispatch()
    assert channel.received == [b"%d" % n for n in range(sent)]
    assert not publisher.waiting_on


def test_a_stalled_consumer_holds_its_publishers_only_until_the_next_pacing_interval():
    clock, vhost, queue = setup()
    consume(queue)  # never allowed to take a message
    publisher = Publisher()
    sent = publish_until_throttled(vhost, publisher, 0)
    for _ in range(20):
        assert publisher.waiting_on == {queue}
        clock.advance(PACE_INTERVAL)
        assert not publisher.waiting_on
        before = sent
        sent = publish_until_throttled(vhost, publisher, sent)
        assert sent - before >= PACE_FLOOR
    # The backlog grows past the RAM window (to be paged) at PACE_FLOOR per interval at least.
    assert queue.message_count == sent > RAM_WINDOW + 10 * PACE_FLOOR


def test_cancelling_the_consumers_or_deleting_the_queue_lets_publishers_go():
    _clock, vhost, queue = setup()
    consume(queue)
    publisher = Publisher()
    publish_until_throttled(vhost, publisher, 0)
    assert publisher.waiting_on == {queue}
    queue.remove_consumer(queue.consumers[0])
    assert not publisher.waiting_on
    assert publish_until_throttled(vhost, publisher, 0, limit=10_000) == 10_000

    other = vhost.declare_queue("other", owner=None)
    consume(other)
    publisher = Publisher()
    while not publisher.waiting_on:
        vhost.publish(message(b"m", "other"), ["other"], None, publisher)
    vhost.delete_queue("other", owner=None)
    assert not publisher.waiting_on


# -- on a real broker ------------------------------------------------------------------

MESSAGES = 30_000
PREFETCH = 50
BODY = b"p" * 1000


class Stream:
    """MESSAGES numbered 1 KiB publishes written without blocking: `write`
    sends what the broker accepts now; `done` once all of it went in."""

    def __init__(self, publisher: RawClient, queue: str) -> None:
        self.sock = publisher.sock
        self.data = b"".join(publisher.publish_bytes(queue, b"%08d" % n + BODY) for n in range(MESSAGES))
        self.sent = 0
        self.sock.setblocking(False)

    def write(self) -> None:
        try:
            while self.sent < len(self.data):
                self.sent += self.sock.send(self.data[self.sent:self.sent + 65536])
        except BlockingIOError:
            pass

    def done(self) -> bool:
        self.write()
        return self.sent == len(self.data)


def connection_states(broker) -> set[str]:
    return {row["state"] for row in call(broker.ports["HTTP"], "GET", "/api/connections").body}


def test_a_fast_publisher_into_a_stalled_consumers_queue_is_paced_yet_every_message_arrives(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    queue = unique("paced")
    consumer = connect(broker.port)
    channel = consumer.channel()
    channel.queue_declare(queue)
    channel.basic_qos(prefetch_count=PREFETCH)
    received = []
    acking = False  # the consumer holds PREFETCH deliveries and acks none
    last_tag = 0

    def on_message(_channel, method, _properties, body) -> None:
        nonlocal last_tag
        received.append(int(body[:8]))
        last_tag = method.delivery_tag
        if acking and (len(received) % 10 == 0 or len(received) == MESSAGES):
            channel.basic_ack(last_tag, multiple=True)

    channel.basic_consume(queue, on_message)
    wait_for(lambda: channel.queue_declare(queue, passive=True).method.consumer_count == 1)

    publisher = RawClient.connected(broker.port, channels=(1,))
    stream = Stream(publisher, queue)

    def paced() -> bool:
        stream.write()
        return "flow" in connection_states(broker)

    wait_for(paced, timeout=60)
    # Not held for good: the whole stream goes in while the consumer still acks nothing.
    wait_for(stream.done, timeout=120)
    wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == MESSAGES - PREFETCH,
             timeout=120)

    wait_for(lambda: consumer.process_data_events(time_limit=0.1) or len(received) >= PREFETCH)
    assert received == list(range(PREFETCH))
    acking = True
    channel.basic_ack(last_tag, multiple=True)
    wait_for(lambda: consumer.process_data_events(time_limit=0.1) or len(received) == MESSAGES, timeout=120)
    assert received == list(range(MESSAGES))
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    publisher.close()
    consumer.close()


def test_a_queue_without_consumers_takes_a_deep_backlog(start_broker):
    broker = start_broker()
    queue = unique("deep")
    publisher = RawClient.connected(broker.port, channels=(1,))
    publisher.send_frame(commands.Queue.Declare(queue=queue), 1)
    publisher.expect(commands.Queue.DeclareOk, 1)
    wait_for(Stream(publisher, queue).done, timeout=120)
    with connect(broker.port) as reader:
        channel = reader.channel()
        wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count == MESSAGES,
                 timeout=120)
        first = [int(channel.basic_get(queue, auto_ack=True)[2][:8]) for _ in range(3)]
    assert first == [0, 1, 2]
    publisher.close()
