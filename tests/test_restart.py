"""Durable definitions survive a broker restart; nothing else does.

Real broker processes and a real client (pika): a broker is started on a
data directory, definitions are declared, the process is stopped (SIGTERM,
a clean stop) or killed (SIGKILL), and a new process is started on the same
`--data-dir`. Passive declares (404 = gone), redeclares (406 = different
properties or arguments) and routing (publish, then basic.get) check what
came back. RabbitMQ's rules:
- durable exchanges and durable queues come back with their arguments,
  auto-delete ones included; exclusive queues never do, durable or not;
- a binding comes back when both its ends are durable (the source may be a
  predeclared amq.* exchange);
- transient messages are gone;
- a deletion (explicit, or an auto-delete) stays deleted.
"""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
from decimal import Decimal

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from conftest import ROOT, BrokerProcess, launch
from helpers import confirm_channel, connect, drain, exists, inequivalent, unique


def restart(tmp_path, old: BrokerProcess, started: list, kill: bool = False) -> BrokerProcess:
    """Stop `old` (SIGTERM and wait, or SIGKILL) and start a broker on its data dir."""
    if kill:
        old.process.kill()
        old.process.wait()
    else:
        old.stop()
        assert old.process.returncode == 0, old.log
    new = launch(tmp_path, "--data-dir", str(old.data_dir))
    new.data_dir = old.data_dir
    started.append(new)
    return new


@pytest.fixture
def brokers(tmp_path):
    """Every broker process a test starts, stopped at the end."""
    started: list = []
    yield started
    for proc in started:
        proc.stop()


def first_broker(tmp_path, started: list) -> BrokerProcess:
    proc = launch(tmp_path)
    started.append(proc)
    return proc


def routed(connection, exchange: str, key: str, queue: str, headers: dict | None = None) -> bool:
    """Publish a fresh body to `exchange` and say whether `queue` got it
    (the queue is drained; the publish is confirmed before the get)."""
    channel = confirm_channel(connection)
    body = unique("body").encode()
    channel.basic_publish(exchange, key, body, pika.BasicProperties(headers=headers))
    bodies = [b for _m, _p, b in drain(channel, queue)]
    channel.close()
    return body in bodies


def channel_error(connection, fn_name: str, *args, **kwargs) -> tuple[int, str]:
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        getattr(channel, fn_name)(*args, **kwargs)
    return info.value.reply_code, info.value.reply_text


class World:
    """Names of everything `declare_world` creates (fresh per test)."""

    def __init__(self) -> None:
        for attr in ("dx", "ae", "src", "mid", "hx", "ix", "adx", "tx",
                     "dq", "aeq", "e2eq", "hq", "amqq", "adq", "tq", "xq", "tdq", "ttl"):
            setattr(self, attr, unique(attr))


QUEUE_ARGS = {
    "x-message-ttl": 60000,
    "x-max-length": 5,
    # pika encodes no floats; the store's float round trip is in test_definitions.py.
    "x-custom": {"nested": [1, "two", Decimal("3.5"), True, None, {"deep": b"\xff\xfe"}],
                 "when": datetime.datetime(2024, 1, 2, 3, 4, 5)},
}


def declare_world(connection, w: World) -> None:
    ch = connection.channel()
    # Exchanges.
    ch.exchange_declare(w.ae, "fanout", durable=True)
    ch.exchange_declare(w.dx, "direct", durable=True, arguments={"alternate-exchange": w.ae})
    ch.exchange_declare(w.src, "topic", durable=True)
    ch.exchange_declare(w.mid, "fanout", durable=True)
    ch.exchange_declare(w.hx, "headers", durable=True)
    ch.exchange_declare(w.ix, "fanout", durable=True, internal=True)
    ch.exchange_declare(w.adx, "fanout", durable=True, auto_delete=True)
    ch.exchange_declare(w.tx, "direct", durable=False)
    # Queues.
    ch.queue_declare(w.dq, durable=True, arguments=QUEUE_ARGS)
    for q in (w.aeq, w.e2eq, w.hq, w.amqq):
        ch.queue_declare(q, durable=True)
    ch.queue_declare(w.adq, durable=True, auto_delete=True)
    ch.queue_declare(w.tq, durable=False)
    ch.queue_declare(w.xq, durable=True, exclusive=True)
    ch.queue_declare(w.tdq, durable=True)  # the destination of transient-source bindings
    # Bindings between durable ends: all come back.
    ch.queue_bind(w.dq, w.dx, "k")
    ch.queue_bind(w.aeq, w.ae)
    ch.exchange_bind(w.mid, w.src, "a.*")  # e2e: src -> mid -> e2eq
    ch.queue_bind(w.e2eq, w.mid)
    ch.queue_bind(w.hq, w.hx, arguments={"x-match": "all", "color": "red", "size": 3})
    ch.queue_bind(w.amqq, "amq.direct", w.amqq)
    ch.queue_bind(w.adq, w.adx)
    ch.queue_bind(w.adq, w.dx, "ad")
    # Bindings with a transient or exclusive end: none comes back.
    ch.queue_bind(w.tq, w.dx, "t")  # durable exchange -> transient queue
    ch.queue_bind(w.xq, w.dx, "x")  # durable exchange -> exclusive durable queue
    ch.queue_bind(w.tdq, w.tx, "t")  # transient exchange -> durable queue
    # A transient message in a durable queue.
    ch.basic_publish("", w.dq, b"transient", pika.BasicProperties(delivery_mode=1))
    ch.close()


def check_world(connection, w: World) -> None:
    # Durable exchanges and queues came back; the others did not.
    for name in (w.dx, w.ae, w.src, w.mid, w.hx, w.ix, w.adx):
        assert exists(connection, "exchange", name), name
    for name in (w.dq, w.aeq, w.e2eq, w.hq, w.amqq, w.adq, w.tdq):
        assert exists(connection, "queue", name), name
    assert not exists(connection, "exchange", w.tx)
    assert not exists(connection, "queue", w.tq)
    assert not exists(connection, "queue", w.xq)
    # The transient message is gone.
    ch = connection.channel()
    assert ch.queue_declare(w.dq, passive=True).method.message_count == 0
    ch.close()

    # Properties and arguments came back: same declaration is fine, others are 406.
    ch = connection.channel()
    ch.queue_declare(w.dq, durable=True, arguments=QUEUE_ARGS)
    ch.queue_declare(w.adq, durable=True, auto_delete=True)
    ch.exchange_declare(w.dx, "direct", durable=True, arguments={"alternate-exchange": w.ae})
    ch.exchange_declare(w.adx, "fanout", durable=True, auto_delete=True)
    ch.exchange_declare(w.ix, "fanout", durable=True, internal=True)
    ch.close()
    assert channel_error(connection, "queue_declare", w.dq, durable=False, arguments=QUEUE_ARGS) == (
        406, inequivalent("queue", w.dq, "durable", "received 'false' but current is 'true'"))
    assert channel_error(connection, "queue_declare", w.dq, durable=True,
                         arguments={**QUEUE_ARGS, "x-max-length": 6}) == (
        406, inequivalent("queue", w.dq, "x-max-length", "received '6' but current is '5'"))
    assert channel_error(connection, "queue_declare", w.adq, durable=True)[0] == 406  # auto_delete differs
    assert channel_error(connection, "exchange_declare", w.dx, "direct", durable=False)[0] == 406
    assert channel_error(connection, "exchange_declare", w.dx, "topic", durable=True)[0] == 406
    assert channel_error(connection, "exchange_declare", w.dx, "direct", durable=True,
                         arguments={"alternate-exchange": "other"})[0] == 406
    assert channel_error_on_publish(connection, w.ix) == 403  # still internal

    # Bindings between durable ends route again.
    assert routed(connection, w.dx, "k", w.dq)
    assert routed(connection, w.dx, "unbound-key", w.aeq)  # via the alternate exchange
    assert routed(connection, w.src, "a.b", w.e2eq)  # exchange-to-exchange
    assert not routed(connection, w.src, "b.a", w.e2eq)
    assert routed(connection, w.hx, "", w.hq, {"color": "red", "size": 3})
    assert not routed(connection, w.hx, "", w.hq, {"color": "blue", "size": 3})
    assert routed(connection, "amq.direct", w.amqq, w.amqq)
    assert routed(connection, w.adx, "", w.adq)
    assert routed(connection, w.dx, "ad", w.adq)

    # Bindings with a transient end did not come back, even when both ends exist again.
    ch = connection.channel()
    ch.queue_declare(w.tq, durable=False)
    ch.exchange_declare(w.tx, "direct", durable=False)
    ch.close()
    assert routed(connection, w.dx, "t", w.aeq)  # unroutable on dx: to its alternate exchange
    assert not routed(connection, w.dx, "t", w.tq)
    assert not routed(connection, w.tx, "t", w.tdq)


def channel_error_on_publish(connection, exchange: str) -> int:
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        channel.basic_publish(exchange, "", b"m")
        channel.basic_qos(prefetch_count=0)  # a round trip: the close arrives first
    return info.value.reply_code


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_exactly_the_durable_definitions_come_back(tmp_path, brokers, kill):
    w = World()
    first = first_broker(tmp_path, brokers)
    assert (first.data_dir / "definitions.db").exists()
    connection = connect(first.port)
    declare_world(connection, w)
    if kill:
        # Killed with the exclusive queue's owner and an auto-delete queue's
        # consumer still connected: nothing is cleaned up, and both come
        # back as they would from RabbitMQ (the durable auto-delete queue
        # does, the exclusive one does not).
        connection.channel().basic_consume(w.adq, lambda *a: None)
        second = restart(tmp_path, first, brokers, kill=True)
    else:
        connection.close()
        second = restart(tmp_path, first, brokers)
    with connect(second.port) as connection:
        check_world(connection, w)


def test_internal_exchange_still_refuses_publishes(tmp_path, brokers):
    first = first_broker(tmp_path, brokers)
    name = unique("internal")
    with connect(first.port) as connection:
        connection.channel().exchange_declare(name, "fanout", durable=True, internal=True)
    second = restart(tmp_path, first, brokers)
    with connect(second.port) as connection:
        assert channel_error_on_publish(connection, name) == 403


def test_a_second_restart_keeps_the_same_definitions(tmp_path, brokers):
    w = World()
    first = first_broker(tmp_path, brokers)
    with connect(first.port) as connection:
        declare_world(connection, w)
    second = restart(tmp_path, first, brokers, kill=True)
    third = restart(tmp_path, second, brokers)
    with connect(third.port) as connection:
        check_world(connection, w)


def test_binding_from_durable_exchange_to_transient_queue_is_not_restored(tmp_path, brokers):
    first = first_broker(tmp_path, brokers)
    x, q = unique("x"), unique("q")
    with connect(first.port) as connection:
        ch = connection.channel()
        ch.exchange_declare(x, "fanout", durable=True)
        ch.queue_declare(q, durable=False)
        ch.queue_bind(q, x)
        assert routed(connection, x, "", q)
    second = restart(tmp_path, first, brokers)
    with connect(second.port) as connection:
        assert exists(connection, "exchange", x)
        assert not exists(connection, "queue", q)
        connection.channel().queue_declare(q, durable=False)
        assert not routed(connection, x, "", q)


def test_deletions_stay_deleted(tmp_path, brokers):
    first = first_broker(tmp_path, brokers)
    x, q, x2, q2, adx, keep = (unique(p) for p in ("x", "q", "x2", "q2", "adx", "keep"))
    with connect(first.port) as connection:
        ch = connection.channel()
        ch.exchange_declare(x, "direct", durable=True)
        ch.exchange_declare(x2, "direct", durable=True)
        ch.exchange_declare(adx, "direct", durable=True, auto_delete=True)
        for name in (q, q2, keep):
            ch.queue_declare(name, durable=True)
        ch.queue_bind(q, x, "k")
        ch.queue_bind(q2, x2, "k")
        ch.queue_bind(keep, x2, "keep")
        ch.queue_bind(keep, adx, "k")
    second = restart(tmp_path, first, brokers)
    with connect(second.port) as connection:
        for name in (x, x2, adx):
            assert exists(connection, "exchange", name)
        for name in (q, q2, keep):
            assert exists(connection, "queue", name)
        ch = connection.channel()
        ch.exchange_delete(x)  # an explicit exchange deletion, with its binding
        ch.queue_delete(q2)  # a queue deletion removes the bindings to it
        ch.queue_unbind(keep, x2, "keep")  # an explicit unbind
        ch.queue_unbind(keep, adx, "k")  # the last binding of an auto-delete exchange
        assert not exists(connection, "exchange", adx)
    third = restart(tmp_path, second, brokers, kill=True)
    with connect(third.port) as connection:
        assert not exists(connection, "exchange", x)
        assert not exists(connection, "queue", q2)
        assert not exists(connection, "exchange", adx)
        assert exists(connection, "queue", q) and exists(connection, "exchange", x2)
        ch = connection.channel()
        ch.queue_declare(q2, durable=True)
        ch.close()
        assert not routed(connection, x2, "k", q2)
        assert not routed(connection, x2, "keep", keep)


def test_server_named_durable_queue_comes_back(tmp_path, brokers):
    first = first_broker(tmp_path, brokers)
    with connect(first.port) as connection:
        name = connection.channel().queue_declare("", durable=True).method.queue
        assert name.startswith("amq.gen-")
    second = restart(tmp_path, first, brokers, kill=True)
    with connect(second.port) as connection:
        assert exists(connection, "queue", name)


def test_default_user_is_not_recreated_and_vhost_kept(tmp_path, brokers):
    """The default user exists because the first start seeded the store;
    later starts read it from there (a changed default_pass is ignored, as
    RabbitMQ's default_pass only matters on a fresh node)."""
    first = first_broker(tmp_path, brokers)
    first.stop()
    second = launch(tmp_path, "--data-dir", str(first.data_dir), "--default-pass", "changed")
    second.data_dir = first.data_dir
    brokers.append(second)
    with connect(second.port) as connection:  # guest/guest still works
        assert connection.is_open
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(second.port, credentials=pika.PlainCredentials("guest", "changed"))


def test_an_unusable_data_dir_is_reported(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    result = subprocess.run(
        [sys.executable, "-m", "cli.server", "--bind", "127.0.0.1", "--port", "0",
         "--data-dir", str(blocker / "data")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert "cannot create the data directory %s: Not a directory" % (blocker / "data") in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_persistent_messages_keep_order_properties_and_redelivered_flag(tmp_path, brokers, kill):
    """Persistent messages in a durable queue come back after a restart in
    order, byte for byte, with every property and header; one delivered (not
    acked) before the stop comes back redelivered; a transient one is gone."""
    first = first_broker(tmp_path, brokers)
    connection = connect(first.port)
    channel = confirm_channel(connection)
    queue = unique("msgs")
    channel.queue_declare(queue, durable=True)
    sent = []
    for i, size in enumerate([10, 5000, 0, 300, 70000]):  # embedded and message-store bodies
        body = bytes([i]) * size
        properties = pika.BasicProperties(
            delivery_mode=2, content_type="application/x-test", content_encoding="gzip",
            headers={"i": i, "nested": {"list": [1, "two", True], "dec": Decimal("1.5")}, "bin": b"\x00\xff"},
            priority=3, correlation_id="c%d" % i, reply_to="r", expiration="600000", message_id="m%d" % i,
            timestamp=1700000000 + i, type="t", user_id="guest", app_id="hutch-test",
        )
        channel.basic_publish("", queue, body, properties)
        sent.append((body, properties))
    channel.basic_publish("", queue, b"transient", pika.BasicProperties(delivery_mode=1))
    method, _props, body = channel.basic_get(queue)  # delivered, never acked
    assert body == sent[0][0] and not method.redelivered
    second = restart(tmp_path, first, brokers, kill=kill)
    got = drain(confirm_channel(connect(second.port)), queue)
    assert [b for _m, _p, b in got] == [b for b, _p in sent]
    assert [m.redelivered for m, _p, _b in got][0] is True
    if not kill:
        assert [m.redelivered for m, _p, _b in got][1:] == [False] * 4
    for (_m, props, _b), (_body, expected) in zip(got, sent):
        for name in ("delivery_mode", "content_type", "content_encoding", "headers", "priority",
                     "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                     "user_id", "app_id"):
            assert getattr(props, name) == getattr(expected, name), name
