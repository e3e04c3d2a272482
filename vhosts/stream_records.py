"""What a stream queue's log record holds (the payload `storage.stream_log`
frames): one message, published over AMQP 0-9-1 or over the stream
protocol, so one log serves both protocols (docs/streams.md, "One log, two
protocols").

Two layouts, told apart by the first uint16:
- AMQP 0-9-1 (`encode`): uint16 filter length (0..0xFFFE; 0: none), the
  filter value (x-stream-filter-value), then `Message.to_bytes()`.
- stream protocol (`amqp10_prefix`, then the message): 0xFFFF, uint8 format (1: AMQP 1.0),
  uint16 filter length, filter value, uint8 publisher reference length,
  the reference and, when it is not empty, the uint64 publishing id (what
  deduplication recovers, `publisher_of`), then the AMQP 1.0 message as the
  client published it.
The filter value comes first in both, so a filtering reader skips a record
without decoding its message. Records written before the second layout
existed had filter lengths up to 0xFFFF; one of exactly 0xFFFF (an AMQP
filter header of 64 KiB or more, truncated) would read as the second layout
and is the one case this cannot tell apart.
"""
from __future__ import annotations

import struct

from storage import Message
from vhosts import amqp10

FILTER_VALUE = "x-stream-filter-value"
EXTENDED = 0xFFFF
AMQP10 = 1
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_MAX_FILTER = 0xFFFE


def encode(message: Message) -> bytes:
    """A record of an AMQP 0-9-1 publish."""
    value = b""
    if FILTER_VALUE.encode() in message.header:  # decode the properties only when it may be there
        found = (message.headers or {}).get(FILTER_VALUE)
        if isinstance(found, (str, bytes)):
            value = (found.encode("utf-8") if isinstance(found, str) else found)[:_MAX_FILTER]
    return b"".join((_U16.pack(len(value)), value, message.to_bytes()))


def amqp10_prefix(filter_value: bytes, reference: bytes) -> bytes:
    """A stream-protocol record up to its publishing id (with a reference;
    then the uint64 id and the message follow) or its message (without): the
    same for every message a publisher sends with one filter value, so a
    publish computes it once."""
    filter_value = filter_value[:_MAX_FILTER]
    reference = reference[:255]
    return b"".join((_U16.pack(EXTENDED), bytes((AMQP10,)), _U16.pack(len(filter_value)), filter_value,
                     bytes((len(reference),)), reference))


def decode_filter(payload: bytes) -> tuple[bytes, int]:
    """A record's filter value and where the rest of it starts."""
    length = _U16.unpack_from(payload)[0]
    if length != EXTENDED:
        return payload[2:2 + length], 2 + length
    length = _U16.unpack_from(payload, 3)[0]
    return payload[5:5 + length], 5 + length


def is_amqp10(payload: bytes) -> bool:
    return payload[0] == 0xFF and payload[1] == 0xFF


def _amqp10_at(payload: bytes, at: int) -> int:
    """Where a stream-protocol record's message starts (`at`: after its filter)."""
    length = payload[at]
    return at + 1 + length + (8 if length else 0)


def publisher_of(payload: bytes) -> tuple[bytes, int] | None:
    """(publisher reference, publishing id) of a stream-protocol record
    published by a named publisher, else None."""
    if not is_amqp10(payload):
        return None
    at = decode_filter(payload)[1]
    length = payload[at]
    if not length:
        return None
    return payload[at + 1:at + 1 + length], _U64.unpack_from(payload, at + 1 + length)[0]


def message_of(payload: bytes, at: int) -> Message:
    """The record's message in AMQP 0-9-1 form (`at` from `decode_filter`);
    a stream-protocol message is converted (exchange and routing key from its
    x-exchange and x-routing-key annotations, else empty, as RabbitMQ)."""
    if is_amqp10(payload):
        return amqp10.to_amqp091(payload[_amqp10_at(payload, at):])
    return Message.from_bytes(payload[at:])


def amqp10_of(payload: bytes, at: int) -> bytes:
    """The record's message in AMQP 1.0 form, for a stream-protocol reader:
    as published when it came over the stream protocol."""
    if is_amqp10(payload):
        return payload[_amqp10_at(payload, at):]
    return amqp10.from_amqp091(Message.from_bytes(payload[at:]))
