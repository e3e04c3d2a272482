"""The firehose: RabbitMQ's message tracing (rabbitmqctl trace_on).

Theory of operation:
- While `vhost.tracing` is on, every message published in the vhost (by a
  channel, or through the management API) is copied to the vhost's
  `amq.rabbitmq.trace` topic exchange with routing key "publish.<exchange>",
  and every delivery (to a consumer, a basic.get, an API get) with
  "deliver.<queue>". Callers check `vhost.tracing` (one attribute) before
  calling in here, so tracing costs nothing when off. Who published or got
  it is an `Origin`: connection name, channel number, user name.
- A trace message has the original body and, as its only property, a
  headers table built as RabbitMQ's rabbit_trace builds it, in its order
  and with its field types: exchange_name, routing_keys (the routing key,
  CC and BCC), properties (the set basic properties, the original headers
  table copied byte for byte), node, then for a publish vhost, connection,
  channel, user, routed_queues, and for a delivery redelivered, vhost,
  connection, channel, user. It is transient and routed like any publish
  to the trace exchange (nowhere unless a queue is bound to it).
- Messages published to the trace exchange itself are never traced, so
  consuming trace messages cannot feed the firehose.
"""
from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

from storage import Message
from vhosts.exchange import TRACE_EXCHANGE

from vhosts.node import NODE

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# class basic (60), weight 0; then the body size and the property flags
_HEADER_START = struct.Struct(">HHQH")
_HEADERS_FLAG = 0x2000

# The basic properties in field order (the first is flag bit 15); RabbitMQ
# lists the ones present in the reverse order.
_FIELDS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id", "reply_to",
           "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id", "cluster_id")
_PROPERTY_ORDER = tuple((name, 1 << (15 - i)) for i, name in reversed(list(enumerate(_FIELDS))))
_NAMES = {"message_type": "type"}
_FLAGS = struct.Struct(">H")
_FLAGS_AT = 12


def _field(name: str, value: bytes) -> bytes:
    key = name.encode("utf-8")
    return bytes((len(key),)) + key + value


def _longstr(text: str) -> bytes:
    data = text.encode("utf-8")
    return b"S" + _U32.pack(len(data)) + data


def _signedint(number: int) -> bytes:
    if -2 ** 31 <= number < 2 ** 31:
        return b"I" + _I32.pack(number)
    return b"l" + _I64.pack(number)


def _table(fields: list[bytes]) -> bytes:
    data = b"".join(fields)
    return _U32.pack(len(data)) + data


def _array(texts) -> bytes:
    data = b"".join(_longstr(text) for text in texts)
    return b"A" + _U32.pack(len(data)) + data


def _properties(message: Message) -> bytes:
    props = message.properties
    (flags,) = _FLAGS.unpack_from(message.header, _FLAGS_AT)
    fields = []
    for attribute, flag in _PROPERTY_ORDER:
        if not flags & flag:
            continue
        value = getattr(props, attribute)
        name = _NAMES.get(attribute, attribute)
        if attribute == "headers":
            fields.append(_field(name, b"F" + message.headers_table()))
        elif isinstance(value, datetime.datetime):
            fields.append(_field(name, _signedint(int(value.replace(tzinfo=value.tzinfo or datetime.timezone.utc)
                                                           .timestamp()))))
        elif isinstance(value, int):
            fields.append(_field(name, _signedint(value)))
        else:
            fields.append(_field(name, _longstr(value)))
    return b"F" + _table(fields)


def _trace(vhost, message: Message, routing_keys: list[str], key: str, extra: list[bytes]) -> None:
    headers = _table([
        _field("exchange_name", _longstr(message.exchange)),
        _field("routing_keys", _array(routing_keys)),
        _field("properties", _properties(message)),
        _field("node", _longstr(NODE)),
        *extra,
    ])
    content = _HEADER_START.pack(60, 0, len(message.body), _HEADERS_FLAG) + headers
    traced = Message(TRACE_EXCHANGE, key, content, message.body)
    for queue in vhost.route(TRACE_EXCHANGE, [key], None):
        queue.publish(traced)


class Origin(NamedTuple):
    connection: str
    channel: int
    user: str


def channel_origin(channel) -> Origin:
    return Origin(channel.connection.name, channel.number, channel.connection.user.name)


def _origin(vhost, origin: Origin) -> list[bytes]:
    return [
        _field("vhost", _longstr(vhost.name)),
        _field("connection", _longstr(origin.connection)),
        _field("channel", _signedint(origin.channel)),
        _field("user", _longstr(origin.user)),
    ]


def published(vhost, origin: Origin, message: Message, routing_keys: list[str], headers: dict | None) -> None:
    """`message` published to the keys `routing_keys` (with CC and BCC)."""
    if message.exchange == TRACE_EXCHANGE:
        return
    routed = [queue.name for queue in vhost.route(message.exchange, routing_keys, headers)]
    _trace(vhost, message, routing_keys, "publish." + message.exchange,
           _origin(vhost, origin) + [_field("routed_queues", _array(routed))])


def _routing_keys(message: Message) -> list[str]:
    """A stored message's routing key and CC keys (BCC was removed when it
    was published, so unlike RabbitMQ's a delivery's trace lacks them)."""
    headers = message.headers
    cc = headers.get("CC") if headers else None
    return [message.routing_key] + ([key for key in cc if isinstance(key, str)] if isinstance(cc, list) else [])


def delivered(vhost, origin: Origin, queue, message: Message, redelivered: bool) -> None:
    """`message` of `queue` delivered (to a consumer or a get)."""
    if message.exchange == TRACE_EXCHANGE:
        return
    _trace(vhost, message, _routing_keys(message), "deliver." + queue.name,
           [_field("redelivered", _signedint(int(redelivered)))] + _origin(vhost, origin))
