"""One MQTT client connection: CONNECT, publish and subscribe onto a vhost's
topic exchange, as RabbitMQ's MQTT plugin does it (docs/mqtt.md).

Theory of operation:
- States: CONNECTING until a CONNECT is accepted, then CONNECTED, CLOSED once
  the socket is gone; REFUSING while a refused login waits out its delay
  (amqp_server.shared.login_throttle, shared with AMQP and HTTP) before its
  CONNACK. Any packet but CONNECT first, a second CONNECT or a malformed
  packet closes the network connection (MQTT 3.1.1 4.8).
- A subscription at QoS N is a binding of `amq.topic` (`mqtt.exchange`) to
  the queue `mqtt-subscription-<client id>qos<N>` with the filter mapped to
  a routing key; this connection consumes from each such queue (the QoS 0
  queue without acks, the QoS 1 queue acked by PUBACK). A clean session's
  queues are auto-delete and go when it does; a persistent session's are
  durable and keep QoS 1 messages until the client comes back. Nothing else
  is kept: a session's subscriptions are its queues' bindings.
- Publishing: a PUBLISH goes to the exchange with the topic mapped to a
  routing key; QoS 1 publishes are persistent and PUBACKed once every queue
  that took them has them durably, in the order they arrived (`_pubacks`).
- Outgoing QoS 1: `unacked` maps packet id -> (queue, entry, consumer); a
  PUBACK acks the entry; the connection going away requeues the rest.
- QoS 2 (beyond RabbitMQ) both ways: subscriptions at QoS 2 have a qos2
  queue; the packet-id state is `exactly_once.ExactlyOnce`, kept by
  `Sessions` for persistent sessions (and on disk, each outbound PUBLISH
  held in `_held` until its packet id is there).
- One client id per vhost: a second CONNECT with it closes the first
  (`sessions.Sessions`). The will is published when the connection ends
  without a DISCONNECT (socket loss, keepalive expiry, protocol error,
  takeover).
- Keepalive: one timer per connection fires every 1.5 x keepalive and closes
  the connection when nothing arrived since it last fired.
"""
from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections import deque

from pamqp import encode

from amqp_server.shared.client import CLOSED, INPUT_BUDGET, ClientConnection
from amqp_server.mqtt import packets, topics
from amqp_server.mqtt.exactly_once import ExactlyOnce
from amqp_server.mqtt.packets import MalformedPacket, RefusedConnect
from amqp_server.mqtt.sessions import Sessions, queue_name
from storage import Message
from vhosts import Consumer
from vhosts.access import Access
from vhosts.errors import AMQPError

log = logging.getLogger("hutch.mqtt")

CONNECTING, REFUSING, CONNECTED = "connecting", "refusing", "connected"
MAX_PACKET = 268435455
# Before CONNECT is accepted a packet may not exceed this (RabbitMQ 3.12's
# mqtt.max_packet_size_unauthenticated; 3.10 has no such limit): a client
# that has not logged in cannot make the broker buffer a large packet.
MAX_UNAUTHENTICATED_PACKET = 65536
_HEADER_START = struct.Struct(">HHQ")


def _properties(qos: int) -> bytes:
    """Property flags and list of a message published with `qos`: headers
    (x-mqtt-publish-qos, x-mqtt-dup as RabbitMQ adds them) and delivery_mode."""
    table = encode.field_table({"x-mqtt-publish-qos": qos, "x-mqtt-dup": False})
    return struct.pack(">H", 0x2000 | 0x1000) + table + bytes((2 if qos else 1,))


_PROPERTIES = [_properties(qos) for qos in (0, 1, 2)]


def content_header(qos: int, size: int) -> bytes:
    return _HEADER_START.pack(60, 0, size) + _PROPERTIES[qos]


class MQTTConnection(ClientConnection):
    deaf = REFUSING  # a refused login waits out its delay reading nothing
    # What the management API reads of every connection (shapes.connection).
    auth_mechanism = "none"
    channel_max = 0
    frame_max = 0

    def __init__(self, broker, config, io, peer, sessions: Sessions, listed: set) -> None:
        self.broker = broker
        self.listed = listed
        self.config = config
        self.settings = config.mqtt
        self.io = io
        self.peer = peer
        self.sessions = sessions
        self.state = CONNECTING
        self.reader = packets.PacketReader(MAX_UNAUTHENTICATED_PACKET)
        self.connected_at = time.time()
        self.vhost = None
        self.user = None
        self.access: Access | None = None
        self.client_id = ""
        self.clean = True
        self.level = 4
        self.keepalive = 0
        self.will: tuple | None = None
        self.channels: dict = {}  # MQTT has none (the API and the channel limits count them)
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        # PUBACK/PUBREC acked a delivery since the last write: as over AMQP,
        # the next write waits for the ack's record (amqp_server.shared.client).
        self.acks_handled = False
        self.consumers: dict[int, Consumer] = {}
        self.unacked: dict[int, tuple] = {}
        self._next_pid = 1
        # [packet id, durable confirmations awaited, PUBACK or PUBREC], in arrival order
        self._pubacks: deque = deque()
        self.qos2: ExactlyOnce | None = None
        # QoS 2 PUBLISHes in delivery order, [ready, packet]: each waits for
        # its packet id to reach the disk (persistent sessions), in order.
        self._held: deque = deque()
        self._output: list[bytes] = []
        self.socket_paused = False  # set by the protocol (pause_writing)
        self.blocked_by: set = set()
        self.alarms = io.alarms
        self._heard = False
        self._timer = io.call_later(10.0, self._connect_timeout)
        self.exchange = self.settings.exchange
        self.handlers = {
            packets.PUBLISH: self._publish,
            packets.PUBACK: self._puback,
            packets.PUBREC: self._pubrec,
            packets.PUBREL: self._pubrel,
            packets.PUBCOMP: lambda flags, body: self.qos2.complete(packets.packet_id(body)),
            packets.SUBSCRIBE: self._subscribe,
            packets.UNSUBSCRIBE: self._unsubscribe,
            packets.PINGREQ: lambda flags, body: self.send(packets.PINGRESP_PACKET),
            packets.DISCONNECT: self._disconnect,
        }

    # -- IO ------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._output.append(data)
        self.io.wake()

    def take_output(self) -> list[bytes]:
        out, self._output = self._output, []
        self.send_oct += sum(map(len, out))
        self.send_cnt += 1
        return out

    # -- what the management API shows ---------------------------------------

    @property
    def protocol(self) -> str:
        return "MQTT 3.1.1" if self.level == 4 else "MQTT 3.1"

    @property
    def heartbeat(self) -> int:
        return self.keepalive

    @property
    def client_properties(self) -> dict:
        return {"client_id": self.client_id}

    def unacked_deliveries(self):
        """(queue, entry) of every delivery not acked yet (MQTT has no
        channels; a retained message, from no queue, is not one)."""
        for delivery in list(self.unacked.values()):
            if delivery is not None:
                yield delivery[0], delivery[1]

    def close_with(self, error: AMQPError) -> None:
        """Closed over the management API (MQTT has no reason to send)."""
        self.force_close(error.reply_text)

    # -- input -------------------------------------------------------------------

    def parse(self) -> None:
        """Handle what arrived, up to INPUT_BUDGET bytes per loop turn (then
        the rest waits for the next turn, so one client cannot starve others)."""
        try:
            with contextlib.closing(self.reader.packets()) as stream:
                self._handle(stream, INPUT_BUDGET)
        except MalformedPacket as exc:
            log.info("closing MQTT connection from %s: %s", self.peer, exc)
            self.close()
        except RefusedConnect as exc:
            log.info("MQTT connection from %s refused (%d): %s", self.peer, exc.code, exc)
            self.send(packets.connack(False, exc.code))
            self.close()
        except Exception:
            log.exception("internal error on MQTT connection from %s", self.peer)
            self.close()

    def _handle(self, stream, budget: int) -> None:
        for kind, flags, body in stream:
            if self.state is CLOSED or self.state is REFUSING:
                return
            if self.state is CONNECTING:
                if kind != packets.CONNECT:
                    raise MalformedPacket("packet type %d before CONNECT" % kind)
                self._connect(body)  # may hold reading (a resumed session catching up)
            else:
                handler = self.handlers.get(kind)
                if handler is None:
                    raise MalformedPacket("unexpected packet type %d" % kind)
                handler(flags, body)
            if self.blocked_by:
                self.io.pause_reading()
                return
            budget -= len(body) + 2
            if budget <= 0 and self.state is not CLOSED:
                self.io.pause_reading()
                self.io.call_soon(self._continue)
                return

    def close(self) -> None:
        """Close the network connection (the will goes out, see `lost`)."""
        if self.state is not CLOSED:
            self.io.close()

    def lost(self) -> None:
        if self.state is CLOSED:
            return
        was_connected = self.state is CONNECTED
        self.state = CLOSED
        self._timer.cancel()
        if not was_connected:
            return
        self.listed.discard(self)
        if self.sessions.clients.get((self.vhost.name, self.client_id)) is self:
            del self.sessions.clients[(self.vhost.name, self.client_id)]
        if self.will is not None:
            self._publish_will()
        self._release()
        self.broker.connection_closed(self)

    def end_now(self) -> None:
        """Another connection CONNECTed with our client id, or an
        administrator ended the session: we are done now (before anyone
        looks at the session's queues), the socket closes after."""
        self.lost()
        self.io.close()

    def force_close(self, reason: str) -> None:
        """An administrator closed us (vhost or user deleted)."""
        log.info("closing MQTT connection from %s: %s", self.peer, reason)
        self.close()

    # -- flow control (the publisher port of vhosts), as for AMQP publishers ----

    def alarm_blocked(self, alarms) -> None:
        """A memory or disk alarm: stop reading (MQTT has no notification)."""
        self.blocked_by.add(alarms)

    def alarm_cleared(self, alarms) -> None:
        self.unblocked(alarms)

    def output_resumed(self) -> None:
        for consumer in list(self.consumers.values()):
            consumer.queue.dispatch()

    # -- keepalive ---------------------------------------------------------------

    def _connect_timeout(self) -> None:
        if self.state is CONNECTING:
            log.info("closing MQTT connection from %s: no CONNECT", self.peer)
            self.close()

    def _keepalive_check(self) -> None:
        if self.state is CLOSED:
            return
        if not self._heard:
            log.info("closing MQTT connection from %s (client id %s): keepalive timeout", self.peer, self.client_id)
            self.close()
            return
        self._heard = False
        self._timer = self.io.call_later(self.keepalive * 1.5, self._keepalive_check)

    # -- CONNECT -------------------------------------------------------------------

    def _connect(self, body: bytes) -> None:
        c = packets.decode_connect(body)
        self.level = c.level
        username, password = c.username, c.password
        if username is None:
            if not self.settings.allow_anonymous:
                raise RefusedConnect(packets.NOT_AUTHORIZED, "anonymous login refused")
            username, password = self.settings.default_user, self.settings.default_pass
        vhost_name = self.settings.vhost
        if ":" in username:
            vhost_name, username = username.split(":", 1)
        host = self.peer[0] if self.peer else ""
        user = self.broker.authenticate(username, password or "", host in ("127.0.0.1", "::1"))
        if user is None:
            # Answered after a delay (amqp_server.shared.login_throttle), shared with
            # AMQP and HTTP logins; meanwhile nothing more is read.
            log.warning("MQTT login refused for user '%s' from %s", username, self.peer)
            self.io.pause_reading()
            self._timer.cancel()
            self._timer = self.io.call_later(self.io.logins.failed(host, username), self._refuse_login)
            self.state = REFUSING
            return
        self.io.logins.succeeded(host, username)
        try:
            self.vhost = self.broker.open_vhost(user, vhost_name, self)
        except AMQPError as exc:
            raise RefusedConnect(packets.NOT_AUTHORIZED, exc.reply_text) from None
        self.user = user
        self.reader.max_size = min(self.config.max_message_size + 65536, MAX_PACKET)
        self.client_id = c.client_id or "mqtt-" + hex(id(self))[2:]
        self.access = Access(user, vhost_name, self.client_id)
        self.clean = c.clean
        self.keepalive = c.keepalive
        if c.will_topic is not None:
            self.will = (c.will_topic, c.will_payload, c.will_qos, c.will_retain)
        key = (vhost_name, self.client_id)
        previous = self.sessions.clients.get(key)
        if previous is not None:
            log.info("MQTT client id %s taken over by a new connection from %s", self.client_id, self.peer)
            previous.end_now()
        self.sessions.clients[key] = self
        self.listed.add(self)
        self.state = CONNECTED
        self._timer.cancel()
        if self.keepalive:
            self._heard = False
            self._timer = self.io.call_later(self.keepalive * 1.5, self._keepalive_check)
        self.qos2, present = self.sessions.exactly_once(vhost_name, self.client_id, self.clean)
        kept = [(qos, self.vhost.queues.get(queue_name(self.client_id, qos))) for qos in (0, 1, 2)]
        kept = [(qos, q) for qos, q in kept if q is not None]
        if self.clean:
            for _qos, q in kept:
                self.vhost.remove_queue(q)
            kept = []
        # CONNACK first: consuming delivers what the session kept at once.
        # A persistent session is there when its queues are (RabbitMQ) or
        # this node saw it before (a session without subscriptions, as Mosquitto).
        self.send(packets.connack((present or bool(kept)) and c.level == 4, packets.ACCEPTED))
        for pid in sorted(self.qos2.released):
            self.send(packets.acknowledgement(packets.PUBREL, pid))
        for qos, q in kept:
            self._consume(qos, q)
        self._catch_up([q for _qos, q in kept if getattr(q, "remote", False)])
        log.info("MQTT connection from %s accepted: client id %s, user '%s', vhost '%s'",
                 self.peer, self.client_id, username, vhost_name)

    def _catch_up(self, remote: list) -> None:
        """A resumed session's queues on other shards send what they kept
        after the CONNACK, as a local queue sends it at once: nothing more
        is read until each owner answered a request sent behind the consume
        (on the same link, so its first deliveries come before the answer).
        The client sees what its session kept before the answer to anything
        it sends next, as from one process (or RabbitMQ)."""
        for q in remote:
            hold = ("catching up", q.name)
            self.throttled_by(hold)
            self.vhost.shards.counts(q, lambda _error, hold=hold: self.unblocked(hold))

    def _refuse_login(self) -> None:
        if self.state is REFUSING:
            self.send(packets.connack(False, packets.BAD_USERNAME_OR_PASSWORD))
            self.close()

    # -- publish -------------------------------------------------------------------

    def _publish(self, flags: int, body: bytes) -> None:
        topic, qos, pid, retain, _dup, payload = packets.decode_publish(flags, body)
        if self.alarms.raised:
            self.alarms.block(self)  # this publish goes through; reading stops after it
        pending = [pid, 0, packets.PUBREC if qos == 2 else packets.PUBACK] if qos else None
        try:
            waits = 0
            if qos == 2:
                new, stored = self.qos2.receive(pid, lambda: self._durable(pending))
                waits = int(stored)
                if not new:  # a resend of one already routed: PUBREC again, nothing more
                    pending[1] += waits
                    self._pubacks.append(pending)
                    self._flush_pubacks()
                    return
            waits += self.publish_message(topic, payload, qos, retain, pending)
        except AMQPError as exc:
            log.info("closing MQTT connection from %s: %s", self.peer, exc.reply_text)
            self.close()
            return
        if pending is not None:
            pending[1] += waits
            self._pubacks.append(pending)
            if not waits:
                self._flush_pubacks()

    def publish_message(self, topic: str, payload: bytes, qos: int, retain: bool, pending: list | None = None) -> int:
        """Route a message to the exchange (permission checks first); returns
        how many queues will confirm it durable (each decrements `pending[1]`)."""
        access = self.access
        access.publish(self.exchange)
        x = self.vhost.check_publish(self.exchange)
        key = topics.to_amqp(topic)
        access.topic(x, key, "write")
        on_durable = None if pending is None else (lambda: self._durable(pending))
        waits = 0
        if retain and self.sessions.retained.retain(self.vhost.name, topic, payload, qos, on_durable):
            waits = 1
        message = Message(self.exchange, key, content_header(qos, len(payload)), payload)
        _reached, routed_waits, _rejected = self.vhost.publish(message, [key], None, self, on_durable)
        return waits + routed_waits

    def _durable(self, pending: list) -> None:
        pending[1] -= 1
        if self.state is not CLOSED:
            self._flush_pubacks()

    def _flush_pubacks(self) -> None:
        pubacks = self._pubacks
        while pubacks and pubacks[0][1] <= 0:
            pid, _waits, kind = pubacks.popleft()
            self.send(packets.acknowledgement(kind, pid))

    def _publish_will(self) -> None:
        topic, payload, qos, retain = self.will
        self.will = None
        try:
            self.publish_message(topic, payload, qos, retain)
        except AMQPError as exc:
            log.info("will of MQTT client id %s not published: %s", self.client_id, exc.reply_text)

    def _disconnect(self, flags: int, body: bytes) -> None:
        self.will = None
        self.close()

    # -- subscribe -------------------------------------------------------------------

    def _subscribe(self, flags: int, body: bytes) -> None:
        pid, requests = packets.decode_subscribe(flags, body)
        codes = []
        granted_filters = []
        for topic_filter, qos in requests:
            if qos == packets.SUBSCRIBE_FAILURE:
                codes.append(qos)
                continue
            try:
                self._bind(topic_filter, qos)
            except AMQPError as exc:
                log.info("MQTT subscription of client id %s to %s refused: %s",
                         self.client_id, topic_filter, exc.reply_text)
                codes.append(packets.SUBSCRIBE_FAILURE)
                continue
            codes.append(qos)
            granted_filters.append((topic_filter, qos))
        self.send(packets.suback(pid, codes))
        self._send_retained(granted_filters)

    def _bind(self, topic_filter: str, qos: int) -> None:
        vhost = self.vhost
        key = topics.to_amqp(topic_filter)
        name = queue_name(self.client_id, qos)
        q = vhost.declare_queue(name, self, durable=not self.clean, auto_delete=self.clean, access=self.access)
        vhost.bind_queue(name, self.exchange, key, None, self, access=self.access)
        self.access.check("queue", name, "read")
        for other_qos in (0, 1, 2):
            other = vhost.queues.get(queue_name(self.client_id, other_qos))
            if other_qos != qos and other is not None:
                vhost.unbind_queue(other.name, self.exchange, key, None, self)
        if qos not in self.consumers:
            self._consume(qos, q)

    def _consume(self, qos: int, q) -> None:
        consumer = Consumer("mqtt-%s-qos%d" % (self.client_id, qos), q, self, qos == 0, False,
                            self.settings.prefetch if qos else 0, {})
        self.consumers[qos] = consumer
        q.add_consumer(consumer)

    def _unsubscribe(self, flags: int, body: bytes) -> None:
        pid, filters = packets.decode_unsubscribe(flags, body)
        for topic_filter in filters:
            key = topics.to_amqp(topic_filter)
            for qos in (0, 1, 2):
                name = queue_name(self.client_id, qos)
                if name in self.vhost.queues:
                    self.vhost.unbind_queue(name, self.exchange, key, None, self)
        self.send(packets.acknowledgement(packets.UNSUBACK, pid))

    def _send_retained(self, granted: list[tuple[str, int]]) -> None:
        if not granted:
            return
        for topic, payload, qos in self.sessions.retained.matching(self.vhost.name, granted):
            pid = self._new_pid() if qos else 0
            if qos:
                self.unacked[pid] = None
            self._output.extend(packets.publish(topic.encode("utf-8"), payload, qos, pid, True, False))
        self.io.wake()

    # -- deliveries (the ConsumerChannel port of vhosts) -----------------------------

    @property
    def output_blocked(self) -> bool:
        return self.socket_paused

    def can_deliver(self, consumer: Consumer) -> bool:
        if self.socket_paused or self.state is not CONNECTED:
            return False
        return consumer.no_ack or consumer.unacked < consumer.prefetch_count

    def _new_pid(self) -> int:
        pid = self._next_pid
        unacked = self.unacked
        qos2 = self.qos2
        while pid in unacked or qos2.in_use(pid):
            pid = pid % 65535 + 1
        self._next_pid = pid % 65535 + 1
        return pid

    def deliver_fresh(self, consumer: Consumer, queue, message: Message) -> None:
        """A message handed straight to a no-ack subscription (vhosts.Queue's hand-off): `deliver`
        with the entry the backing queue makes already taken, as for any other hand-off."""
        self.deliver(consumer, queue, queue.backing.publish_delivered(message))

    def deliver(self, consumer: Consumer, queue, entry) -> None:
        message = entry.message
        stats = queue.stats
        redelivered = entry.redelivered
        if consumer.no_ack:
            queue.ack((entry,))
            stats.deliver_no_ack += 1
            self.vhost.stats.deliver_no_ack += 1
            qos = pid = 0
        else:
            # The lower of the subscription's QoS and the publisher's (AMQP
            # publishers have none: the subscription's).
            qos = 2 if self.consumers.get(2) is consumer else 1
            headers = message.headers if message.has_headers else None
            published = headers.get("x-mqtt-publish-qos") if headers else None
            if isinstance(published, int) and published < qos:
                qos = published
            if qos == 2 and self.qos2.was_released(message.msg_id):
                queue.ack((entry,))  # the client has it (see exactly_once)
                return
            if qos:
                pid = self.qos2.sent_before(message.msg_id) if qos == 2 else None
                if pid is None:
                    pid = self._new_pid()
                    if qos == 2:
                        held = [False, None]
                        if self.qos2.record_sent(message.msg_id, pid, lambda: self._recorded(held)):
                            self._held.append(held)
                else:
                    redelivered = True
                self.unacked[pid] = (queue, entry, consumer)
                consumer.unacked += 1
                stats.deliver += 1
                self.vhost.stats.deliver += 1
            else:
                pid = 0
                queue.ack((entry,))
                stats.deliver_no_ack += 1
                self.vhost.stats.deliver_no_ack += 1
        publish = packets.publish(
            topics.to_mqtt(message.routing_key).encode("utf-8"), message.body, qos, pid, False,
            redelivered and qos > 0)
        if qos == 2 and self._held:
            if self._held[-1][1] is None:
                self._held[-1][1] = publish
            else:
                self._held.append([True, publish])
            return
        self._output.extend(publish)
        self.io.wake()

    def _recorded(self, held: list) -> None:
        """A QoS 2 packet id is on disk: its PUBLISH, and the QoS 2 ones
        queued behind it, may go."""
        held[0] = True
        if self.state is CLOSED:
            return
        while self._held and self._held[0][0]:
            self._output.extend(self._held.popleft()[1])
        self.io.wake()

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The subscription queue was deleted (by an administrator)."""
        for qos, c in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[qos]

    def _puback(self, flags: int, body: bytes) -> None:
        self._settled(packets.packet_id(body))

    def _pubrec(self, flags: int, body: bytes) -> None:
        """QoS 2, step 2: the client has the message; the queue lets it go and
        the packet id waits for PUBCOMP."""
        pid = packets.packet_id(body)
        delivery = self.unacked.get(pid)
        pubrel = packets.acknowledgement(packets.PUBREL, pid)
        # On disk before PUBREL and before the ack (see exactly_once).
        if delivery is None or not self.qos2.record_pubrec(delivery[1].message.msg_id, pid,
                                                           lambda: self._send_if_open(pubrel)):
            self.send(pubrel)
        self._settled(pid)

    def _send_if_open(self, data: bytes) -> None:
        if self.state is not CLOSED:
            self.send(data)

    def _pubrel(self, flags: int, body: bytes) -> None:
        pid = packets.packet_id(body)
        self.qos2.release(pid)
        self.send(packets.acknowledgement(packets.PUBCOMP, pid))

    def _settled(self, pid: int) -> None:
        """The delivery with packet id `pid` is acknowledged."""
        delivery = self.unacked.pop(pid, None)
        if delivery is None:
            return
        queue, entry, consumer = delivery
        consumer.unacked -= 1
        queue.stats.ack += 1
        self.vhost.stats.ack += 1
        queue.ack((entry,))
        self.acks_handled = True
        queue.dispatch()

    def _release(self) -> None:
        """Connection gone: stop consuming, give back what was not PUBACKed,
        and a clean session's queues go."""
        consumers = list(self.consumers.values())
        self.consumers.clear()
        by_queue: dict = {}
        for delivery in self.unacked.values():
            if delivery is not None:
                by_queue.setdefault(delivery[0], []).append(delivery[1])
        self.unacked.clear()
        self._held.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)
        for queue, entries in by_queue.items():
            queue.requeue(entries)
        if self.clean:
            for consumer in consumers:
                self.vhost.remove_queue(consumer.queue)
