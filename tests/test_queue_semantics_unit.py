"""The pure parts of queue semantics, in-process with a manual clock: how
arguments and policies combine (`vhosts.queue_arguments.effective`),
`Queue.apply_policy`, the one expiry timer per queue, and the dead-letter hook
(`VirtualHost.on_dead_letter`) every dying message passes.
"""
from __future__ import annotations

import heapq
import struct

import pytest
from pamqp import commands

from storage import Message
from vhosts.queue_arguments import QueueSettings, effective
from vhosts.vhost import VirtualHost


class ManualClock:
    """The vhosts.clock port with time that moves only when told to."""

    def __init__(self) -> None:
        self.time = 1_700_000_000_000
        self.timers: list = []  # heap of [due, order, callback, live]
        self._order = 0

    def now(self) -> int:
        return self.time

    def call_later(self, delay_ms: int, callback):
        timer = [self.time + max(delay_ms, 0), self._order, callback, True]
        self._order += 1
        heapq.heappush(self.timers, timer)
        return _Handle(timer)

    @property
    def live_timers(self) -> int:
        return sum(1 for t in self.timers if t[3])

    def advance(self, ms: int) -> None:
        end = self.time + ms
        while self.timers and self.timers[0][0] <= end:
            timer = heapq.heappop(self.timers)
            self.time = max(self.time, timer[0])
            if timer[3]:
                timer[3] = False
                timer[2]()
        self.time = end


class _Handle:
    def __init__(self, timer) -> None:
        self.timer = timer

    def cancel(self) -> None:
        self.timer[3] = False


class Publisher:
    def throttled_by(self, source) -> None:
        pass


def message(body: bytes, key: str, **properties) -> Message:
    header = struct.pack(">HHQ", 60, 0, len(body)) + commands.Basic.Properties(**properties).marshal()
    return Message("", key, header, body)


@pytest.fixture
def world():
    clock = ManualClock()
    vhost = VirtualHost("/", clock=clock)
    deaths = []
    vhost.on_dead_letter.append(lambda queue, reason, msg, death: deaths.append((queue.name, reason, msg.body, death)))
    return clock, vhost, deaths


def publish(vhost, key: str, body: bytes, **properties) -> tuple:
    return vhost.publish(message(body, key, **properties), [key], None, Publisher())


def ready_bodies(queue) -> list[bytes]:
    out = []
    while (entry := queue.get()) is not None:
        out.append(entry.message.body)
        queue.ack((entry,))
    return out


# -- effective settings ------------------------------------------------------------


def test_no_arguments_no_policy_means_no_limits():
    assert effective({}, None) == QueueSettings()
    assert effective({"x-other": 1}, {"ha-mode": "all"}) == QueueSettings()


@pytest.mark.parametrize("arg,key,field", [
    ("x-message-ttl", "message-ttl", "message_ttl"),
    ("x-expires", "expires", "expires"),
    ("x-max-length", "max-length", "max_length"),
    ("x-max-length-bytes", "max-length-bytes", "max_length_bytes"),
    ("x-delivery-limit", "delivery-limit", "delivery_limit"),
])
def test_numeric_limits_take_the_smaller_of_argument_and_policy(arg, key, field):
    assert getattr(effective({arg: 10}, {key: 20}), field) == 10
    assert getattr(effective({arg: 30}, {key: 20}), field) == 20
    assert getattr(effective({}, {key: 20}), field) == 20
    assert getattr(effective({arg: 30}, None), field) == 30


@pytest.mark.parametrize("arg,key,field,a,p", [
    ("x-overflow", "overflow", "overflow", "reject-publish", "reject-publish-dlx"),
    ("x-dead-letter-exchange", "dead-letter-exchange", "dead_letter_exchange", "ax", "px"),
    ("x-dead-letter-routing-key", "dead-letter-routing-key", "dead_letter_routing_key", "ak", "pk"),
])
def test_other_settings_prefer_the_argument(arg, key, field, a, p):
    assert getattr(effective({arg: a}, {key: p}), field) == a
    assert getattr(effective({}, {key: p}), field) == p


# -- one timer per queue --------------------------------------------------------------


def test_one_hundred_thousand_distinct_ttls_use_one_timer(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None)
    n = 100_000
    for i in range(n):
        # latest first, so every publish is the new earliest expiry
        publish(vhost, "q", b"%d" % i, expiration=str(2 * n - i))
    assert clock.live_timers == 1
    assert queue.message_count == n
    clock.advance(n + n // 2)  # half of them are due
    assert queue.message_count == n // 2
    assert clock.live_timers == 1
    clock.advance(n)
    assert queue.message_count == 0 and clock.live_timers == 0
    assert len(deaths) == n and {d[1] for d in deaths} == {"expired"}
    assert [d[2] for d in deaths[:3]] == [b"%d" % (n - 1), b"%d" % (n - 2), b"%d" % (n - 3)]


def test_expired_messages_leave_from_anywhere_and_the_rest_keep_their_order(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None)
    for i in range(10):
        publish(vhost, "q", b"%d" % i, **({"expiration": "50"} if i % 3 == 1 else {}))
    clock.advance(50)
    assert queue.message_count == 7
    assert [d[2] for d in deaths] == [b"1", b"4", b"7"]
    assert ready_bodies(queue) == [b"0", b"2", b"3", b"5", b"6", b"8", b"9"]


# -- policies -------------------------------------------------------------------------


def test_a_policy_max_length_trims_at_once_and_clearing_it_lifts_the_limit(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None, arguments={"x-max-length": 5})
    for i in range(5):
        publish(vhost, "q", b"%d" % i)
    queue.apply_policy({"max-length": 2})
    assert queue.message_count == 2
    assert [(d[1], d[2]) for d in deaths] == [("maxlen", b"0"), ("maxlen", b"1"), ("maxlen", b"2")]
    queue.apply_policy(None)  # back to the argument's 5
    for i in range(5, 9):
        publish(vhost, "q", b"%d" % i)
    assert ready_bodies(queue) == [b"4", b"5", b"6", b"7", b"8"]


def test_a_policy_ttl_applies_to_messages_published_after_it(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None)
    publish(vhost, "q", b"before")
    queue.apply_policy({"message-ttl": 100})
    publish(vhost, "q", b"after")
    clock.advance(100)
    assert [d[2] for d in deaths] == [b"after"]
    assert ready_bodies(queue) == [b"before"]


def test_a_policy_expires_deletes_the_unused_queue(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None)
    queue.apply_policy({"expires": 1000})
    clock.advance(999)
    assert "q" in vhost.queues
    vhost.declare_queue("q", owner=None)  # a redeclare renews the lease
    clock.advance(999)
    assert "q" in vhost.queues
    clock.advance(1)
    assert "q" not in vhost.queues and queue.deleted


def test_a_policy_dead_letter_exchange_routes_dead_messages(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None)
    target = vhost.declare_queue("target", owner=None)
    queue.apply_policy({"dead-letter-exchange": "", "dead-letter-routing-key": "target", "max-length": 1})
    publish(vhost, "q", b"a")
    publish(vhost, "q", b"b")
    entry = target.get()
    assert entry.message.body == b"a"
    assert entry.message.headers["x-death"][0]["reason"] == "maxlen"


# -- the dead-letter hook -------------------------------------------------------------


def test_every_death_passes_the_hook_with_its_death_info(world):
    clock, vhost, deaths = world
    queue = vhost.declare_queue("q", owner=None, arguments={
        "x-max-length": 2, "x-delivery-limit": 0, "x-message-ttl": 500})
    for body in (b"maxlen", b"rejected", b"limit"):
        publish(vhost, "q", body, headers={"CC": ["nowhere"]})
    first = queue.get()
    queue.reject([first])
    queue.requeue([queue.get()])
    publish(vhost, "q", b"expired")
    clock.advance(500)
    assert [(d[1], d[2]) for d in deaths] == [
        ("maxlen", b"maxlen"), ("rejected", b"rejected"), ("delivery_limit", b"limit"), ("expired", b"expired")]
    death = deaths[0][3]
    assert (death.queue, death.exchange, death.routing_keys, death.dead_letter_exchange) == (
        "q", "", ["q", "nowhere"], None)
    assert death.time == clock.time - 500
