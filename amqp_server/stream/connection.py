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
  protocol's code (unknown frame, frame too large), as RabbitMQ does; a
  request the connection can answer (a missing stream, a refused
  permission) gets its response code and the connection stays.
- Publishing: a publisher (id 0-255) is declared on one stream, with an
  optional reference. Each message (or each message of a sub-entry batch)
  becomes one record; its publishing id is confirmed once its record (the
  batch's last) is durable. With a reference, an id at or below the
  highest one seen for that reference is confirmed without being stored
  (deduplication; `tracking.Tracking` keeps the sequences, from the records
  themselves). Confirms are sent once per loop turn, per publisher.
- Subscriptions (`subscription.Subscription`) read the log themselves; the
  queue wakes them (`StreamQueue.watchers`) after each durable batch and
  tells them when the stream is deleted (MetadataUpdate, then they are
  gone).
- Heartbeats: sent every negotiated interval; a connection that sent
  nothing for two intervals is closed.
- Errors of the vhost layer (vhosts.errors.AMQPError) map to response codes
  by their AMQP reply code (`_CODES`).
"""
from __future__ import annotations

import logging
import time

from pamqp import decode as amqp_decode

from amqp_server.stream import codes, frames, super_streams
from amqp_server.stream.chunks import BadBatch, unpack_batch
from amqp_server.stream.frames import Fields, FrameReader, FrameTooLarge, Malformed
from amqp_server.stream.subscription import Subscription
from vhosts.access import Access
from vhosts.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, AMQPError
from vhosts.stream_records import encode_amqp10

log = logging.getLogger("hutch.stream")

PEER, TUNING, OPENING, OPEN, CLOSED = "peer", "tuning", "opening", "open", "closed"
INITIAL_FRAME_MAX = 8192
MAX_SUB_BATCH = 64 * 1024 * 1024  # RabbitMQ's max uncompressed sub-entry batch size
INPUT_BUDGET = 128 * 1024
_CODES = {ACCESS_REFUSED: codes.ACCESS_REFUSED, NOT_FOUND: codes.STREAM_DOES_NOT_EXIST,
          PRECONDITION_FAILED: codes.PRECONDITION_FAILED}
# create-stream arguments and the queue arguments they become
_ARGUMENTS = {"max-length-bytes": ("x-max-length-bytes", int), "max-age": ("x-max-age", str),
              "stream-max-segment-size-bytes": ("x-stream-max-segment-size-bytes", int),
              "initial-cluster-size": (None, int), "queue-leader-locator": (None, str),
              "stream-filter-size-bytes": (None, int)}
SERVER_PROPERTIES = {"product": "RabbitMQ", "version": "3.13.7", "platform": "hutch (Python)",
                     "copyright": "hutch", "information": "the RabbitMQ stream protocol, served by hutch"}


class Publisher:
    __slots__ = ("id", "queue", "reference", "confirmed", "connection")

    def __init__(self, connection, publisher_id: int, queue, reference: str | None) -> None:
        self.connection = connection
        self.id = publisher_id
        self.queue = queue
        self.reference = reference or None
        self.confirmed: list[int] = []

    def records_available(self) -> None:
        """Publishers read nothing."""

    def stream_deleted(self, queue) -> None:
        self.connection.stream_gone(queue.name)


class _Confirm:
    """The durable callback of a publish: its id is confirmed (and, with a
    reference, becomes the durable sequence)."""

    __slots__ = ("connection", "publisher", "publishing_id", "tracking")

    def __init__(self, connection, publisher: Publisher, publishing_id: int, tracking) -> None:
        self.connection = connection
        self.publisher = publisher
        self.publishing_id = publishing_id
        self.tracking = tracking

    def __call__(self) -> None:
        if self.tracking is not None:
            self.tracking.durable(self.publisher.reference, self.publishing_id)
        self.connection.confirm(self.publisher, self.publishing_id)


class StreamConnection:
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
        self.socket_paused = False
        self._output: list[bytes] = []
        self._confirming: set[Publisher] = set()
        self._correlation = 0
        self._updates: dict[int, Subscription] = {}  # consumer updates awaiting the client's answer
        self._heard = True
        self._missed = 0  # heartbeat intervals in a row with nothing from the client
        self._ended = False
        self._timer = io.call_later(10.0, self._handshake_timeout)
        self.handlers = {
            codes.DECLARE_PUBLISHER: self._declare_publisher,
            codes.PUBLISH: self._publish,
            codes.QUERY_PUBLISHER_SEQUENCE: self._query_publisher_sequence,
            codes.DELETE_PUBLISHER: self._delete_publisher,
            codes.SUBSCRIBE: self._subscribe,
            codes.CREDIT: self._credit,
            codes.STORE_OFFSET: self._store_offset,
            codes.QUERY_OFFSET: self._query_offset,
            codes.UNSUBSCRIBE: self._unsubscribe,
            codes.CREATE_STREAM: self._create,
            codes.DELETE_STREAM: self._delete,
            codes.METADATA: self._metadata,
            codes.ROUTE: self._route,
            codes.PARTITIONS: self._partitions,
            codes.CONSUMER_UPDATE | codes.RESPONSE: self._consumer_update_answer,
            codes.EXCHANGE_COMMAND_VERSIONS: self._exchange_command_versions,
            codes.STREAM_STATS: self._stream_stats,
            codes.CREATE_SUPER_STREAM: self._create_super_stream,
            codes.DELETE_SUPER_STREAM: self._delete_super_stream,
            codes.RESOLVE_OFFSET_SPEC: self._resolve_offset_spec,
        }

    # -- IO --------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.state is CLOSED:
            return
        self._output.append(data)
        self.io.wake()

    def take_output(self) -> list[bytes]:
        out, self._output = self._output, []
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

    @property
    def name(self) -> str:
        host, port = (self.peer or ("", 0))[:2]
        local = self.io.transport.get_extra_info("sockname") if self.io.transport is not None else None
        return "%s:%d -> %s:%d" % (host, port, *(local[:2] if local else ("", 0)))

    def unacked_deliveries(self):
        return iter(())

    # -- input -------------------------------------------------------------------

    def received(self, data) -> None:
        if self.state is CLOSED:
            return
        self._heard = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        self.reader.feed(data)
        self.parse()

    def parse(self) -> None:
        budget = INPUT_BUDGET
        try:
            for key, version, payload in self.reader.frames():
                if self.state is CLOSED:
                    return
                self._handle(key, version, Fields(payload))
                budget -= len(payload) + 8
                if self.blocked_by or (budget <= 0 and self.reader.pending):
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

    def _continue(self) -> None:
        if self.state is CLOSED or self.blocked_by:
            return
        self.io.resume_reading()
        self.parse()

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
        state = self.state
        if state is PEER:
            handler = {codes.PEER_PROPERTIES: self._peer_properties, codes.SASL_HANDSHAKE: self._sasl_handshake,
                       codes.SASL_AUTHENTICATE: self._sasl_authenticate}.get(key)
        elif state is TUNING:
            handler = self._tune if key == codes.TUNE else None
        elif state is OPENING:
            handler = self._open if key == codes.OPEN else None
        else:
            handler = self.handlers.get(key)
        if handler is None:
            raise Malformed("command %#06x (version %d) is unknown or not expected now" % (key, version))
        handler(version, f)

    # -- handshake -------------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.state in (PEER, TUNING, OPENING):
            log.info("closing stream connection from %s: handshake timeout", self.peer)
            self.io.close()
            self.lost()

    def _peer_properties(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        self.client_properties = f.string_map()
        self.send(frames.response(codes.PEER_PROPERTIES, correlation, codes.OK,
                                  frames.string_map({**SERVER_PROPERTIES, "cluster_name": self.node.cluster_name})))

    def _mechanisms(self) -> list[str]:
        mechanisms = ["PLAIN", "AMQPLAIN"]
        if self._certificate_user() is not None:
            mechanisms.append("EXTERNAL")
        return mechanisms

    def _certificate_user(self) -> str | None:
        transport = self.io.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        if ssl_object is None:
            return None
        certificate = ssl_object.getpeercert()
        for rdn in (certificate or {}).get("subject", ()):
            for name, value in rdn:
                if name == "commonName":
                    return value
        return None

    def _sasl_handshake(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        self.send(frames.response(codes.SASL_HANDSHAKE, correlation, codes.OK,
                                  frames.array([frames.string(m) for m in self._mechanisms()])))

    def _sasl_authenticate(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        mechanism = f.text()
        opaque = f.bytes_() or b""
        host = (self.peer or ("",))[0]
        loopback = host in ("127.0.0.1", "::1") or host.startswith("127.")
        if mechanism not in self._mechanisms():
            self.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_MECHANISM_NOT_SUPPORTED))
            return
        if mechanism == "EXTERNAL":
            username, password = self._certificate_user(), None
        elif mechanism == "PLAIN":
            parts = opaque.split(b"\0")
            if len(parts) != 3:
                self.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_ERROR))
                return
            username, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        else:  # AMQPLAIN: an AMQP 0-9-1 field table without its length
            try:
                _, table = amqp_decode.field_table(len(opaque).to_bytes(4, "big") + opaque)
                username, password = str(table["LOGIN"]), str(table["PASSWORD"])
            except Exception:  # pamqp raises various errors on bad tables
                self.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.SASL_ERROR))
                return
        user = self.broker.users.get(username)
        if user is None or (password is not None and not user.authenticate(password)):
            self._refuse(correlation, host, username, codes.AUTHENTICATION_FAILURE)
            return
        if username in self.broker.loopback_users and not loopback:
            self._refuse(correlation, host, username, codes.SASL_AUTHENTICATION_FAILURE_LOOPBACK)
            return
        self.node.logins.succeeded(host, username)
        self.user = user
        self.auth_mechanism = mechanism
        self.send(frames.response(codes.SASL_AUTHENTICATE, correlation, codes.OK))
        self.state = TUNING
        self.send(frames.frame(codes.TUNE, 1, frames.u32(self.settings.frame_max), frames.u32(self.settings.heartbeat)))

    def _refuse(self, correlation: int, host: str, username: str, code: int) -> None:
        """A refused login: answered after the login throttle's delay (shared
        with AMQP, MQTT and HTTP), then the connection is closed."""
        log.info("stream connection from %s: login of user '%s' refused", self.peer, username)
        self.io.pause_reading()
        self.state = CLOSED

        def answer() -> None:
            self._output.append(frames.response(codes.SASL_AUTHENTICATE, correlation, code))
            self.io.wake()
            self.io.close()
        self._timer.cancel()
        self._timer = self.io.call_later(self.node.logins.failed(host, username), answer)

    def _tune(self, version: int, f: Fields) -> None:
        frame_max, heartbeat = f.u32(), f.u32()
        ours = self.settings.frame_max
        self.frame_max = min(frame_max, ours) if frame_max and ours else (frame_max or ours)
        self.heartbeat = min(heartbeat, self.settings.heartbeat) if heartbeat and self.settings.heartbeat else 0
        self.state = OPENING

    def _open(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        name = f.text()
        try:
            self.vhost = self.broker.open_vhost(self.user, name, self)
        except AMQPError as exc:
            log.info("stream connection from %s: %s", self.peer, exc.reply_text)
            self.send(frames.response(codes.OPEN, correlation, codes.VHOST_ACCESS_FAILURE))
            self.io.close()
            self.lost()
            return
        self.access = Access(self.user, name)
        self.state = OPEN
        self.node.connections.add(self)
        self.reader.frame_max = self.frame_max
        host, port = self.node.advertised(self)
        self.send(frames.response(codes.OPEN, correlation, codes.OK,
                                  frames.string_map({"advertised_host": host, "advertised_port": str(port)})))
        self._timer.cancel()
        if self.heartbeat:
            self._timer = self.io.call_later(self.heartbeat, self._heartbeat)

    def _heartbeat(self) -> None:
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
        self._timer = self.io.call_later(self.heartbeat, self._heartbeat)

    # -- closing -----------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        """Close with `code` (a protocol error, the broker stopping, an
        administrator): a Close request, then the socket."""
        if self.state is CLOSED:
            return
        log.info("closing stream connection from %s: %s", self.peer, reason)
        self._correlation += 1
        self._output.append(frames.frame(codes.CLOSE, 1, frames.u32(self._correlation), frames.u16(code),
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
        self._timer.cancel()
        for subscription in list(self.subscriptions.values()):
            self._drop_subscription(subscription)
        for publisher in list(self.publishers.values()):
            publisher.queue.watchers.discard(publisher)
        self.publishers.clear()
        self.node.connections.discard(self)
        if self.vhost is not None:
            self.broker.connection_closed(self)
            self.vhost = None

    # -- flow control (the publisher port of vhosts) ----------------------------------

    def throttled_by(self, source) -> None:
        self.blocked_by.add(source)

    def unblocked(self, source) -> None:
        self.blocked_by.discard(source)
        if not self.blocked_by and self.state is not CLOSED:
            self.io.call_soon(self._continue)

    def alarm_blocked(self, alarms) -> None:
        self.blocked_by.add(alarms)

    @property
    def flow_state(self) -> str:
        """As an AMQP connection's (the management API's `state`)."""
        alarms = self.node.alarms
        if alarms in self.blocked_by:
            return "blocked"
        if alarms.raised:
            return "blocking"
        return "flow" if self.blocked_by else "running"

    def alarm_cleared(self, alarms) -> None:
        self.unblocked(alarms)

    # -- helpers -------------------------------------------------------------------

    def _stream(self, name: str):
        """The stream queue `name` in this vhost, or None."""
        queue = self.vhost.queues.get(name)
        return queue if queue is not None and getattr(queue, "kind", None) == "stream" else None

    def _check(self, kind: str, name: str, permission: str) -> int:
        """OK, or ACCESS_REFUSED."""
        try:
            self.access.check(kind, name, permission)
        except AMQPError:
            return codes.ACCESS_REFUSED
        return codes.OK

    def _respond(self, key: int, correlation: int, code: int, *fields: bytes) -> None:
        self.send(frames.response(key, correlation, code, *fields))

    # -- publishers ------------------------------------------------------------------

    def _declare_publisher(self, version: int, f: Fields) -> None:
        correlation, publisher_id, reference, stream = f.u32(), f.u8(), f.string(), f.text()
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.DECLARE_PUBLISHER, correlation, codes.STREAM_DOES_NOT_EXIST)
        code = self._check("queue", stream, "write")
        if code != codes.OK:
            return self._respond(codes.DECLARE_PUBLISHER, correlation, code)
        if publisher_id in self.publishers or (reference and any(
                p.reference == reference and p.queue is queue for p in self.publishers.values())):
            return self._respond(codes.DECLARE_PUBLISHER, correlation, codes.PRECONDITION_FAILED)
        publisher = self.publishers[publisher_id] = Publisher(self, publisher_id, queue, reference)
        queue.watchers.add(publisher)
        if publisher.reference:
            # Deduplication needs the sequences: answered once they are loaded.
            self.node.tracking(queue).when_loaded(
                lambda: self._respond(codes.DECLARE_PUBLISHER, correlation, codes.OK))
        else:
            self._respond(codes.DECLARE_PUBLISHER, correlation, codes.OK)

    def _delete_publisher(self, version: int, f: Fields) -> None:
        correlation, publisher_id = f.u32(), f.u8()
        publisher = self.publishers.pop(publisher_id, None)
        if publisher is None:
            return self._respond(codes.DELETE_PUBLISHER, correlation, codes.PUBLISHER_DOES_NOT_EXIST)
        publisher.queue.watchers.discard(publisher)
        self._respond(codes.DELETE_PUBLISHER, correlation, codes.OK)

    def _query_publisher_sequence(self, version: int, f: Fields) -> None:
        correlation, reference, stream = f.u32(), f.text(), f.text()
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.QUERY_PUBLISHER_SEQUENCE, correlation, codes.STREAM_DOES_NOT_EXIST,
                                 frames.u64(0))
        tracking = self.node.tracking(queue)
        tracking.when_loaded(lambda: self._respond(codes.QUERY_PUBLISHER_SEQUENCE, correlation, codes.OK,
                                                   frames.u64(tracking.accepted.get(reference, 0))))

    def _publish(self, version: int, f: Fields) -> None:
        publisher_id = f.u8()
        count = f.count(12)
        publisher = self.publishers.get(publisher_id)
        errors: list[tuple[int, int]] = []
        queue = publisher.queue if publisher is not None else None
        tracking = self.node.tracking(queue) if publisher is not None and publisher.reference else None
        if tracking is not None and not tracking.loaded:
            tracking = None  # cannot happen after a declare's answer; no deduplication without it
        reference = publisher.reference.encode("utf-8") if tracking is not None else b""
        for _ in range(count):
            publishing_id = f.u64()
            filter_value = b""
            if version >= 2:
                value = f.string()
                filter_value = value.encode("utf-8") if value else b""
            kind = f.data[f.pos] if f.left else 0
            if kind & 0x80:
                f.u8()
                batch_count, uncompressed, size = f.u16(), f.i32(), f.i32()
                data = f.raw(size)
                if publisher is None:
                    errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
                    continue
                try:
                    messages = unpack_batch((kind >> 4) & 0x7, batch_count, uncompressed, data, MAX_SUB_BATCH,
                                            codes.PRECONDITION_FAILED, codes.PRECONDITION_FAILED)
                except BadBatch as exc:
                    log.info("stream connection from %s: %s", self.peer, exc)
                    errors.append((publishing_id, exc.code))
                    continue
            else:
                body = f.bytes_()
                if publisher is None:
                    errors.append((publishing_id, codes.PUBLISHER_DOES_NOT_EXIST))
                    continue
                messages = [body or b""]
            if queue.deleted:
                errors.append((publishing_id, codes.STREAM_DOES_NOT_EXIST))
                continue
            if tracking is not None:
                if publishing_id <= tracking.accepted.get(publisher.reference, 0):
                    self.confirm(publisher, publishing_id)  # a duplicate: confirmed, not stored
                    continue
                tracking.accepted[publisher.reference] = publishing_id
            confirm = _Confirm(self, publisher, publishing_id, tracking)
            last = len(messages) - 1
            for i, message in enumerate(messages):
                queue.append(encode_amqp10(message, filter_value, reference, publishing_id),
                             confirm if i == last else None)
        f.end()
        if errors:
            self.send(frames.frame(codes.PUBLISH_ERROR, 1, frames.u8(publisher_id), frames.array(
                [frames.u64(pid) + frames.u16(code) for pid, code in errors])))
        if self.node.alarms.raised:
            self.node.alarms.block(self)
        writer = self.node.writer
        if writer.backlogged:
            writer.flow_waiters.add(self)
            self.throttled_by(writer)

    def confirm(self, publisher: Publisher, publishing_id: int) -> None:
        publisher.confirmed.append(publishing_id)
        if not self._confirming:
            self.io.call_soon(self._send_confirms)
        self._confirming.add(publisher)

    def _send_confirms(self) -> None:
        confirming, self._confirming = self._confirming, set()
        for publisher in confirming:
            ids, publisher.confirmed = publisher.confirmed, []
            if self.publishers.get(publisher.id) is not publisher:
                continue
            for start in range(0, len(ids), 8192):
                part = ids[start:start + 8192]
                self.send(frames.frame(codes.PUBLISH_CONFIRM, 1, frames.u8(publisher.id),
                                       frames.array([frames.u64(i) for i in part])))

    # -- subscriptions -------------------------------------------------------------------

    def _offset_spec(self, f: Fields) -> tuple[int, int]:
        kind = f.u16()
        if kind == codes.OFFSET_OFFSET:
            return kind, f.u64()
        if kind == codes.OFFSET_TIMESTAMP:
            return kind, f.i64()
        if kind in (codes.OFFSET_FIRST, codes.OFFSET_LAST, codes.OFFSET_NEXT, codes.OFFSET_NONE):
            return kind, 0
        raise Malformed("offset specification type %d" % kind)

    def resolve(self, queue, spec: tuple[int, int], then) -> None:
        """`then(offset)` with where `spec` starts in `queue`, as RabbitMQ 3.11+:
        an offset below the first kept is the first, one past the end is next."""
        kind, value = spec
        log_ = queue.log
        if kind == codes.OFFSET_FIRST:
            then(log_.first_offset)
        elif kind == codes.OFFSET_LAST:
            then(max(log_.next_offset - 1, log_.first_offset))
        elif kind == codes.OFFSET_OFFSET:
            then(min(max(value, log_.first_offset), log_.next_offset))
        elif kind == codes.OFFSET_TIMESTAMP:
            log_.find_time(value / 1000, lambda found: then(log_.first_offset if isinstance(found, Exception)
                                                            else found))
        else:
            then(log_.next_offset)

    def _subscribe(self, version: int, f: Fields) -> None:
        correlation, subscription_id, stream = f.u32(), f.u8(), f.text()
        spec = self._offset_spec(f)
        credit = f.u16()
        properties = f.string_map() if f.left else {}
        if subscription_id in self.subscriptions:
            return self._respond(codes.SUBSCRIBE, correlation, codes.SUBSCRIPTION_ID_ALREADY_EXISTS)
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.SUBSCRIBE, correlation, codes.STREAM_DOES_NOT_EXIST)
        code = self._check("queue", stream, "read")
        if code != codes.OK:
            return self._respond(codes.SUBSCRIBE, correlation, code)
        single_active = properties.get("single-active-consumer", "").lower() == "true"
        name = properties.get("name")
        if single_active and not name:
            return self._respond(codes.SUBSCRIBE, correlation, codes.PRECONDITION_FAILED)
        values = frozenset(v.encode("utf-8") for k, v in properties.items() if k.startswith("filter."))
        subscription = Subscription(self, subscription_id, queue, credit, values or None,
                                    properties.get("match-unfiltered", "").lower() == "true", properties)
        subscription.requested = spec
        self.subscriptions[subscription_id] = subscription
        queue.watchers.add(subscription)
        self._respond(codes.SUBSCRIBE, correlation, codes.OK)
        if single_active:
            subscription.active = False
            super_stream = properties.get("super-stream")
            partition = (super_streams.partition_index(self.vhost, super_stream, stream)
                         if super_stream else None)
            subscription.group = (self.vhost.name, stream, name)
            self.node.groups.join(subscription.group, subscription, partition)
        else:
            self.resolve(queue, spec, subscription.start_at)

    def consumer_update(self, subscription: Subscription, active: bool) -> None:
        """Tell a single-active-consumer member whether it is active; an
        active one starts where the client's answer says."""
        self._correlation += 1
        if active:
            self._updates[self._correlation] = subscription
        self.send(frames.frame(codes.CONSUMER_UPDATE, 1, frames.u32(self._correlation),
                               frames.u8(subscription.id), frames.u8(1 if active else 0)))

    def _consumer_update_answer(self, version: int, f: Fields) -> None:
        correlation, _code = f.u32(), f.u16()
        kind = f.u16() if f.left >= 2 else codes.OFFSET_NONE
        value = f.u64() if f.left >= 8 else 0
        subscription = self._updates.pop(correlation, None)
        if subscription is None or subscription.closed:
            return
        group = self.node.groups.groups.get(subscription.group)
        if group is None or group.active is not subscription:
            return  # superseded meanwhile
        subscription.active = True
        if kind == codes.OFFSET_NONE:
            spec = subscription.requested
        elif kind in (codes.OFFSET_FIRST, codes.OFFSET_LAST, codes.OFFSET_NEXT, codes.OFFSET_OFFSET,
                      codes.OFFSET_TIMESTAMP):
            spec = (kind, value if kind != codes.OFFSET_TIMESTAMP else value - (1 << 64) * (value >> 63))
        else:
            raise Malformed("offset specification type %d" % kind)
        subscription.next = -1
        self.resolve(subscription.queue, spec, subscription.start_at)

    def _credit(self, version: int, f: Fields) -> None:
        subscription_id, credit = f.u8(), f.u16()
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            # The only response to a credit, and without a correlation id.
            self.send(frames.frame(codes.CREDIT | codes.RESPONSE, 1, frames.u16(codes.SUBSCRIPTION_ID_DOES_NOT_EXIST),
                                   frames.u8(subscription_id)))
            return
        subscription.credit = min(subscription.credit + credit, 0xFFFF * 16)
        subscription.pump()

    def _unsubscribe(self, version: int, f: Fields) -> None:
        correlation, subscription_id = f.u32(), f.u8()
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            return self._respond(codes.UNSUBSCRIBE, correlation, codes.SUBSCRIPTION_ID_DOES_NOT_EXIST)
        self._drop_subscription(subscription)
        self._respond(codes.UNSUBSCRIBE, correlation, codes.OK)

    def _drop_subscription(self, subscription: Subscription) -> None:
        subscription.closed = True
        self.subscriptions.pop(subscription.id, None)
        subscription.queue.watchers.discard(subscription)
        if subscription.group is not None:
            self.node.groups.leave(subscription.group, subscription)

    def stream_gone(self, name: str) -> None:
        """The stream was deleted: its publishers and subscriptions on this
        connection go, and the client is told once (MetadataUpdate)."""
        for subscription in [s for s in self.subscriptions.values() if s.queue.name == name]:
            self._drop_subscription(subscription)
        for publisher_id in [i for i, p in self.publishers.items() if p.queue.name == name]:
            del self.publishers[publisher_id]
        self.send(frames.frame(codes.METADATA_UPDATE, 1, frames.u16(codes.METADATA_STREAM_NOT_AVAILABLE),
                               frames.string(name)))

    # -- offsets ----------------------------------------------------------------------

    def _store_offset(self, version: int, f: Fields) -> None:
        reference, stream, offset = f.text(), f.text(), f.u64()
        queue = self._stream(stream)
        if queue is None or not reference or self._check("queue", stream, "read") != codes.OK:
            return  # no response to store offset, as RabbitMQ
        self.node.tracking(queue).store_offset(reference, offset)

    def _query_offset(self, version: int, f: Fields) -> None:
        correlation, reference, stream = f.u32(), f.text(), f.text()
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.QUERY_OFFSET, correlation, codes.STREAM_DOES_NOT_EXIST, frames.u64(0))
        code = self._check("queue", stream, "read")
        if code != codes.OK:
            return self._respond(codes.QUERY_OFFSET, correlation, code, frames.u64(0))
        tracking = self.node.tracking(queue)

        def answer() -> None:
            offset = tracking.offsets.get(reference)
            self._respond(codes.QUERY_OFFSET, correlation, codes.OK if offset is not None else codes.NO_OFFSET,
                          frames.u64(offset or 0))
        tracking.when_loaded(answer)

    def _resolve_offset_spec(self, version: int, f: Fields) -> None:
        correlation, stream = f.u32(), f.text()
        spec = self._offset_spec(f)
        if f.left:
            f.string_map()
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.RESOLVE_OFFSET_SPEC, correlation, codes.STREAM_DOES_NOT_EXIST,
                                 frames.u16(codes.OFFSET_OFFSET), frames.u64(0))
        code = self._check("queue", stream, "read")
        if code != codes.OK:
            return self._respond(codes.RESOLVE_OFFSET_SPEC, correlation, code, frames.u16(codes.OFFSET_OFFSET),
                                 frames.u64(0))
        self.resolve(queue, spec, lambda offset: self._respond(
            codes.RESOLVE_OFFSET_SPEC, correlation, codes.OK, frames.u16(codes.OFFSET_OFFSET), frames.u64(offset)))

    # -- streams ---------------------------------------------------------------------

    def _queue_arguments(self, arguments: dict[str, str]) -> dict:
        out = {"x-queue-type": "stream"}
        for key, value in arguments.items():
            known = _ARGUMENTS.get(key)
            if known is None:
                raise AMQPError(PRECONDITION_FAILED, "unknown stream argument %s" % key)
            name, kind = known
            try:
                converted = kind(value)
            except ValueError:
                raise AMQPError(PRECONDITION_FAILED, "invalid value for stream argument %s: %s" % (key, value)) from None
            if name is not None:
                out[name] = converted
        return out

    def _create(self, version: int, f: Fields) -> None:
        correlation, stream, arguments = f.u32(), f.text(), f.string_map()
        if stream in self.vhost.queues:
            return self._respond(codes.CREATE_STREAM, correlation, codes.STREAM_ALREADY_EXISTS)
        try:
            self.vhost.declare_queue(stream, self, durable=True, arguments=self._queue_arguments(arguments),
                                     access=self.access)
        except AMQPError as exc:
            log.info("stream connection from %s: create stream %s refused: %s", self.peer, stream, exc.reply_text)
            return self._respond(codes.CREATE_STREAM, correlation, _CODES.get(exc.reply_code, codes.PRECONDITION_FAILED))
        self._respond(codes.CREATE_STREAM, correlation, codes.OK)

    def _delete(self, version: int, f: Fields) -> None:
        correlation, stream = f.u32(), f.text()
        if self._stream(stream) is None:
            return self._respond(codes.DELETE_STREAM, correlation, codes.STREAM_DOES_NOT_EXIST)
        try:
            self.vhost.delete_queue(stream, self, access=self.access)
        except AMQPError as exc:
            return self._respond(codes.DELETE_STREAM, correlation, _CODES.get(exc.reply_code, codes.INTERNAL_ERROR))
        self._respond(codes.DELETE_STREAM, correlation, codes.OK)

    def _metadata(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        streams = f.strings()
        host, port = self.node.advertised(self)
        entries = []
        for name in streams:
            if self._stream(name) is not None:
                entries.append(frames.string(name) + frames.u16(codes.OK) + frames.u16(0) + frames.array([]))
            else:
                entries.append(frames.string(name) + frames.u16(codes.STREAM_DOES_NOT_EXIST) + frames.u16(0xFFFF)
                               + frames.array([]))
        self.send(frames.frame(codes.METADATA | codes.RESPONSE, 1, frames.u32(correlation),
                               frames.array([frames.u16(0) + frames.string(host) + frames.u32(port)]),
                               frames.array(entries)))

    def _stream_stats(self, version: int, f: Fields) -> None:
        correlation, stream = f.u32(), f.text()
        queue = self._stream(stream)
        if queue is None:
            return self._respond(codes.STREAM_STATS, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
        code = self._check("queue", stream, "read")
        if code != codes.OK:
            return self._respond(codes.STREAM_STATS, correlation, code, frames.array([]))
        log_ = queue.log
        empty = log_.next_offset <= log_.first_offset
        stats = {"first_chunk_id": -1 if empty else log_.first_offset,
                 "committed_chunk_id": -1 if empty else log_.next_offset - 1}
        self._respond(codes.STREAM_STATS, correlation, codes.OK,
                      frames.array([frames.string(k) + frames.i64(v) for k, v in stats.items()]))

    def _exchange_command_versions(self, version: int, f: Fields) -> None:
        correlation = f.u32()
        for _ in range(f.count(6)):
            key, _low, high = f.u16(), f.u16(), f.u16()
            if key == codes.DELIVER:
                self.deliver_version = min(high, codes.COMMAND_VERSIONS[codes.DELIVER][1])
        self._respond(codes.EXCHANGE_COMMAND_VERSIONS, correlation, codes.OK, frames.array(
            [frames.u16(k) + frames.u16(low) + frames.u16(high)
             for k, (low, high) in sorted(codes.COMMAND_VERSIONS.items())]))

    # -- super streams ---------------------------------------------------------------

    def _route(self, version: int, f: Fields) -> None:
        correlation, routing_key, super_stream = f.u32(), f.text(), f.text()
        try:
            streams = super_streams.route(self.vhost, super_stream, routing_key)
        except AMQPError:
            return self._respond(codes.ROUTE, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
        self._respond(codes.ROUTE, correlation, codes.OK, frames.array([frames.string(s) for s in streams]))

    def _partitions(self, version: int, f: Fields) -> None:
        correlation, super_stream = f.u32(), f.text()
        try:
            streams = super_streams.partitions(self.vhost, super_stream)
        except AMQPError:
            return self._respond(codes.PARTITIONS, correlation, codes.STREAM_DOES_NOT_EXIST, frames.array([]))
        self._respond(codes.PARTITIONS, correlation, codes.OK, frames.array([frames.string(s) for s in streams]))

    def _create_super_stream(self, version: int, f: Fields) -> None:
        correlation, name = f.u32(), f.text()
        streams, keys, arguments = f.strings(), f.strings(), f.string_map()
        if not streams or len(streams) != len(keys):
            return self._respond(codes.CREATE_SUPER_STREAM, correlation, codes.PRECONDITION_FAILED)
        try:
            super_streams.create(self.vhost, name, streams, keys, self._queue_arguments(arguments), self,
                                 self.access)
        except super_streams.AlreadyExists:
            return self._respond(codes.CREATE_SUPER_STREAM, correlation, codes.STREAM_ALREADY_EXISTS)
        except AMQPError as exc:
            log.info("stream connection from %s: create super stream %s refused: %s", self.peer, name,
                     exc.reply_text)
            return self._respond(codes.CREATE_SUPER_STREAM, correlation,
                                 _CODES.get(exc.reply_code, codes.PRECONDITION_FAILED))
        self._respond(codes.CREATE_SUPER_STREAM, correlation, codes.OK)

    def _delete_super_stream(self, version: int, f: Fields) -> None:
        correlation, name = f.u32(), f.text()
        try:
            super_streams.delete(self.vhost, name, self, self.access)
        except AMQPError as exc:
            return self._respond(codes.DELETE_SUPER_STREAM, correlation,
                                 _CODES.get(exc.reply_code, codes.INTERNAL_ERROR))
        self._respond(codes.DELETE_SUPER_STREAM, correlation, codes.OK)
