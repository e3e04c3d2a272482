"""Helpers the test modules share: fresh names, polling, and the pika calls
many tests make (a confirm-mode channel, an exclusive queue, the ready count,
n publishes, draining a queue with basic.get, a call expected to close the
channel). Fixtures (`broker`, `conn`, `aconn`, `raw`, ...) are in conftest.py;
the raw-socket client is amqp_raw.py.

Test modules import it as `helpers` (pytest puts tests/ on sys.path).
"""
from __future__ import annotations

import os
import time
import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker


def in_ci() -> bool:
    """$CI is set (to anything but "", 0, false or no): .ci/run sets it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str):
    """A service a test needs is missing: a skip on a developer's machine, a
    failure in CI, where tests/prepare.sh installs every service."""
    if in_ci():
        pytest.fail(reason + " [CI is set, so this is a failure, not a skip]", pytrace=False)
    pytest.skip(reason)


def unique(prefix: str = "t") -> str:
    """A fresh name (the session broker is shared by every test)."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01, what: str = "the condition",
             raising: type[Exception] = AssertionError):
    """Poll `predicate` until it returns a truthy value, and return that
    (no sleeps as sync); after `timeout` seconds, `raising` (an
    AssertionError unless a caller that recovers asks for another) that
    names `what` was waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise raising("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)


# -- connections and channels -------------------------------------------------


def connect(port: int, host: str = "127.0.0.1", **params) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host, port, **params))


def assert_serves(port: int) -> None:
    """A new client can connect, declare, publish and get a message back."""
    connection = connect(port)
    try:
        channel = connection.channel()
        queue = channel.queue_declare(unique("alive"), exclusive=True).method.queue
        channel.basic_publish("", queue, b"still here")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"still here"
    finally:
        connection.close()


def confirm_channel(connection):
    """A channel in confirm mode: basic_publish returns once the broker has
    routed (enqueued) the message, so counts read afterwards are exact."""
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def confirm_channel_in(broker, vhost: str):
    """(connection, confirm-mode channel) in `vhost` of `broker` (anything
    with a `url`: a BrokerProcess, a cluster Node)."""
    params = pika.URLParameters(broker.url)
    params.virtual_host = vhost
    connection = pika.BlockingConnection(params)
    return connection, confirm_channel(connection)


def pump(connection, predicate):
    """Let a pika connection dispatch callbacks until `predicate()` holds."""
    def check():
        connection.process_data_events(time_limit=0.02)
        return predicate()
    return wait_for(check)


def pump_while_progressing(connection, progress, target: int, stall: float = 30.0) -> None:
    """Let a pika connection dispatch callbacks until `progress()` (a count
    that grows, e.g. of messages received) reaches `target`. The bound is on
    a stall, not on the whole transfer: it fails only when the count stays
    the same for `stall` seconds, so a long transfer on a loaded machine
    passes and a stuck one fails."""
    last, since = progress(), time.monotonic()
    while last < target:
        connection.process_data_events(time_limit=0.05)
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            raise AssertionError("stuck at %d of %d for %.0fs" % (now, target, stall))


# -- queues and messages -------------------------------------------------------


def declare(channel, prefix: str = "q") -> str:
    """An exclusive queue with a fresh name."""
    return channel.queue_declare(unique(prefix), exclusive=True).method.queue


def new_queue(channel) -> str:
    """An exclusive server-named queue."""
    return channel.queue_declare("", exclusive=True).method.queue


def ready(channel, queue: str) -> int:
    """The queue's ready-message count (a passive declare)."""
    return channel.queue_declare(queue, passive=True).method.message_count


def publish_n(channel, queue: str, n: int = 1, prefix: bytes = b"m") -> None:
    """n messages to `queue` through the default exchange: m0, m1, ..."""
    for i in range(n):
        channel.basic_publish("", queue, prefix + b"%d" % i)


def send(channel, exchange: str, key: str, body: bytes = b"m", headers: dict | None = None) -> None:
    channel.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers))


def publish_sync(channel, exchange: str, key: str, body: bytes = b"m", headers: dict | None = None) -> None:
    """Publish, then a round trip on the same channel (so a channel close surfaces)."""
    send(channel, exchange, key, body, headers)
    channel.basic_qos(prefetch_count=0)


def drain(channel, queue: str, auto_ack: bool = True) -> list[tuple]:
    """basic.get until get-empty: every ready message as (method, properties, body)."""
    out = []
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            return out
        out.append((method, props, body))


# -- errors ---------------------------------------------------------------------


def channel_error(fn, *args, **kwargs) -> tuple[int, str]:
    """Run a call expected to make the broker close the channel: (code, text)."""
    with pytest.raises(ChannelClosedByBroker) as info:
        fn(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text


def exists(connection, kind: str, name: str) -> bool:
    """Whether a queue or exchange (`kind`) exists: a passive declare on a
    channel of its own, which a 404 closes."""
    channel = connection.channel()
    try:
        getattr(channel, kind + "_declare")(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert (exc.reply_code, exc.reply_text) == (404, "NOT_FOUND - no %s '%s' in vhost '/'" % (kind, name))
        return False
    channel.close()
    return True


def inequivalent(what: str, name: str, arg: str, detail: str) -> str:
    """RabbitMQ's text for a redeclare whose `arg` differs."""
    return "PRECONDITION_FAILED - inequivalent arg '%s' for %s '%s' in vhost '/': %s" % (arg, what, name, detail)


def restarted(start_broker, old, kill: bool = False):
    """Stop `old` (SIGTERM, checked clean; or SIGKILL) and start a broker on
    its data directory with the `start_broker` fixture."""
    if kill:
        old.process.kill()
        old.process.wait()
    else:
        old.stop()
        assert old.process.returncode == 0, old.log
    return start_broker("--data-dir", str(old.data_dir))
