"""One AMQP connection: handshake, tuning, heartbeats, channels, close.

Theory of operation:
- States, in order: HEADER (waiting for the 8-byte protocol header), START_OK,
  TUNE_OK, OPEN_WAIT (waiting for connection.open), RUNNING, then CLOSING
  and CLOSED (the socket is closed). CLOSING is RabbitMQ's "closed": the
  connection's resources are released and everything read is discarded. We
  enter it by sending Connection.Close (a Close-Ok from the client then
  closes the socket) or by answering the client's Close with Close-Ok (we
  then wait for the client to close the socket, as RabbitMQ does: a client
  that reads our EOF before it has closed reports a spurious reset). Either
  way `closing_timeout` bounds the wait (the negotiated heartbeat when it is
  shorter, RabbitMQ's rule).
- Input: `received` feeds the frame reader and handles at most INPUT_BUDGET
  payload bytes per turn; if more is buffered, reading pauses and resumes on
  the next loop turn so one busy connection cannot starve the others.
- Output: frames are appended to `_out`; the protocol writes them once per
  loop turn (`take_output`). `output_paused` is true while the socket is
  paused or `_out` holds more than OUTPUT_HIGH bytes, and consumers on this connection then receive
  nothing until `output_resumed` dispatches again. After acks
  (`acks_handled`) the protocol holds the output until their records are
  written to the OS (amqp_server.shared.client).
- Credit flow: when something this connection publishes into cannot keep
  up (a queue whose consumers are output-bound, see vhosts.queue; the disk
  writer with too much queued, see storage.writer), it is added to
  `blocked_by` and reading stops until every such source calls `unblocked`.
- Resource alarms (amqp_server.shared.alarms): a publish while the memory or disk
  alarm is raised adds the alarms to `blocked_by` the same way, and sends
  connection.blocked / connection.unblocked to clients with that capability.
  `flow_state` is RabbitMQ's connection state for the management API.
- Errors: an AMQPError from a channel with a soft code closes that channel;
  any other closes the connection. Anything unexpected is logged and closes
  the connection with 541, never the broker.
- Heartbeats: one timer per connection ticks every heartbeat/2 seconds; it
  sends a heartbeat frame if nothing was written since the last tick and
  drops the socket after two heartbeat intervals without input.
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import platform
import struct
import time
from typing import TYPE_CHECKING

from pamqp import commands, decode

from amqp_server.amqp.channel import Channel
from amqp_server.amqp.hand_over import HandOver, drain_then_move, hand_over, moved_in
from amqp_server.shared.client import CLOSED, INPUT_BUDGET, ClientConnection
from amqp_server.shared.config import BrokerConfig
from amqp_server.amqp.framing import (
    CONTENT,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameReader,
    payload_snippet,
    content_frames,
    decode_method,
    method_frame,
)
from storage.message import MalformedProperties
from vhosts import Broker
from vhosts.errors import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    UNEXPECTED_FRAME,
    AMQPError,
)

if TYPE_CHECKING:
    from amqp_server.shared.alarms import ResourceAlarms
    from amqp_server.amqp.protocol import AMQPProtocol

log = logging.getLogger("hutch.connection")

HEADER, START_OK, TUNE_OK, OPEN_WAIT, RUNNING, CLOSING = (
    "header", "start_ok", "tune_ok", "open_wait", "running", "closing")  # then CLOSED

# Bytes queued for one write before consumers on this connection wait. Counted in bytes, not
# writes: a turn's input (INPUT_BUDGET of small publishes) must fit as deliveries, or the rest of
# it queues up and the queues stop handing messages straight to their consumers (vhosts.queue).
OUTPUT_HIGH = 1024 * 1024
HANDSHAKE_TIMEOUT = 10.0
CHANNEL_OPEN = (20 << 16 | 10).to_bytes(4, "big")

# What RabbitMQ 3.10 announces, all of which hutch implements (clients
# switch features on these; tests/differential/test_diff_connection.py
# compares them with the reference).
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}
# Clients read `version` as RabbitMQ's to decide what the broker can do, so
# it names the RabbitMQ release whose behaviour hutch follows; hutch's own
# version is in `information`.
RABBITMQ_VERSION = "3.10.8"
MECHANISMS = "PLAIN AMQPLAIN"


@functools.cache
def server_properties() -> dict:
    """Computed once: the version lookup scans sys.path on disk (~1 ms of
    blocking I/O that would otherwise be paid per connection)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        hutch_version = version("hutch")
    except PackageNotFoundError:
        hutch_version = "0+unknown"
    return {
        "capabilities": CAPABILITIES,
        "cluster_name": "hutch@" + platform.node(),
        "copyright": "hutch contributors",
        "information": "hutch %s, an AMQP 0-9-1 broker" % hutch_version,
        "platform": "Python " + platform.python_version(),
        "product": "hutch",
        "version": RABBITMQ_VERSION,
    }


def _frames_of_content(channel: int, method: bytes, header: bytes, body: bytes, end: int) -> list:
    """The wire frames of a scanned CONTENT item, (frame_type, channel,
    payload, offset just past the frame) each."""
    header_end = end - len(body) - FRAME_OVERHEAD if body else end
    frames = [(FRAME_METHOD, channel, method, header_end - len(header) - FRAME_OVERHEAD),
              (FRAME_HEADER, channel, header, header_end)]
    if body:
        frames.append((FRAME_BODY, channel, body, end))
    return frames


class Connection(ClientConnection):
    protocol = "AMQP 0-9-1"  # as the management API names it

    def __init__(self, broker: Broker, config: BrokerConfig, io: "AMQPProtocol", peer: tuple | None,
                 alarms: "ResourceAlarms") -> None:
        self.broker = broker
        self.alarms = alarms
        self.config = config
        self.io = io
        self.peer = peer
        self.state = HEADER
        self.reader = FrameReader(config.frame_max)
        self.frame_max = config.frame_max
        self.channel_max = config.channel_max
        self.heartbeat = 0
        self.vhost = None
        self.user = None
        self.client_properties: dict = {}
        self.auth_mechanism = ""
        # Bytes and socket reads/writes, for the management API (recv_oct, send_oct, ...).
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.connected_at = int(time.time() * 1000)  # ms since the epoch, as RabbitMQ reports it
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: list = []
        # Flow sources (queues, the disk writer) that keep us from reading.
        self.blocked_by: set = set()
        # connection.blocked was sent and connection.unblocked is owed
        self._told_blocked = False
        self._header = b""
        self._out: list[bytes] = []
        self._out_bytes = 0
        # Acks (or nack/reject without requeue) handled since the last write:
        # the protocol writes nothing more until their records reach the OS.
        self.acks_handled = False
        self._confirming: set[Channel] = set()
        self.socket_paused = False
        self._received_since_tick = True
        self._silent_ticks = 0
        self._sent_since_tick = False
        self._timer = io.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
        broker.churn.connection_created += 1
        # It stays on this shard (it moved here, or could not move: amqp_server.amqp.hand_over).
        self.staying = False
        # Its channels count where their publishes go (hand_over.count_bound) while it may move.
        self.counts_publishes = broker.shards is not None and config.shard_moves
        self.drains = 0  # how often it held its reading to move (hand_over.HandOver.drain)
        self.others_pinged = False  # the shards it does not move to have what it sent them (hand_over.hand_over)

    # -- output --------------------------------------------------------------

    def unacked_deliveries(self):
        """(queue, entry) of every delivery not acked yet, over the channels
        (for the management API's unacknowledged counts)."""
        for channel in list(self.channels.values()):
            for queue, entry, _consumer in list(channel.unacked.values()):
                yield queue, entry

    @property
    def output_paused(self) -> bool:
        return self.socket_paused or self._out_bytes > OUTPUT_HIGH

    def send_raw(self, data: bytes) -> None:
        if not self._out:
            self.io.wake()
        self._out.append(data)
        self._out_bytes += len(data)

    def send_frames(self, frames: list[bytes]) -> None:
        if not self._out:
            self.io.wake()
        self._out += frames
        self._out_bytes += sum(map(len, frames))

    def send_method(self, channel: int, method) -> None:
        self.send_raw(method_frame(channel, method))

    def send_content(self, channel: int, method, message, header: bytes | None = None) -> None:
        frames = content_frames(channel, message.header if header is None else header, message.body,
                                self.frame_max)
        frames.insert(0, method_frame(channel, method))
        self.send_frames(frames)

    def confirm_pending(self, channel: Channel) -> None:
        if not self._confirming:
            self.io.wake()
        self._confirming.add(channel)

    def flush_confirms_of(self, channel: Channel) -> None:
        """Send a channel's due confirms now, ahead of what follows."""
        if channel in self._confirming:
            self._confirming.discard(channel)
            channel.flush_confirms()

    def take_output(self) -> list[bytes]:
        """Everything to write this turn (confirms coalesced last)."""
        if self._confirming:
            for channel in self._confirming:
                channel.flush_confirms()
            self._confirming.clear()
        out = self._out
        size = self._out_bytes
        was_full = size > OUTPUT_HIGH
        self._out = []
        self._out_bytes = 0
        if out:
            self._sent_since_tick = True
            self.send_oct += size
            self.send_cnt += 1
        if was_full and not self.socket_paused:
            self.io.call_soon(self.output_resumed)
        return out

    def output_resumed(self) -> None:
        for channel in list(self.channels.values()):
            channel.dispatch_consumers()

    def client_has(self, capability: str) -> bool:
        caps = self.client_properties.get("capabilities")
        return isinstance(caps, dict) and bool(caps.get(capability))

    # -- input ---------------------------------------------------------------

    def received(self, data: bytes | memoryview) -> None:
        """`data` is valid during this call only (a view of the shared read
        buffer, amqp_server.shared.client): what is kept is copied."""
        self._received_since_tick = True
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state is HEADER:
            self._header += data
            if len(self._header) < 8 and PROTOCOL_HEADER.startswith(self._header):
                return
            if self._header[:8] != PROTOCOL_HEADER:
                self.send_raw(PROTOCOL_HEADER)
                self._shutdown()
                return
            data = self._header[8:]
            self._header = b""
            self._send_start()
        self.reader.feed(data)
        self.parse()

    def parse(self) -> None:
        reader = self.reader
        channels = self.channels
        budget = INPUT_BUDGET
        done = 0  # bytes of the buffer handled: consumed however this ends
        try:
            while budget > 0:
                items = reader.scan(budget)
                if not items:
                    break
                for frame_type, channel, payload, header, body, end in items:
                    if self.state is CLOSED:
                        return
                    start, done = done, end
                    if frame_type != CONTENT:
                        self._frame(frame_type, channel, payload)
                    elif self.state is not RUNNING or (open_channel := channels.get(channel)) is None or \
                            not open_channel.published(payload, header, body):
                        frames = _frames_of_content(channel, payload[3], header, body, end)
                        for frame_type, channel, payload, done in frames:
                            if self.state is CLOSED:
                                return
                            self._frame(frame_type, channel, payload)
                            if self.blocked_by:
                                break
                    if self.blocked_by:
                        # Credit flow: a queue asked us to wait; the rest of the
                        # buffer is parsed when every such queue has let go.
                        self.io.pause_reading()
                        return
                budget -= done
                reader.consume(done)
                done = 0
        except HandOver as move:
            done = start  # what came before is handled; the deciding frame and the rest move, or are read again
            if move.drain:
                drain_then_move(self)
            else:
                hand_over(self, move.shard, start)
            return
        except AMQPError as exc:
            self.close_with(exc)
            return
        except MalformedProperties as exc:
            # RabbitMQ's channel crashes on these and the connection closes
            # with 541 and exactly this text; no traceback is worth logging.
            log.warning("undecodable content properties from %s: %s", self.peer, exc)
            error = AMQPError(INTERNAL_ERROR, "")
            error.reply_text = "INTERNAL_ERROR"
            self.close_with(error)
            return
        except Exception:
            log.exception("internal error on connection from %s", self.peer)
            self.close_with(AMQPError(INTERNAL_ERROR, "internal error"))
            return
        finally:
            reader.consume(done)
        if budget <= 0 and reader.buffered and self.state is not CLOSED:
            self.io.pause_reading()
            self.io.call_soon(self._continue)

    def alarm_blocked(self, alarms: "ResourceAlarms") -> None:
        self.blocked_by.add(alarms)
        if self.client_has("connection.blocked"):
            self._told_blocked = True
            self.send_method(0, commands.Connection.Blocked(reason=alarms.reason))

    def alarm_cleared(self, alarms: "ResourceAlarms") -> None:
        if self._told_blocked and self.state is RUNNING:
            self._told_blocked = False
            self.send_method(0, commands.Connection.Unblocked())
        self.unblocked(alarms)

    def _frame(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type == FRAME_HEARTBEAT and number == 0:
            return
        state = self.state
        if number == 0 or frame_type == FRAME_HEARTBEAT:
            if frame_type != FRAME_METHOD:
                # RabbitMQ's words for a heartbeat off channel 0 or content on it
                raise AMQPError(UNEXPECTED_FRAME, "type %d, %s" % (frame_type, payload_snippet(payload)))
            self._connection_method(decode_method(payload))
            return
        if state is not RUNNING:
            if state is CLOSING:
                return
            raise AMQPError(CHANNEL_ERROR, "unexpected frame on channel %d in connection state %s" % (number, state))
        channel = self.channels.get(number)
        if channel is None:
            self._open_channel(number, frame_type, payload)
            return
        try:
            if frame_type == FRAME_METHOD:
                channel.handle_method_frame(payload)
            else:
                channel.handle_content_frame(frame_type, payload)
        except AMQPError as exc:
            if exc.closes_connection:
                raise
            channel.close_with(exc)

    def _open_channel(self, number: int, frame_type: int, payload: bytes) -> None:
        if frame_type != FRAME_METHOD or payload[:4] != CHANNEL_OPEN:
            error = AMQPError(CHANNEL_ERROR, "expected 'channel.open'")
            if frame_type == FRAME_METHOD and len(payload) >= 4:
                error.at(int.from_bytes(payload[:2], "big"), int.from_bytes(payload[2:4], "big"))
            raise error
        try:
            decode_method(payload)  # RabbitMQ refuses malformed arguments here too
        except AMQPError as exc:
            raise exc.at(20, 10)
        if len(self.channels) >= self.channel_max:
            # RabbitMQ limits how many channels are open, not their numbers.
            raise AMQPError(
                NOT_ALLOWED,
                "number of channels opened (%d) has reached the negotiated channel_max (%d)"
                % (len(self.channels), self.channel_max),
            ).at(0, 0)
        self.broker.check_channel_limit(self.user)
        self.channels[number] = Channel(self, number)
        self.broker.channels_changed(self, 1)
        self.broker.churn.channel_created += 1
        self.send_method(number, commands.Channel.OpenOk())

    def channel_closed(self, channel: Channel) -> None:
        if self.channels.get(channel.number) is channel:
            self.broker.channels_changed(self, -1)
            del self.channels[channel.number]
            self.vhost.stats.retire(channel.stats)
            self.broker.churn.channel_closed += 1
        self._confirming.discard(channel)

    def unexpected_method(self, method) -> AMQPError:
        if isinstance(method, commands.Channel.Open):
            return AMQPError(CHANNEL_ERROR, "second 'channel.open' seen")
        return AMQPError(COMMAND_INVALID, "unimplemented method")

    # -- channel 0 -----------------------------------------------------------

    def _connection_method(self, method) -> None:
        state = self.state
        index = method.index
        try:
            if state is CLOSING:
                # RabbitMQ's "closed" state: a Close is answered, a Close-Ok
                # ends the wait, anything else is discarded.
                if isinstance(method, commands.Connection.Close):
                    self.send_method(0, commands.Connection.CloseOk())
                elif isinstance(method, commands.Connection.CloseOk):
                    self._shutdown()
                return
            if isinstance(method, commands.Connection.Close):
                for channel in list(self._confirming):
                    self.flush_confirms_of(channel)
                self._release()
                self.state = CLOSING
                self.send_method(0, commands.Connection.CloseOk())
                self._wait_for_close()
                return
            if isinstance(method, commands.Connection.UpdateSecret) and state is RUNNING:
                self._update_secret(method)
                return
            expected = {
                START_OK: commands.Connection.StartOk,
                TUNE_OK: commands.Connection.TuneOk,
                OPEN_WAIT: commands.Connection.Open,
            }.get(state)
            if expected is None or not isinstance(method, expected):
                raise AMQPError(
                    CHANNEL_ERROR,
                    "unexpected method in connection state %s" % ("running" if state is RUNNING else state),
                )
            if state is START_OK:
                self._start_ok(method)
            elif state is TUNE_OK:
                self._tune_ok(method)
            else:
                self._open(method)
        except AMQPError as exc:
            raise exc.at(index >> 16, index & 0xFFFF)

    def _server_properties(self) -> dict:
        """On a node of several shards, also which one serves this connection
        (docs/scaling.md; clients ignore a property they do not know)."""
        shards = self.broker.shards
        return server_properties() if shards is None else dict(server_properties(), shard=shards.here)

    def _send_start(self) -> None:
        self.state = START_OK
        self.send_method(
            0,
            commands.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties=self._server_properties(),
                mechanisms=MECHANISMS,
                locales="en_US",
            ),
        )

    def _credentials(self, method) -> tuple[str, str]:
        response = method.response
        raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
        if method.mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                return "", ""
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        try:
            _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:
            return "", ""
        login, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        return (login if isinstance(login, str) else ""), (password if isinstance(password, str) else "")

    def _start_ok(self, method) -> None:
        self.client_properties = method.client_properties or {}
        if method.mechanism not in MECHANISMS.split():
            raise AMQPError(COMMAND_INVALID, "unknown authentication mechanism '%s'" % method.mechanism)
        self.auth_mechanism = method.mechanism
        username, password = self._credentials(method)
        self.user = self.broker.authenticate(username, password, self._from_loopback())
        host = self.peer[0] if self.peer else ""
        if self.user is None:
            log.warning("login refused for user '%s' from %s (mechanism %s)", username, self.peer, method.mechanism)
            # Answered after a delay (amqp_server.shared.login_throttle); meanwhile
            # CLOSING discards whatever else the client sends.
            self.state = CLOSING
            self._timer.cancel()
            self._timer = self.io.call_later(self.io.logins.failed(host, username),
                                             lambda: self._refuse_login(method.mechanism))
            return
        self.io.logins.succeeded(host, username)
        self.state = TUNE_OK
        self.send_method(
            0,
            commands.Connection.Tune(
                channel_max=self.config.channel_max,
                frame_max=self.config.frame_max,
                heartbeat=self.config.heartbeat,
            ),
        )

    def _update_secret(self, method) -> None:
        """RabbitMQ 3.8+ (OAuth 2 token refresh), as 3.10's internal backend
        answers it: update-secret-ok whatever the new secret. The connection
        is already authenticated and a password grants nothing new; only
        token backends, which hutch does not have, check the secret."""
        log.info("user '%s' from %s updated its secret, reason: %s", self.user.name, self.peer, method.reason)
        self.send_method(0, commands.Connection.UpdateSecretOk())

    def _refuse_login(self, mechanism: str) -> None:
        if self.state is CLOSED:
            return
        if self.client_has("authentication_failure_close"):
            self.state = START_OK  # so close_with sends the close
            self.close_with(AMQPError(
                ACCESS_REFUSED,
                "Login was refused using authentication mechanism %s. For details see the broker logfile."
                % mechanism,
            ))  # RabbitMQ names no method here
            return
        self._shutdown()

    def _from_loopback(self) -> bool:
        if not self.peer:
            return True  # a Unix socket or a test transport
        try:
            return ipaddress.ip_address(self.peer[0]).is_loopback
        except ValueError:
            return False

    def _tune_ok(self, method) -> None:
        ours = self.config
        frame_max = method.frame_max or ours.frame_max
        if frame_max > ours.frame_max:
            raise AMQPError(NOT_ALLOWED, "frame_max=%d > %d max size" % (frame_max, ours.frame_max))
        if frame_max < 4096:
            raise AMQPError(NOT_ALLOWED, "frame_max=%d < 4096 min size" % frame_max)
        channel_max = method.channel_max or ours.channel_max
        if channel_max > ours.channel_max:
            raise AMQPError(NOT_ALLOWED, "channel_max=%d > %d max" % (channel_max, ours.channel_max))
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = OPEN_WAIT

    def _open(self, method) -> None:
        limit = self.config.connection_max
        if limit is not None and self.broker.node_count("node", "") >= limit:
            raise AMQPError(NOT_ALLOWED, "connection refused: node connection limit (%d) is reached" % limit)
        self.vhost = self.broker.open_vhost(self.user, method.virtual_host, self)
        self.state = RUNNING
        self._timer.cancel()
        if self.heartbeat:
            self._timer = self.io.call_later(self.heartbeat / 2, self._tick)
        self.send_method(0, commands.Connection.OpenOk())

    # -- heartbeats and timeouts ---------------------------------------------

    def _tick(self) -> None:
        if self.state is CLOSED:
            return
        if self._received_since_tick or self.blocked_by:
            # Not reading is our doing while blocked: heartbeats wait, as RabbitMQ's do.
            self._silent_ticks = 0
        else:
            self._silent_ticks += 1
            if self._silent_ticks >= 4:
                log.warning("missed heartbeats from %s, closing the connection", self.peer)
                self._shutdown()
                return
        self._received_since_tick = False
        if not self._sent_since_tick:
            self.send_raw(HEARTBEAT_FRAME)
        self._sent_since_tick = False
        self._timer = self.io.call_later(self.heartbeat / 2, self._tick)

    def _handshake_timeout(self) -> None:
        if self.state in (HEADER, START_OK, TUNE_OK, OPEN_WAIT):
            log.warning("handshake timeout for %s", self.peer)
            self._shutdown()

    # -- closing -------------------------------------------------------------

    def own_exclusive(self, queue) -> None:
        if queue not in self.exclusive_queues:
            self.exclusive_queues.append(queue)

    def force_close(self, reason: str) -> None:
        """An administrator closed us (vhost or user deleted): 320, RabbitMQ's text."""
        self.close_with(AMQPError(CONNECTION_FORCED, reason))

    def close_with(self, error: AMQPError) -> None:
        """Send Connection.Close and wait (briefly) for Close-Ok."""
        if self.state in (CLOSING, CLOSED):
            return
        if error.reply_code != 320:
            log.info("closing connection from %s: %s", self.peer, error.reply_text)
        self._release()
        self.state = CLOSING
        self.send_method(
            0,
            commands.Connection.Close(
                reply_code=error.reply_code,
                reply_text=error.reply_text[:255],
                class_id=error.class_id,
                method_id=error.method_id,
            ),
        )
        self._wait_for_close()

    def _wait_for_close(self) -> None:
        """Closing: the socket is closed when the client's Close-Ok comes or
        the client closes it, or after closing_timeout seconds (the heartbeat
        when it is shorter: RabbitMQ's rule)."""
        timeout = self.config.closing_timeout
        if 0 < self.heartbeat < timeout:
            timeout = self.heartbeat
        self._timer.cancel()
        self._timer = self.io.call_later(timeout, self._shutdown)

    def _release(self) -> None:
        self.broker.connection_closed(self)
        for source in self.blocked_by:
            source.flow_waiters.discard(self)
        self.blocked_by.clear()
        channels = list(self.channels.values())
        self.channels.clear()
        self.broker.churn.channel_closed += len(channels)
        for channel in channels:
            channel.release()
            channel.vhost.stats.retire(channel.stats)
        for queue in self.exclusive_queues:
            self.vhost.remove_queue(queue)
        self.exclusive_queues.clear()

    def _shutdown(self) -> None:
        """Flush what is queued and close the socket."""
        if self.state is CLOSED:
            return
        self._release()
        self.state = CLOSED
        self._timer.cancel()
        self.io.close()

    # -- moving to another shard (amqp_server.amqp.hand_over) ------------------

    def adopt(self, state: dict, pending: bytes) -> None:
        """Go on serving a connection another shard moved here."""
        self._timer.cancel()
        # The shard that accepted it counted it created (and does not count it closed): the
        # node's churn, summed over its shards, counts it once.
        self.broker.churn.connection_created -= 1
        self.user = self.broker.users[state["user"]]
        self.client_properties = state["client_properties"]
        self.auth_mechanism = state["auth_mechanism"]
        self.frame_max = self.reader.frame_max = state["frame_max"]
        self.channel_max = state["channel_max"]
        self.heartbeat = state["heartbeat"]
        self.connected_at = state["connected_at"]
        self.recv_oct, self.recv_cnt, self.send_oct, self.send_cnt = state["counters"]
        self.vhost = self.broker.open_vhost(self.user, state["vhost"], self, admitted=True)
        self.state = RUNNING
        self.staying = True  # it moves once
        self.counts_publishes = False
        number, channel_state = state["channel"]
        channel = self.channels[number] = Channel(self, number)
        self.broker.channels_changed(self, 1)
        moved_in(channel, channel_state)
        if self.heartbeat:
            self._timer = self.io.call_later(self.heartbeat / 2, self._tick)
        self.reader.feed(pending)
        self.parse()

    def lost(self) -> None:
        """The socket is gone (either side)."""
        self.broker.churn.connection_closed += 1
        self._release()
        self.state = CLOSED
        self._timer.cancel()
