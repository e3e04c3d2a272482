"""One AMQP channel: method dispatch, content assembly, publish, confirms, tx.

Theory of operation:
- State: OPEN until either side closes. After the server sends Channel.Close
  the channel is CLOSING and every frame is discarded until Channel.CloseOk
  (spec 2.3.7.1); its consumers and unacked messages were already released.
- Content assembly: basic.publish sets `_publish`; the next frame on this
  channel must be its content header, then body frames until `body_size`
  bytes arrived (anything else is UNEXPECTED_FRAME, a connection error).
- Confirms: every publish in confirm mode gets the next sequence number. A
  message that no queue keeps durably is confirmable at once; one that
  durable queues persist waits in `_awaiting[seq]` for that many
  `on_durable` calls. Confirms go out in tag order: `flush_confirms` (once
  per write turn) acks, with `multiple`, everything below the oldest seq
  still waiting (or everything, when none waits). A publish a queue refused
  (reject-publish) waits as `NACK` and is nacked in its turn.
- Transactions: publishes and settlements are kept in `_tx` and applied in
  order on commit; rollback drops the publishes and gives the settled
  deliveries back to `unacked`. A commit in which a queue refused a publish
  (reject-publish), or whose queue's shard ended before it answered, applies
  the rest and closes the channel with RabbitMQ's 406 "partial tx
  completion" instead of commit-ok (`_Commit`).
- The consumer side (deliveries, acks, qos) lives in `deliveries.Deliveries`.
- Counting (RabbitMQ's message_stats): publishes (when routed: a
  transaction's at commit), confirms and unroutable messages are counted on
  the channel (`stats`, shared with the consumer side); the exchange's
  publish_in/publish_out in vhosts.VirtualHost.publish.
- Permissions: `access` (vhosts.access.Access) is checked by every operation
  where RabbitMQ checks it; on publish that is one dict lookup once the
  channel has used the exchange.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands

from amqp_server.amqp import declarations, direct_reply_to, fastpath
from vhosts import firehose
from amqp_server.amqp.deliveries import Deliveries
from amqp_server.amqp.hand_over import MOVE_AFTER, HandOver, count_bound, movable
from amqp_server.amqp.framing import FRAME_BODY, FRAME_HEADER, content_header_prefix, decode_method, erlang_binary, named_method
from storage import Message
from storage.message import HEADERS, REPLY_TO
from vhosts.access import Access
from vhosts.properties import check_properties
from vhosts.errors import (
    AMQPError,
    FRAME_ERROR,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    field_type,
)

if TYPE_CHECKING:
    from amqp_server.amqp.connection import Connection

OPEN = "open"
CLOSING = "closing"

BASIC_CLASS = 60
TX_CLASS, TX_COMMIT = 90, 20
# user_id (bit 4) and expiration (bit 8) in the first property-flags word
# (header[12:14]): publishes with either are checked as RabbitMQ does.
_CHECKED_PROPERTIES = 0x0010 | 0x0100
NACK = -1  # in `_awaiting`: a refused publish, nacked when its turn comes


class _Confirm:
    """`on_durable` of a publish in confirm mode: called when every queue
    has the message; `refused` when one cannot keep it (vhosts.remote_queue)."""

    __slots__ = ("channel", "seq")

    def __init__(self, channel: "Channel", seq: int) -> None:
        self.channel = channel
        self.seq = seq

    def __call__(self) -> None:
        self.channel._durable(self.seq)

    def refused(self) -> None:
        self.channel._refused(self.seq)


class _Commit:
    """Counts what a tx.commit waits for: itself (its own call once every
    action is applied), and on a node of several shards each queue's
    answer (`on_durable` of its publishes: another shard's queue answers
    over a link). `refused`: a queue cannot keep a message (reject-publish,
    or its shard ended before it answered, as RabbitMQ takes a queue whose
    node went down: vhosts.remote_queue); the commit then fails."""

    __slots__ = ("channel", "waiting", "failed")

    def __init__(self, channel: "Channel") -> None:
        self.channel = channel
        self.waiting = 1
        self.failed = False

    def __call__(self) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.channel._committed(self.failed)

    def refused(self) -> None:
        self.failed = True
        self()


class Channel(Deliveries):
    def __init__(self, connection: "Connection", number: int) -> None:
        super().__init__()
        self.connection = connection
        self.number = number
        self.vhost = connection.vhost
        self.access = Access(connection.user, connection.vhost.name)
        self.vhost.stats.attach(self.stats)  # retired by the connection when the channel goes
        self.state = OPEN
        # Pending content: [exchange, routing_key, mandatory, header, body_size, parts, received]
        self._publish: list | None = None
        self.confirm = False
        self._publish_seq = 0
        self._confirm_from = 1
        # seq -> how many queues have yet to make it durable, oldest first
        self._awaiting: dict[int, int] = {}
        self._tx: list | None = None
        self.most_recent_queue = ""
        # On a node of several shards: the shard the latest publishes all went to, and how many.
        self._bound_for = 0
        self._bound_count = 0
        # Called (soon) once no publish awaits its confirm (a connection about to move waits for it).
        self.on_drained = None
        self.handlers = {
            commands.Channel.Close: self._close,
            commands.Channel.CloseOk: self._close_ok,
            commands.Channel.Flow: self._flow,
            commands.Confirm.Select: self._confirm_select,
            commands.Tx.Select: self._tx_select,
            commands.Tx.Commit: self._tx_commit,
            commands.Tx.Rollback: self._tx_rollback,
            **{cls: self._bind_handler(fn) for cls, fn in declarations.HANDLERS.items()},
            **self.delivery_handlers(),
        }

    @property
    def transactional(self) -> bool:
        return self._tx is not None

    @property
    def unconfirmed(self) -> int:
        """Publishes in confirm mode not confirmed yet."""
        return self._publish_seq - self._confirm_from + 1 if self.confirm else 0

    def _bind_handler(self, fn):
        return lambda method: fn(self, method)

    def send_method(self, method) -> None:
        self.connection.send_method(self.number, method)

    # -- frames --------------------------------------------------------------

    def handle_method_frame(self, payload: bytes) -> None:
        if self.state is CLOSING:
            # As RabbitMQ: a Close that crossed ours gets Close-Ok and we still
            # wait for the client's Close-Ok; a channel.open is a second open.
            method = decode_method(payload)
            if isinstance(method, commands.Channel.CloseOk):
                self.connection.channel_closed(self)
            elif isinstance(method, commands.Channel.Close):
                self.send_method(commands.Channel.CloseOk())
            elif isinstance(method, commands.Channel.Open):
                raise self.connection.unexpected_method(method).at(20, 10)
            return
        if self._publish is not None:
            if self._publish[3] is not None:
                raise AMQPError(
                    UNEXPECTED_FRAME, "expected content body, got non content body frame instead"
                ).at(BASIC_CLASS, 40)
            raise AMQPError(
                UNEXPECTED_FRAME,
                "expected content header for class %d, got non content header frame instead" % BASIC_CLASS,
            ).at(BASIC_CLASS, 40)
        index = int.from_bytes(payload[:4], "big")
        try:
            if index == fastpath.PUBLISH:
                self._start_publish(*fastpath.decode_publish(payload))
                return
            if index == fastpath.ACK:
                self.basic_ack(*fastpath.decode_ack(payload))
                return
        except (ValueError, IndexError, AMQPError) as exc:
            if isinstance(exc, AMQPError):
                raise exc.at(index >> 16, index & 0xFFFF)
            raise AMQPError(FRAME_ERROR, "cannot decode %s" % erlang_binary(payload[4:])).at(index >> 16, index & 0xFFFF)
        try:
            method = decode_method(payload)
            handler = self.handlers.get(type(method))
            if handler is None:
                raise self.connection.unexpected_method(method)
            handler(method)
        except AMQPError as exc:
            raise exc.at(index >> 16, index & 0xFFFF)

    def handle_content_frame(self, frame_type: int, payload: bytes) -> None:
        if self.state is CLOSING:
            return
        pending = self._publish
        if pending is None:
            raise AMQPError(UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if frame_type == FRAME_HEADER:
            if pending[3] is not None:
                raise AMQPError(
                    UNEXPECTED_FRAME,
                    "expected content body, got non content body frame instead",
                ).at(BASIC_CLASS, 40)
            class_id, body_size = content_header_prefix(payload)
            if class_id != BASIC_CLASS:
                raise AMQPError(
                    UNEXPECTED_FRAME,
                    "expected content header for class %d, got one for class %d instead" % (BASIC_CLASS, class_id),
                ).at(BASIC_CLASS, 40)
            limit = self.connection.config.max_message_size
            if body_size > limit:
                self._publish = None
                raise AMQPError(
                    PRECONDITION_FAILED,
                    "message size %d is larger than configured max size %d" % (body_size, limit),
                ).at(BASIC_CLASS, 40)
            pending[3] = payload
            pending[4] = body_size
            if body_size == 0:
                self._publish = None
                self._finish_publish(pending[0], pending[1], pending[2], payload, b"")
            return
        if frame_type != FRAME_BODY or pending[3] is None:
            raise AMQPError(
                UNEXPECTED_FRAME,
                "expected content header for class %d, got non content header frame instead" % BASIC_CLASS,
            ).at(BASIC_CLASS, 40)
        pending[5].append(payload)
        pending[6] += len(payload)
        if pending[6] >= pending[4]:
            if pending[6] > pending[4]:
                raise AMQPError(
                    FRAME_ERROR,
                    "content body of %d bytes exceeds the declared size %d" % (pending[6], pending[4]),
                ).at(BASIC_CLASS, 40)
            parts = pending[5]
            self._publish = None
            self._finish_publish(pending[0], pending[1], pending[2], pending[3],
                                 parts[0] if len(parts) == 1 else b"".join(parts))

    def published(self, publish: tuple, header: bytes, body: bytes) -> bool:
        """A basic.publish with its whole content at once (the frame reader
        joined its frames and decoded its arguments, `publish` = (exchange,
        routing_key, mandatory, method payload)): False, having done
        nothing, unless it is the plain case, which is then published.
        Everything else (errors included) goes frame by frame, so it has one
        implementation. A channel error closes this channel; a connection
        error is raised."""
        if self.state is CLOSING or self._publish is not None or self.connection.alarms.raised \
                or len(body) > self.connection.config.max_message_size:
            return False
        if self._bound_count >= MOVE_AFTER:  # every recent publish was for that shard's queues
            connection = self.connection
            if movable(connection):
                raise HandOver(self._bound_for)
            if self.unconfirmed and movable(connection, confirms_out=True):
                raise HandOver(self._bound_for, drain=True)
        try:
            self._finish_publish(publish[0], publish[1], publish[2], header, body)
        except AMQPError as exc:
            if exc.closes_connection:
                raise
            self.close_with(exc)
        return True

    # -- publish -------------------------------------------------------------

    def _start_publish(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        if immediate:
            raise AMQPError(NOT_IMPLEMENTED, "immediate=true")
        if self.connection.alarms.raised:
            self.connection.alarms.block(self.connection)
        self._publish = [exchange, routing_key, mandatory, None, 0, [], 0]

    def _finish_publish(self, exchange: str, routing_key: str, mandatory: bool, header: bytes, body: bytes) -> None:
        try:
            # RabbitMQ's order: write permission, the exchange (404, internal),
            # the topic permission of the routing key, reply_to (direct
            # reply-to), then the other properties.
            self.access.publish(exchange)
            if exchange:  # the default exchange always exists and is not internal
                x = self.vhost.check_publish(exchange)
                if x.type == "topic":
                    self.access.topic(x, routing_key, "write")
            flags = int.from_bytes(header[12:14], "big")
            if flags & REPLY_TO:
                header = direct_reply_to.rewritten(header, self.reply_consumer)
            message = Message(exchange, routing_key, header, body)
            if flags & _CHECKED_PROPERTIES:
                check_properties(message.properties, self.connection.user)
            keys, headers = self._routing_keys(message) if flags & HEADERS else ([routing_key], None)
        except AMQPError as exc:
            raise exc.at(BASIC_CLASS, 40)
        if self.confirm:
            self._publish_seq += 1
        if self._tx is not None:
            self._tx.append(("publish", message, keys, headers, mandatory))
            return
        if not self.confirm:
            self._route(message, keys, headers, mandatory)
            return
        seq = self._publish_seq
        waits, rejected = self._route(message, keys, headers, mandatory, _Confirm(self, seq))
        if rejected:
            waits = NACK
        if waits:
            self._awaiting[seq] = waits
        if waits <= 0:  # confirmable now (0), or refused (NACK)
            self.connection.confirm_pending(self)

    def _refused(self, seq: int) -> None:
        """A queue that was to keep it cannot (another shard's, gone): a nack."""
        if seq in self._awaiting:
            self._awaiting[seq] = NACK
            self.connection.confirm_pending(self)

    def _durable(self, seq: int) -> None:
        left = self._awaiting.get(seq)
        if left is None or left == NACK:  # the channel closed meanwhile, or nacked anyway
            return
        if left > 1:
            self._awaiting[seq] = left - 1
        else:
            del self._awaiting[seq]
            self.connection.confirm_pending(self)

    def _routing_keys(self, message: Message) -> tuple[list[str], dict | None]:
        """A message with headers: [routing_key] + CC + BCC (RabbitMQ's
        sender-selected distribution); BCC is removed from the message before
        it is stored."""
        headers = message.headers
        keys = [message.routing_key]
        for name in ("CC", "BCC"):
            if name not in headers:
                continue
            value = headers[name]
            if not isinstance(value, list):
                raise AMQPError(
                    PRECONDITION_FAILED,
                    'invalid message: {unacceptable_type_in_header,"%s",%s}' % (name, field_type(value)),
                )
            # RabbitMQ takes the longstr elements and skips any other.
            keys += [v for v in value if isinstance(v, str)]
        if "BCC" in headers:
            message.remove_header("BCC")
        return keys, headers

    def _route(self, message: Message, keys: list[str], headers: dict | None, mandatory: bool,
               on_durable=None) -> tuple[int, bool]:
        """Publish into the vhost; returns how many queues will call
        `on_durable`, and whether a queue refused the message (reject-publish)."""
        if self.vhost.tracing:
            firehose.published(self.vhost, firehose.channel_origin(self), message, keys, headers)
        self.stats.publish += 1
        reached, waits, rejected = self.vhost.publish(message, keys, headers, self.connection, on_durable)
        if self.connection.counts_publishes:
            count_bound(self, self.connection.broker.shards.here)
        if not reached and not mandatory:
            self.stats.drop_unroutable += 1
        elif not reached:
            self.stats.return_unroutable += 1
            self.connection.send_content(
                self.number,
                named_method(commands.Basic.Return,
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=message.exchange,
                    routing_key=message.routing_key,
                ),
                message,
            )
        return waits, rejected

    def flush_confirms(self) -> None:
        awaiting = self._awaiting
        while True:
            first = next(iter(awaiting)) if awaiting else 0
            upto = first - 1 if awaiting else self._publish_seq
            if upto >= self._confirm_from:
                self.stats.confirm += upto - self._confirm_from + 1
                self.connection.send_raw(fastpath.ack_frame(self.number, upto, upto > self._confirm_from))
                self._confirm_from = upto + 1
            if not awaiting or awaiting[first] != NACK:
                if self.on_drained is not None and not self.unconfirmed:
                    drained, self.on_drained = self.on_drained, None
                    self.connection.io.call_soon(drained)
                return
            del awaiting[first]
            self.send_method(commands.Basic.Nack(delivery_tag=first, multiple=False, requeue=False))
            self._confirm_from = first + 1

    # -- channel class ---------------------------------------------------------

    def _close(self, method) -> None:
        # Confirms already due go out before Close-Ok, as RabbitMQ sends them
        # (they are otherwise coalesced until the end of the loop turn).
        self.connection.flush_confirms_of(self)
        self.release()
        self.connection.channel_closed(self)
        self.send_method(commands.Channel.CloseOk())

    def _close_ok(self, method) -> None:
        """A CloseOk while OPEN answers nothing we sent (RabbitMQ: 503)."""
        raise self.connection.unexpected_method(method)

    def close_with(self, error: AMQPError) -> None:
        """Server-initiated close after a soft error (404, 405, 406, 403)."""
        self.release()
        self.state = CLOSING
        self._publish = None
        self.send_method(
            commands.Channel.Close(
                reply_code=error.reply_code,
                reply_text=error.reply_text[:255],
                class_id=error.class_id,
                method_id=error.method_id,
            )
        )

    def _flow(self, method) -> None:
        if not method.active and not self.connection.config.channel_flow_pause:
            raise AMQPError(NOT_IMPLEMENTED, "active=false")  # RabbitMQ's answer, a connection error
        self.flow_active = bool(method.active)
        self.send_method(commands.Channel.FlowOk(active=self.flow_active))
        if self.flow_active:
            self.dispatch_consumers()

    # -- confirm and tx ----------------------------------------------------------

    def _confirm_select(self, method) -> None:
        if self._tx is not None:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not method.nowait:
            self.send_method(commands.Confirm.SelectOk())

    def _tx_select(self, method) -> None:
        if self.confirm:
            raise AMQPError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self._tx is None:
            self._tx = []
        self.send_method(commands.Tx.SelectOk())

    def _require_tx(self) -> list:
        if self._tx is None:
            raise AMQPError(PRECONDITION_FAILED, "channel is not transactional")
        return self._tx

    def _tx_commit(self, method) -> None:
        actions = self._require_tx()
        self._tx = []
        commit = _Commit(self)
        # On a node of several shards the commit waits until every queue has
        # its messages (another shard's queue gets them over a link), and
        # hears there whether it refused one.
        on_durable = commit if self.connection.broker.shards is not None else None
        for action in actions:
            if action[0] == "publish":
                waits, rejected = self._route(*action[1:], on_durable=on_durable)
                commit.waiting += waits
                commit.failed |= rejected
            else:
                self.settle(*action[1:])
        commit()

    def _committed(self, failed: bool) -> None:
        # Answered only by the channel still open under its number: one closed
        # (and maybe opened again) while its commit waited is answered nothing.
        if self.state is not OPEN or self.connection.channels.get(self.number) is not self:
            return
        if failed:
            # RabbitMQ's answer (rabbit_channel's complete_tx of a failed tx): what the
            # other queues took stays, the settlements stay applied, the channel closes.
            self.close_with(AMQPError(PRECONDITION_FAILED, "partial tx completion").at(TX_CLASS, TX_COMMIT))
            return
        barrier = self.connection.broker.durability_barrier
        if barrier is None:
            self.send_method(commands.Tx.CommitOk())
        else:  # a cluster's leader: once the in-sync followers hold what the commit wrote
            barrier(lambda: self.state is OPEN and self.send_method(commands.Tx.CommitOk()))

    def _tx_rollback(self, method) -> None:
        actions = self._require_tx()
        self._tx = []
        self.restore_unacked([a for a in actions if a[0] == "settle"])
        self.send_method(commands.Tx.RollbackOk())

    def defer_settlement(self, settled: list, outcome: str) -> bool:
        """In a transaction, keep acks/nacks/rejects for commit; True if kept."""
        if self._tx is None:
            return False
        self._tx.append(("settle", settled, outcome))
        return True

    def release(self) -> None:
        """Closing with an open transaction: its uncommitted settlements are
        void, so those deliveries are unacked again and requeued with the rest."""
        if self._tx:
            self.restore_unacked([a for a in self._tx if a[0] == "settle"])
            self._tx = []
        super().release()
