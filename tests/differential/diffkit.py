"""The differential scenario runner: the same client operations against hutch
and against a real RabbitMQ, compared observation by observation.

A scenario is a list of `op(name, **fields)` entries run in order with pika's
BlockingConnection. Every operation records what a client observes:

- a synchronous method: its reply (`("Queue.DeclareOk", queue, message_count,
  consumer_count)`, `("Basic.GetOk", ...)`, `("Basic.GetEmpty",)`, ...);
- an asynchronous method (publish, ack, nack, reject, cancel with nowait):
  nothing by itself, but the runner then makes one harmless synchronous call
  (a passive declare of `amq.direct`) so that an error the method caused, or
  a basic.return it caused, is attributed to it deterministically;
- an error: `("channel-error", reply_code, reply_text)` for
  ChannelClosedByBroker and `("connection-error", reply_code, reply_text)` for
  ConnectionClosedByBroker. The next operation on that channel (connection)
  transparently opens a new one.

Names: any `{word}` inside a string field is replaced by a name unique to the
run (`diff-<run id>-word`), and every such name is mapped back to `{word}` in
the observations. Server-generated names (`amq.gen-*`, `amq.ctag-*`, direct
reply-to tokens `amq.rabbitmq.reply-to.<opaque>`) become numbered placeholders
in order of first appearance (`amq.gen-<1>`, `amq.rabbitmq.reply-to.<1>`); a
string field of a later operation may use such a placeholder and gets the
real name it stands for in this run (a reply to a token seen in a reply_to). After the run, every
connection is closed and every name is deleted as a queue and as an exchange,
so nothing is left behind on the RabbitMQ used as the reference.

Channels: `on="1.1"` (the default) is channel 1 of connection 1; `on="2.1"`
is a channel of a second connection (for exclusive-queue scenarios).
"""
from __future__ import annotations

import datetime
import re
import time
import uuid

import pika
import pika.exceptions
from pamqp import commands, heartbeat as pheartbeat

import amqp_raw

NAME_TOKEN = re.compile(r"\{([a-z][a-z0-9_]*)\}")
SERVER_NAMES = re.compile(r"(amq\.gen-|amq\.ctag-)[A-Za-z0-9_\-]{22}"
                          r"|(amq\.rabbitmq\.reply-to\.)[A-Za-z0-9+/=]+\.[A-Za-z0-9+/=]+")
PLACEHOLDER = re.compile(r"(amq\.gen-|amq\.ctag-|amq\.rabbitmq\.reply-to\.)<[0-9]+>")
WAIT_SECONDS = 5.0


def op(name: str, **fields) -> tuple[str, dict]:
    return (name, fields)


# -- observation helpers ------------------------------------------------------


def _props(properties, delivery_count: bool = False) -> dict:
    """The properties set, without x-delivery-count unless `delivery_count`:
    hutch counts deliveries on every queue (a deliberate addition; RabbitMQ
    3.10 only on quorum queues), which tests/test_dead_letter.py covers."""
    if properties is None:
        return {}
    props = {k: v for k, v in sorted(vars(properties).items()) if v is not None}
    headers = props.get("headers")
    if headers and "x-delivery-count" in headers and not delivery_count:
        headers = {k: v for k, v in headers.items() if k != "x-delivery-count"}
        if headers:
            props["headers"] = headers
        else:
            del props["headers"]
    return props


def without_death_clocks(value):
    """Observations as two brokers can share them: every datetime (x-death
    `time`, seconds on two clocks) becomes "<time>", and the x-last-death-*
    headers hutch adds (RabbitMQ 3.13 behaviour, absent from 3.10) are left
    out."""
    if isinstance(value, datetime.datetime):
        return "<time>"
    if isinstance(value, dict):
        return {k: without_death_clocks(v) for k, v in value.items() if not k.startswith("x-last-death-")}
    if isinstance(value, (list, tuple)):
        return type(value)(without_death_clocks(v) for v in value)
    return value


def _body(body):
    if isinstance(body, bytes):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body
    return body


def _error(exc: BaseException) -> tuple:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        return ("channel-error", exc.reply_code, exc.reply_text)
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        return ("connection-error", exc.reply_code, exc.reply_text)
    return ("client-error", type(exc).__name__)


class _Normaliser:
    """Maps run-specific names back to their `{word}` placeholders."""

    def __init__(self, names: dict[str, str]) -> None:
        # longest first, so that "{q1}" never eats the start of "{q10}"
        self.names = sorted(((real, "{%s}" % key) for key, real in names.items()), key=lambda p: -len(p[0]))
        self.server: dict[str, str] = {}

    def _server_name(self, match: re.Match) -> str:
        real = match.group(0)
        if real not in self.server:
            prefix = match.group(1) or match.group(2)
            count = sum(1 for v in self.server.values() if v.startswith(prefix + "<"))
            self.server[real] = "%s<%d>" % (prefix, count + 1)
        return self.server[real]

    def __call__(self, value):
        if isinstance(value, str):
            for real, placeholder in self.names:
                value = value.replace(real, placeholder)
            return SERVER_NAMES.sub(self._server_name, value)
        if isinstance(value, (list, tuple)):
            return type(value)(self(v) for v in value)
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        return value


# -- the runner ---------------------------------------------------------------


class _Channel:
    def __init__(self, channel, delivery_count: bool) -> None:
        self.channel = channel
        self.delivery_count = delivery_count
        self.deliveries: list[tuple] = []
        self.returns: list[tuple] = []
        self.cancels: list[tuple] = []
        channel.add_on_return_callback(self._on_return)
        channel.add_on_cancel_callback(self._on_cancel)

    def _on_return(self, _channel, method, properties, body) -> None:
        self.returns.append(
            ("Basic.Return", method.reply_code, method.reply_text, method.exchange, method.routing_key,
             _body(body), _props(properties, self.delivery_count))
        )

    def _on_cancel(self, method) -> None:
        self.cancels.append(("Basic.Cancel", method.method.consumer_tag))

    def on_message(self, _channel, method, properties, body) -> None:
        self.deliveries.append(
            ("Basic.Deliver", method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange,
             method.routing_key, _body(body), _props(properties, self.delivery_count))
        )


class ScenarioRun:
    def __init__(self, url: str, delivery_count: bool = False) -> None:
        self.url = url
        self.delivery_count = delivery_count  # compare x-delivery-count headers (quorum queues)
        self.run_id = uuid.uuid4().hex[:10]
        self.names: dict[str, str] = {}
        self.connections: dict[str, pika.BlockingConnection] = {}
        self.channels: dict[str, _Channel] = {}
        self.observations: list = []
        self.server_named: set[str] = set()

    # names

    def name(self, key: str) -> str:
        if key not in self.names:
            self.names[key] = "diff-%s-%s" % (self.run_id, key)
        return self.names[key]

    def expand(self, value):
        if isinstance(value, str):
            if PLACEHOLDER.search(value):
                value = PLACEHOLDER.sub(self._server_named, value)
            return NAME_TOKEN.sub(lambda m: self.name(m.group(1)), value)
        if isinstance(value, list):
            return [self.expand(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.expand(v) for v in value)
        if isinstance(value, dict):
            return {self.expand(k): self.expand(v) for k, v in value.items()}
        return value

    def _server_named(self, match: re.Match) -> str:
        """The real server-generated name a placeholder stands for: numbered
        as the final normalisation numbers the observations so far."""
        normalise = _Normaliser(self.names)
        normalise(self.observations)
        real = {placeholder: name for name, placeholder in normalise.server.items()}.get(match.group(0))
        if real is None:
            raise AssertionError("no %s observed yet" % match.group(0))
        return real

    # connections and channels

    def connection(self, key: str) -> pika.BlockingConnection:
        conn = self.connections.get(key)
        if conn is None or not conn.is_open:
            params = pika.URLParameters(self.url)
            params.socket_timeout = WAIT_SECONDS
            params.blocked_connection_timeout = WAIT_SECONDS
            conn = pika.BlockingConnection(params)
            self.connections[key] = conn
        return conn

    def chan(self, on: str) -> _Channel:
        ch = self.channels.get(on)
        if ch is None or not ch.channel.is_open:
            conn_key = on.split(".")[0]
            ch = _Channel(self.connection(conn_key).channel(), self.delivery_count)
            self.channels[on] = ch
        return ch

    def sync(self, ch: _Channel) -> None:
        """One synchronous round trip, then dispatch what arrived before it."""
        ch.channel.exchange_declare("amq.direct", passive=True)
        ch.channel.connection.process_data_events(time_limit=0)

    # running

    def run(self, scenario: list) -> list:
        try:
            for name, fields in scenario:
                fields = self.expand(dict(fields))
                on = fields.pop("on", "1.1")
                try:
                    handler = getattr(self, "op_" + name.replace(".", "_"))
                    handler(on, **fields)
                except (pika.exceptions.AMQPChannelError, pika.exceptions.AMQPConnectionError) as exc:
                    self.observations.append(_error(exc))
                    channel = self.channels.get(on)
                    if channel is not None:
                        self.observations.extend(channel.returns)
                        channel.returns.clear()
        finally:
            self.close()
        normalise = _Normaliser(self.names)
        return [normalise(o) for o in self.observations]

    def record(self, *observation) -> None:
        self.observations.append(tuple(observation))

    def close(self) -> None:
        for conn in self.connections.values():
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass
        self.connections.clear()
        self.channels.clear()
        self.cleanup()

    def cleanup(self) -> None:
        """Delete every name used by the run, as a queue and as an exchange."""
        names = list(self.names.values()) + sorted(self.server_named)
        if not names:
            return
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = conn.channel()
            for name in names:
                for delete in ("queue_delete", "exchange_delete"):
                    if name.startswith("amq.") and delete == "exchange_delete":
                        continue
                    try:
                        getattr(channel, delete)(name)
                    except pika.exceptions.AMQPChannelError:
                        channel = conn.channel()
        finally:
            conn.close()

    # -- operations: exchange class ------------------------------------------------

    def op_exchange_declare(self, on, exchange, exchange_type="direct", passive=False, durable=False,
                            auto_delete=False, internal=False, arguments=None):
        self.chan(on).channel.exchange_declare(exchange, exchange_type, passive, durable, auto_delete, internal,
                                               arguments)
        self.record("Exchange.DeclareOk")

    def op_exchange_delete(self, on, exchange, if_unused=False):
        self.chan(on).channel.exchange_delete(exchange, if_unused)
        self.record("Exchange.DeleteOk")

    def op_exchange_bind(self, on, destination, source, routing_key="", arguments=None):
        self.chan(on).channel.exchange_bind(destination, source, routing_key, arguments)
        self.record("Exchange.BindOk")

    def op_exchange_unbind(self, on, destination, source, routing_key="", arguments=None):
        self.chan(on).channel.exchange_unbind(destination, source, routing_key, arguments)
        self.record("Exchange.UnbindOk")

    # -- operations: queue class ---------------------------------------------------

    def op_queue_declare(self, on, queue="", passive=False, durable=False, exclusive=False, auto_delete=False,
                         arguments=None):
        reply = self.chan(on).channel.queue_declare(queue, passive, durable, exclusive, auto_delete, arguments)
        m = reply.method
        if m.queue.startswith("amq.gen-"):
            self.server_named.add(m.queue)
        self.record("Queue.DeclareOk", m.queue, m.message_count, m.consumer_count)

    def op_queue_bind(self, on, queue, exchange, routing_key=None, arguments=None):
        self.chan(on).channel.queue_bind(queue, exchange, routing_key, arguments)
        self.record("Queue.BindOk")

    def op_queue_unbind(self, on, queue, exchange, routing_key=None, arguments=None):
        self.chan(on).channel.queue_unbind(queue, exchange, routing_key, arguments)
        self.record("Queue.UnbindOk")

    def op_queue_purge(self, on, queue):
        reply = self.chan(on).channel.queue_purge(queue)
        self.record("Queue.PurgeOk", reply.method.message_count)

    def op_queue_delete(self, on, queue, if_unused=False, if_empty=False):
        reply = self.chan(on).channel.queue_delete(queue, if_unused, if_empty)
        self.record("Queue.DeleteOk", reply.method.message_count)

    # -- operations: basic class ---------------------------------------------------

    def op_basic_publish(self, on, exchange, routing_key, body="", properties=None, mandatory=False):
        ch = self.chan(on)
        props = pika.BasicProperties(**properties) if properties else None
        ch.channel.basic_publish(exchange, routing_key, body.encode() if isinstance(body, str) else body, props,
                                 mandatory)
        self.sync(ch)
        self.observations.extend(ch.returns)
        ch.returns.clear()

    def op_publish_confirmed(self, on, exchange, routing_key, body="", properties=None):
        """basic.publish on a channel in confirm mode: records Basic.Ack or Basic.Nack."""
        props = pika.BasicProperties(**properties) if properties else None
        try:
            self.chan(on).channel.basic_publish(exchange, routing_key, body.encode(), props)
            self.record("Basic.Ack")
        except pika.exceptions.NackError:
            self.record("Basic.Nack")

    def op_wait_count(self, on, queue, count):
        """Poll (passive declares) until `queue` has `count` ready messages or
        WAIT_SECONDS pass; records the last count seen (for TTLs)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            seen = self.chan(on).channel.queue_declare(queue, passive=True).method.message_count
            if seen == count or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.record("count", seen)

    def op_basic_get(self, on, queue, auto_ack=False):
        method, properties, body = self.chan(on).channel.basic_get(queue, auto_ack)
        if method is None:
            self.record("Basic.GetEmpty")
        else:
            self.record("Basic.GetOk", method.delivery_tag, method.redelivered, method.exchange, method.routing_key,
                        method.message_count, _body(body), _props(properties, self.delivery_count))

    def op_drain(self, on, queue, limit=50):
        """basic.get (auto-ack) until Basic.GetEmpty; records each reply."""
        for _ in range(limit):
            method, properties, body = self.chan(on).channel.basic_get(queue, True)
            if method is None:
                self.record("Basic.GetEmpty")
                return
            self.record("Basic.GetOk", method.redelivered, method.exchange, method.routing_key,
                        method.message_count, _body(body), _props(properties, self.delivery_count))
        raise AssertionError("queue %s did not drain in %d gets" % (queue, limit))

    def op_basic_consume(self, on, queue, consumer_tag, auto_ack=False, exclusive=False, arguments=None):
        ch = self.chan(on)
        tag = ch.channel.basic_consume(queue, ch.on_message, auto_ack, exclusive, consumer_tag, arguments)
        self.record("Basic.ConsumeOk", tag)

    def op_basic_cancel(self, on, consumer_tag):
        ch = self.chan(on)
        ch.channel.basic_cancel(consumer_tag)
        self.record("Basic.CancelOk", consumer_tag)

    def op_deliveries(self, on, count):
        """Wait for exactly `count` more deliveries and record them."""
        ch = self.chan(on)
        deadline = time.monotonic() + WAIT_SECONDS
        while len(ch.deliveries) < count and time.monotonic() < deadline:
            ch.channel.connection.process_data_events(time_limit=0.02)
        taken, ch.deliveries[:] = ch.deliveries[:count], ch.deliveries[count:]
        self.observations.extend(taken)
        if len(taken) < count:
            self.record("timeout waiting for deliveries", count, len(taken))

    def op_cancels(self, on, count):
        """Wait for `count` consumer cancellations sent by the broker."""
        ch = self.chan(on)
        deadline = time.monotonic() + WAIT_SECONDS
        while len(ch.cancels) < count and time.monotonic() < deadline:
            ch.channel.connection.process_data_events(time_limit=0.02)
        taken, ch.cancels[:] = ch.cancels[:count], ch.cancels[count:]
        self.observations.extend(taken)
        if len(taken) < count:
            self.record("timeout waiting for cancels", count, len(taken))

    def op_basic_ack(self, on, delivery_tag, multiple=False):
        ch = self.chan(on)
        ch.channel.basic_ack(delivery_tag, multiple)
        self.sync(ch)

    def op_basic_nack(self, on, delivery_tag, multiple=False, requeue=True):
        ch = self.chan(on)
        ch.channel.basic_nack(delivery_tag, multiple, requeue)
        self.sync(ch)

    def op_basic_reject(self, on, delivery_tag, requeue=True):
        ch = self.chan(on)
        ch.channel.basic_reject(delivery_tag, requeue)
        self.sync(ch)

    def op_basic_qos(self, on, prefetch_size=0, prefetch_count=0, global_qos=False):
        self.chan(on).channel.basic_qos(prefetch_size, prefetch_count, global_qos)
        self.record("Basic.QosOk")

    def op_basic_recover(self, on, requeue=True):
        self.chan(on).channel.basic_recover(requeue)
        self.record("Basic.RecoverOk")

    # -- operations: tx, confirm, channel -----------------------------------------

    def op_tx_select(self, on):
        self.chan(on).channel.tx_select()
        self.record("Tx.SelectOk")

    def op_tx_commit(self, on):
        self.chan(on).channel.tx_commit()
        self.record("Tx.CommitOk")

    def op_tx_rollback(self, on):
        self.chan(on).channel.tx_rollback()
        self.record("Tx.RollbackOk")

    def op_confirm_select(self, on):
        self.chan(on).channel.confirm_delivery()
        self.record("Confirm.SelectOk")

    def op_connection_close(self, on):
        """Close the connection `on` names (e.g. "1"); the next operation on
        one of its channels opens a new one."""
        conn = self.connections.pop(on.split(".")[0], None)
        if conn is not None and conn.is_open:
            conn.close()
        self.record("Connection.CloseOk")

    def op_channel_open(self, on):
        """A fresh channel (closing the current one), e.g. to reset its state."""
        old = self.channels.pop(on, None)
        if old is not None and old.channel.is_open:
            old.channel.close()
        self.chan(on)
        self.record("Channel.OpenOk")


def run_scenario(url: str, scenario: list, delivery_count: bool = False) -> list:
    return ScenarioRun(url, delivery_count).run(scenario)


# -- raw sockets, for connection-level replies --------------------------------


class RawClient(amqp_raw.RawClient):
    """amqp_raw's client against either broker, made to observe rather than
    assert: the handshake goes as far as the broker lets it, and the end of
    the socket is an observation."""

    def __init__(self, host: str, port: int) -> None:
        # Nagle stays on: RabbitMQ answers some back-to-back frames differently
        # when they arrive in one read (two Basic.Consume with the same tag:
        # Connection.Close without the first Consume-Ok), and the scenarios
        # here were recorded with separate writes arriving separately.
        super().__init__(port, host, timeout=WAIT_SECONDS, nodelay=False)

    def _read_or_eof(self):
        """(channel, frame object) or None when the peer closed the socket."""
        try:
            return self.read_frame(heartbeats=True)
        except amqp_raw.Closed:
            return None

    def handshake(self, username="guest", password="guest", vhost="/", mechanism="PLAIN",
                  capabilities=None) -> list:
        """Run the handshake as far as the broker lets it; returns what it observed
        after Connection.Start (Tune and OpenOk are recorded by name only)."""
        if capabilities is None:
            capabilities = {"authentication_failure_close": True}
        self.handshake_start()
        self.login(username, password, mechanism, capabilities)
        got = self._read_or_eof()
        if got is None or not isinstance(got[1], commands.Connection.Tune):
            return self.observe_close(got)
        self.tune = got[1]
        self.send_frame(commands.Connection.TuneOk(channel_max=self.tune.channel_max, frame_max=self.tune.frame_max,
                                                   heartbeat=0))
        self.send_frame(commands.Connection.Open(virtual_host=vhost))
        got = self._read_or_eof()
        if got is None or not isinstance(got[1], commands.Connection.OpenOk):
            return self.observe_close(got)
        return ["Connection.OpenOk"]

    def observe_close(self, got="read") -> list:
        """Read until Connection.Close (answered with Close-Ok) or EOF; returns
        the observation: every method frame seen, and "socket closed" if the
        broker closed the socket without a Connection.Close."""
        observed = []
        if got == "read":
            got = self._read_or_eof()
        while got is not None:
            channel, value = got
            if isinstance(value, commands.Connection.Close):
                observed.append(("Connection.Close", channel, value.reply_code, value.reply_text, value.class_id,
                                 value.method_id))
                # Both brokers then close the socket, but not always at once
                # (RabbitMQ waits up to 3 s after some frame errors): not compared.
                self.send_frame(commands.Connection.CloseOk())
                return observed
            if isinstance(value, commands.Channel.Close):
                observed.append(("Channel.Close", channel, value.reply_code, value.reply_text, value.class_id,
                                 value.method_id))
                self.send_frame(commands.Channel.CloseOk(), channel)
            elif not isinstance(value, pheartbeat.Heartbeat):
                observed.append((type(value).__name__, channel))
            got = self._read_or_eof()
        observed.append("socket closed")
        return observed
