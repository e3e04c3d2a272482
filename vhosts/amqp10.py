"""Messages in the AMQP 1.0 format (what the stream protocol carries and
RabbitMQ keeps in a stream) and their AMQP 0-9-1 form, mapped as RabbitMQ
3.13-4.x maps them (its mc_amqpl module; the table is in docs/streams.md).

The AMQP 1.0 type system is Apache Qpid Proton's (`proton.Message`): a
well-kept codec of the whole format, used here only where a message crosses
from one protocol to the other. A stream-protocol client reading a record
a stream-protocol client wrote gets its bytes as they were published, never
decoded.

Invariant: `to_amqp091(from_amqp091(m))` keeps a 0-9-1 message's body,
its properties and its headers of the types AMQP 1.0 application
properties can hold (strings, numbers, booleans, timestamps); x- headers
travel as message annotations; tables and arrays in non-x- headers are
dropped, as RabbitMQ drops them.
"""
from __future__ import annotations

import datetime
import decimal

import proton
from pamqp import commands, header

from storage.message import Message

# What proton always writes before the body of a message with no header
# fields and no properties set: an empty header and an empty properties list.
_EMPTY_SECTIONS = bytes.fromhex("0053704500537345")
_INTERNAL = ("x-basic-", "x-routing-key", "x-exchange")
_SIMPLE = (str, bool, int, float, datetime.datetime)


class NotAMessage(ValueError):
    """Bytes that do not decode as an AMQP 1.0 message."""


def decode(data: bytes) -> proton.Message:
    """The message in `data`; NotAMessage unless `data` is a sequence of
    whole AMQP 1.0 values, each a described section (Proton's Message.decode
    alone skips what it does not recognise, so arbitrary or cut bytes would
    "decode" as an empty message)."""
    if not data or data[0] != 0:
        raise NotAMessage("not an AMQP 1.0 message: it does not start with a described section")
    sections = proton.Data()
    position = 0
    try:
        while position < len(data):
            used = sections.decode(data[position:])
            if used <= 0:
                raise NotAMessage("not an AMQP 1.0 message")
            position += used
    except proton.DataException as exc:
        raise NotAMessage("not an AMQP 1.0 message: %s" % exc) from None
    message = proton.Message()
    try:
        message.decode(data)
    except Exception as exc:  # proton raises its own error types, and others on odd input
        raise NotAMessage(str(exc) or type(exc).__name__) from None
    return message


def to_amqp091(data: bytes, default_routing_key: str = "") -> Message:
    """A stream-protocol message as a hutch (AMQP 0-9-1) message. The
    protocol lets a client publish any bytes: what does not decode as an
    AMQP 1.0 message is delivered as the body, without properties."""
    try:
        return _to_amqp091(decode(data), default_routing_key)
    except (NotAMessage, ValueError, TypeError, OverflowError, KeyError):
        empty = commands.Basic.Properties()
        return Message("", default_routing_key, header.ContentHeader(0, len(data), empty).marshal(), bytes(data))


def _to_amqp091(m: proton.Message, default_routing_key: str) -> Message:
    annotations = {str(k): v for k, v in (m.annotations or {}).items()}
    headers: dict = {}
    for key, value in (m.properties or {}).items():
        if isinstance(key, str) and len(key.encode()) < 256:
            headers[key] = _value_091(value)
    for key, value in annotations.items():
        if key.startswith("x-") and not key.startswith(_INTERNAL) and len(key.encode()) < 256:
            headers[key] = _value_091(value)
    props = {}
    if m.durable:
        props["delivery_mode"] = 2
    if m.priority != 4:  # proton's default, what an absent header reads as
        props["priority"] = m.priority
    if m.ttl:
        props["expiration"] = str(int(round(m.ttl * 1000)))
    kind = annotations.get("x-basic-type")
    if isinstance(kind, str):
        props["message_type"] = kind
    message_id, correlation_id = _id_091(m.id), _id_091(m.correlation_id)
    if message_id is not None:
        props["message_id"] = message_id
    if correlation_id is not None:
        props["correlation_id"] = correlation_id
    user_id = m.user_id
    if user_id:
        try:
            props["user_id"] = bytes(user_id).decode("utf-8")
        except UnicodeDecodeError:
            pass  # RabbitMQ drops a user-id that is no short string
    if m.reply_to:
        reply_to = m.reply_to
        props["reply_to"] = reply_to[len("/queues/"):] if reply_to.startswith("/queues/") else reply_to
    if m.content_type:
        props["content_type"] = str(m.content_type)
    if m.content_encoding:
        props["content_encoding"] = str(m.content_encoding)
    if m.creation_time:
        props["timestamp"] = datetime.datetime.fromtimestamp(int(m.creation_time), datetime.timezone.utc)
    if m.group_id:
        props["app_id"] = m.group_id
    if headers:
        props["headers"] = headers
    body = m.body
    if isinstance(body, (bytes, memoryview)):
        body = bytes(body)
    elif body is None:
        body = b""
    else:
        # An amqp-value or amqp-sequence body: its AMQP encoding, typed as
        # RabbitMQ types it.
        body = _body_section(m)
        props["message_type"] = props.get("message_type", "amqp-1.0")
    exchange = annotations.get("x-exchange")
    routing_key = annotations.get("x-routing-key")
    properties = commands.Basic.Properties(**props)
    return Message(exchange if isinstance(exchange, str) else "",
                   routing_key if isinstance(routing_key, str) else default_routing_key,
                   header.ContentHeader(0, len(body), properties).marshal(), body)


def from_amqp091(message: Message) -> bytes:
    """A hutch (AMQP 0-9-1) message in the AMQP 1.0 format, as RabbitMQ
    stores an AMQP 0-9-1 publish in a stream. Properties Proton cannot
    encode (a header value of a type AMQP 1.0 lacks) leave the message with
    its body and routing annotations only, rather than undeliverable."""
    try:
        return _from_amqp091(message)
    except Exception:  # proton raises its own errors (and others) on values it cannot encode
        bare = proton.Message(body=message.body, inferred=True)
        bare.annotations = {proton.symbol("x-exchange"): message.exchange,
                            proton.symbol("x-routing-key"): message.routing_key}
        return bare.encode()


def _from_amqp091(message: Message) -> bytes:
    p = message.properties
    headers = p.headers or {}
    application = {}
    annotations = {proton.symbol("x-exchange"): message.exchange,
                   proton.symbol("x-routing-key"): message.routing_key}
    for key, value in headers.items():
        value = _value_10(value)
        if key.startswith("x-"):
            annotations[proton.symbol(key)] = value
        elif isinstance(value, _SIMPLE) or value is None:
            application[key] = value
    if p.message_type:
        annotations[proton.symbol("x-basic-type")] = p.message_type
    m = proton.Message(body=message.body, inferred=True)
    m.durable = p.delivery_mode == 2
    if p.priority is not None:
        m.priority = p.priority
    if p.expiration:
        try:
            m.ttl = int(p.expiration) / 1000
        except ValueError:
            pass
    if p.message_id:
        m.id = p.message_id
    if p.correlation_id:
        m.correlation_id = p.correlation_id
    if p.user_id:
        m.user_id = p.user_id.encode("utf-8")
    if p.reply_to:
        m.reply_to = "/queues/" + p.reply_to
    if p.content_type:
        m.content_type = p.content_type
    if p.content_encoding:
        m.content_encoding = p.content_encoding
    if p.timestamp:
        m.creation_time = p.timestamp.replace(tzinfo=p.timestamp.tzinfo or datetime.timezone.utc).timestamp()
    if p.app_id:
        m.group_id = p.app_id
    if application:
        m.properties = application
    m.annotations = annotations
    return m.encode()


def _body_section(m: proton.Message) -> bytes:
    bare = proton.Message(body=m.body, inferred=m.inferred)
    data = bare.encode()
    return data[len(_EMPTY_SECTIONS):] if data.startswith(_EMPTY_SECTIONS) else data


def _id_091(value) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _value_091(value):
    """An AMQP 1.0 value as a 0-9-1 field value."""
    if isinstance(value, proton.symbol):
        return str(value)
    if isinstance(value, (proton.char,)):
        return str(value)
    if isinstance(value, proton.timestamp):
        return datetime.datetime.fromtimestamp(int(value) / 1000, datetime.timezone.utc)
    if isinstance(value, (proton.ubyte, proton.ushort, proton.uint, proton.ulong, proton.byte, proton.short,
                          proton.int32)):
        return int(value)
    if isinstance(value, proton.float32):
        return float(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value)
    if isinstance(value, (decimal.Decimal,)):
        return value
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _value_091(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_value_091(v) for v in value]
    return str(value)


def _value_10(value):
    """A 0-9-1 field value as an AMQP 1.0 value."""
    if isinstance(value, datetime.datetime):
        stamp = value.replace(tzinfo=value.tzinfo or datetime.timezone.utc).timestamp()
        return proton.timestamp(int(stamp * 1000))
    if isinstance(value, dict):
        return {str(k): _value_10(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_value_10(v) for v in value]
    return value
