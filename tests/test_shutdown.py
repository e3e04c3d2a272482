"""Graceful shutdown (docs/resilience.md): on SIGTERM or SIGINT while a
publisher is confirming persistent messages, the broker closes every
connection with 320 CONNECTION_FORCED, exits 0, and the next start loads the
recovery summaries (no scan) with every confirmed message there."""
from __future__ import annotations

import signal

import pika
import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

from helpers import confirm_channel, connect, drain, unique

SHUTDOWN = (320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_under_confirmed_load_loses_nothing_and_restarts_fast(start_broker, signum):
    broker = start_broker()
    queue = unique("shutdown")
    publisher, idle = connect(broker.port), connect(broker.port)
    channel = confirm_channel(publisher)
    channel.queue_declare(queue, durable=True)
    idle_channel = idle.channel()
    idle_channel.basic_consume(queue, lambda *_: None)

    confirmed: list[bytes] = []
    closed = None
    try:
        while True:  # publishing goes on while the signal arrives
            body = b"m%d" % len(confirmed)
            channel.basic_publish("", queue, body, PERSISTENT)
            confirmed.append(body)
            if len(confirmed) == 300:
                broker.process.send_signal(signum)
    except ConnectionClosedByBroker as exc:
        closed = (exc.reply_code, exc.reply_text)
    assert closed == SHUTDOWN
    # The consumer's connection got the same close (its deliveries were
    # autoack-free, so every message went back to the queue).
    with pytest.raises(ConnectionClosedByBroker) as idle_closed:
        while True:
            idle.process_data_events(time_limit=1)
    assert (idle_closed.value.reply_code, idle_closed.value.reply_text) == SHUTDOWN
    assert broker.process.wait(30) == 0, broker.log
    # Nothing listens any more.
    with pytest.raises(AMQPConnectionError):
        connect(broker.port)

    again = start_broker("--data-dir", str(broker.data_dir))
    assert "clean-shutdown marker found" in again.log
    connection = connect(again.port)
    bodies = [body for _m, _p, body in drain(connection.channel(), queue)]
    connection.close()
    assert set(confirmed) <= set(bodies)
    assert len(bodies) == len(set(bodies))
