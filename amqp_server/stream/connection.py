"""One stream-protocol client connection: the handshake, then the commands
onto the vhost's stream queues (PROTOCOL.adoc; RabbitMQ 3.13's behaviour
and response codes).

Theory of operation
- States: PEER (peer properties, SASL), TUNING (our Tune sent after a
  successful authentication, the client's awaited), OPENING (Open awaited),
  OPEN, CLOSED. Until Open succeeds, frames are limited to INITIAL_FRAME_MAX
  bytes (RabbitMQ's initial_frame_max); then to the negotiated frame_max.
- A frame that does not parse, a command unknown or out of place, or an
  oversized frame: the connection is closed with a Close carrying the
  protocol's code (unknown frame, frame too large), as RabbitMQ does (before
  Open succeeded, the socket is closed without one, as RabbitMQ does); a
  request the connection can answer (a missing stream, a refused
  permission) gets its response code and the connection stays.
- The commands live by subject: `handshake`, `publishing`, `consuming`,
  `streams` (stream and super stream commands); each handler takes the
  connection, the frame's version and its fields.
- Subscriptions (`subscription.Subscription`) read the log themselves; the
  queue wakes them (`StreamQueue.watchers`) after each durable batch and
  tells them when the stream is deleted (MetadataUpdate, then they are
  gone).
- Heartbeats: sent every negotiated interval; a connection that sent
  nothing for two intervals is closed.
- Errors of the vhost layer (vhosts.errors.AMQPError) map to response codes
  by their AMQP reply code (`streams.CODES`).
"""
from __future__ import annotations

import contextlib
import logging
import time

from amqp_server.stream import codes, consuming, frames, handshake, publishing, streams
from amqp_server.stream.frames import Fields, FrameReader, FrameTooLarge, Malformed
from amqp_server.shared.client import CLOSED, INPUT_BUDGET, ClientConnection
from amqp_server.stream.handshake import OPEN, OPENING, PEER, TUNING
from amqp_server.stream.publishing import Publisher
from amqp_server.stream.subscription import Subscription
from vhosts.access import Access
from vhosts.errors import AMQPError

log = logging.getLogger("hutch.stream")

INITIAL_FRAME_MAX = 8192


# The commands of an open connection; each handler takes (connection, version, fields).
COMMANDS = {
    codes.DECLARE_PUBLISHER: publishing.declare_publisher,
    codes.PUBLISH: publishing.publish,
    codes.QUERY_PUBLISHER_SEQUENCE: publishing.query_publisher_sequence,
    codes.DELETE_PUBLISHER: publishing.delete_publisher,
    codes.SUBSCRIBE: consuming.subscribe,
    codes.CREDIT: consuming.credit,
    codes.STORE_OFFSET: consuming.store_offset,
    codes.QUERY_OFFSET: consuming.query_offset,
    codes.UNSUBSCRIBE: consuming.unsubscribe,
    codes.CREATE_STREAM: streams.create,
    codes.DELETE_STREAM: streams.delete,
    codes.METADATA: streams.metadata,
    codes.ROUTE: streams.route,
    codes.PARTITIONS: streams.partitions,
    codes.CONSUMER_UPDATE | codes.RESPONSE: consuming.consumer_update_answer,
    codes.EXCHANGE_COMMAND_VERSIONS: streams.exchange_command_versions,
    codes.STREAM_STATS: streams.stream_stats,
    codes.CREATE_SUPER_STREAM: streams.create_super_stream,
    codes.DELETE_SUPER_STREAM: streams.delete_super_stream,
    codes.RESOLVE_OFFSET_SPEC: consuming.resolve_offset_spec,
}
# The handshake's, by state
HANDSHAKE = {
    PEER: {codes.PEER_PROPERTIES: handshake.peer_properties, codes.SASL_HANDSHAKE: handshake.sasl_handshake,
           codes.SASL_AUTHENTICATE: handshake.sasl_authenticate},
    TUNING: {codes.TUNE: handshake.tune},
    OPENING: {codes.OPEN: handshake.open_vhost},
}


class StreamConnection(ClientConnection):
    # What the management API reads of every connection (shapes.connection).
    channel_max = 0
    protocol = "stream"

    def __init__(self, node, io, peer) -> None:
        self.node = node
        self.broker = node.broker
        self.settings = node.config.stream
        self.io = io
        self.peer = peer
        self.state = PEER
        self.reader = FrameReader(INITIAL_FRAME_MAX)
        self.connected_at = time.time()
        self.user = None
        self.vhost = None
        self.access: Access | None = None
        self.auth_mechanism = ""
        self.client_properties: dict = {}
        self.channels: dict = {}  # the stream protocol has none (limits and the API count them)
        self.frame_max = self.settings.frame_max
        self.heartbeat = self.settings.heartbeat
        self.deliver_version = 1
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.blocked_by: set = set()
        self.alarms = node.alarms
        self.socket_paused = False
        self.acks_handled = False  # the stream protocol has no acks to hold output for
        self.output: list[bytes] = []
        self.confirming: set[Publisher] = set()
        self._correlation = 0
        self.updates: dict[int, Subscription] = {}  # consumer updates awaiting the client's answer
        self._heard = True
        self._missed = 0  # heartbeat intervals in a row with nothing from the client
        self._ended = False
        self.timer = io.call_later(10.0, self._handshake_timeout)

    # -- IO --------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.state is CLOSED:
            return
        self.output.append(data)
        self.io.wake()

    def take_output(self) -> list[bytes]:
        out, self.output = self.output, []
        if out:
            self.send_oct += sum(map(len, out))
            self.send_cnt += 1
        return out

    def output_blocked(self) -> bool:
        return self.socket_paused or self.state is CLOSED

    def output_resumed(self) -> None:
        for subscription in list(self.subscriptions.values()):
            subscription.pump()

    def chunk_bytes(self) -> int:
        """The most message bytes one Deliver frame may carry."""
        return (self.frame_max or 1 << 30) - 128

    def unacked_deliveries(self):
        return iter(())

    # -- input -------------------------------------------------------------------

    def parse(self) -> None:
        """Handle the frames received whole, up to INPUT_BUDGET bytes per loop
        turn (then the rest waits a turn, so one client cannot starve the
        others), and none while a publish is held back (`blocked_by`)."""
        budget = INPUT_BUDGET
        try:
            with contextlib.closing(self.reader.frames()) as received:
                for key, version, payload in received:
                    if self.state is CLOSED:
                        return
                    self._handle(key, version, Fields(payload))
                    budget -= len(payload) + 8
                    if (self.blocked_by or budget <= 0) and self.state is not CLOSED:
                        self.io.pause_reading()
                        if not self.blocked_by:
                            self.io.call_soon(self._continue)
                        return
        except FrameTooLarge as exc:
            self.close(codes.FRAME_TOO_LARGE, str(exc))
        except Malformed as exc:
            self.close(codes.UNKNOWN_FRAME, "malformed frame: %s" % exc)
        except Exception:
            log.exception("internal error on stream connection from %s", self.peer)
            self.close(codes.INTERNAL_ERROR, "internal error")

    def _handle(self, key: int, version: int, f: Fields) -> None:
        if key == codes.HEARTBEAT:
            return
        if key == codes.CLOSE:
            correlation = f.u32()
            self.send(frames.response(codes.CLOSE, correlation, codes.OK))
            self.io.close()
            self.lost()
            return
        if key == codes.CLOSE | codes.RESPONSE:
            self.io.close()
            self.lost()
            return
        table = HANDSHAKE.get(self.state, COMMANDS)
        handler = table.get(key)
        if handler is None:
            raise Malformed("command %#06x (version %d) is unknown or not expected now" % (key, version))
        handler(self, version, f)

    # -- handshake -------------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.state in (PEER, TUNING, OPENING):
            log.info("closing stream connection from %s: handshake timeout", self.peer)
            self.io.close()
            self.lost()

    def beat(self) -> None:
        if self.state is CLOSED:
            return
        if not self._heard:
            self._missed += 1
            if self._missed >= 2:
                log.info("closing stream connection from %s: missed heartbeats", self.peer)
                self.io.close()
                self.lost()
                return
        else:
            self._missed = 0
        self._heard = False
        self.send(frames.frame(codes.HEARTBEAT, 1))
        self.timer = self.io.call_later(self.heartbeat, self.beat)

    # -- closing -----------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        """Close with `code` (a protocol error, the broker stopping, an
        administrator): a Close request, then the socket; before Open
        succeeded only the socket, as RabbitMQ does."""
        if self.state is CLOSED:
            return
        log.info("closing stream connection from %s: %s", self.peer, reason)
        if self.state is OPEN:
            self._correlation += 1
            self.output.append(frames.frame(codes.CLOSE, 1, frames.u32(self._correlation), frames.u16(code),
                                            frames.string(reason)))
            self.io.wake()
        self.io.close()
        self.lost()

    def close_with(self, error: AMQPError) -> None:
        self.close(codes.OK if error.reply_code == 320 else codes.INTERNAL_ERROR, error.reply_text)

    def force_close(self, reason: str) -> None:
        self.close(codes.OK, reason)

    def lost(self) -> None:
        """The socket is gone (or going): release everything, once."""
        if self._ended:
            return
        self._ended = True
        self.state = CLOSED
        self.timer.cancel()
        for subscription in list(self.subscriptions.values()):
            self.drop_subscription(subscription)
        for publisher in list(self.publishers.values()):
            publisher.queue.watchers.discard(publisher)
        self.publishers.clear()
        self.node.connections.discard(self)
        if self.vhost is not None:
            self.broker.connection_closed(self)
            self.vhost = None

    # -- alarms (vhosts' publisher port: throttled_by and unblocked are ClientConnection's) --

    def alarm_blocked(self, alarms) -> None:
        """A memory or disk alarm: reading stops after this publish (the
        stream protocol has no blocked notification)."""
        self.blocked_by.add(alarms)

    def alarm_cleared(self, alarms) -> None:
        self.unblocked(alarms)

    # -- helpers -------------------------------------------------------------------

    def stream(self, name: str):
        """The stream queue `name` in this vhost, or None."""
        queue = self.vhost.queues.get(name)
        return queue if queue is not None and getattr(queue, "kind", None) == "stream" else None

    def check(self, kind: str, name: str, permission: str) -> int:
        """OK, or ACCESS_REFUSED."""
        try:
            self.access.check(kind, name, permission)
        except AMQPError:
            return codes.ACCESS_REFUSED
        return codes.OK

    def respond(self, key: int, correlation: int, code: int, *fields: bytes) -> None:
        self.send(frames.response(key, correlation, code, *fields))

    # -- subscriptions -------------------------------------------------------------------

    def consumer_update(self, subscription: Subscription, active: bool) -> None:
        """Tell a single-active-consumer member whether it is active; an
        active one starts where the client's answer says."""
        self._correlation += 1
        if active:
            self.updates[self._correlation] = subscription
        self.send(frames.frame(codes.CONSUMER_UPDATE, 1, frames.u32(self._correlation),
                               frames.u8(subscription.id), frames.u8(1 if active else 0)))

    def drop_subscription(self, subscription: Subscription) -> None:
        subscription.closed = True
        self.subscriptions.pop(subscription.id, None)
        subscription.queue.watchers.discard(subscription)
        if subscription.group is not None:
            self.node.groups.leave(subscription.group, subscription)

    def stream_gone(self, name: str) -> None:
        """The stream was deleted: its publishers and subscriptions on this
        connection go, and the client is told once (MetadataUpdate)."""
        for subscription in [s for s in self.subscriptions.values() if s.queue.name == name]:
            self.drop_subscription(subscription)
        for publisher_id in [i for i, p in self.publishers.items() if p.queue.name == name]:
            del self.publishers[publisher_id]
        self.send(frames.frame(codes.METADATA_UPDATE, 1, frames.u16(codes.METADATA_STREAM_NOT_AVAILABLE),
                               frames.string(name)))
