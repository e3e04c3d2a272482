"""A published message, kept as it arrived on the wire.

Invariant: `header` is the content-header frame payload exactly as the publisher
sent it (class id, weight, body size, property flags, property list); deliveries
send it back verbatim, so properties are decoded only when a feature needs them
(`properties`, `headers`), and then once.
"""
from __future__ import annotations

import itertools
import os
import struct

from pamqp import commands, decode

_FLAGS = struct.Struct(">H")
_LONG = struct.Struct(">I")

# Property flag bits of basic's content header, in wire order.
_CONTENT_TYPE = 0x8000
_CONTENT_ENCODING = 0x4000
_HEADERS = 0x2000
_DELIVERY_MODE = 0x1000
_PRIORITY = 0x0800
# Offset of the first property-flags word: class-id(2) weight(2) body-size(8).
_FLAGS_AT = 12


_ID_PREFIX = os.urandom(8)
_id_counter = itertools.count()
_SHORT = struct.Struct(">B")
_SIGNED = struct.Struct(">i")


class Message:
    __slots__ = ("exchange", "routing_key", "header", "body", "_properties", "_msg_id")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._properties: commands.Basic.Properties | None = None
        self._msg_id: bytes | None = None

    @property
    def msg_id(self) -> bytes:
        """16 bytes naming this message in the message store, given on first
        use: one id however many queues keep the message (so one copy)."""
        if self._msg_id is None:
            self._msg_id = _ID_PREFIX + next(_id_counter).to_bytes(8, "big")
        return self._msg_id

    def to_bytes(self) -> bytes:
        """Serialized form kept on disk: exchange, routing key, content header, body."""
        exchange = self.exchange.encode("utf-8")
        routing_key = self.routing_key.encode("utf-8")
        return b"".join((
            _SHORT.pack(len(exchange)), exchange,
            _SHORT.pack(len(routing_key)), routing_key,
            _LONG.pack(len(self.header)), self.header,
            self.body,
        ))

    @classmethod
    def from_bytes(cls, data: bytes, msg_id: bytes | None = None) -> "Message":
        pos = 1 + data[0]
        exchange = data[1:pos].decode("utf-8")
        length = data[pos]
        routing_key = data[pos + 1:pos + 1 + length].decode("utf-8")
        pos += 1 + length
        (length,) = _LONG.unpack_from(data, pos)
        header = data[pos + 4:pos + 4 + length]
        message = cls(exchange, routing_key, header, data[pos + 4 + length:])
        message._msg_id = msg_id
        return message

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def has_headers(self) -> bool:
        return bool(_FLAGS.unpack_from(self.header, _FLAGS_AT)[0] & _HEADERS)

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            props = commands.Basic.Properties()
            flags, consumed = _property_flags(self.header)
            props.unmarshal(flags, self.header[_FLAGS_AT + consumed:])
            self._properties = props
        return self._properties

    @property
    def headers(self) -> dict | None:
        if not self.has_headers:
            return None
        return self.properties.headers

    def remove_header(self, name: str) -> None:
        """Drop one header (BCC must not reach consumers): the only case where
        the content header is not passed through as is. Only that table entry
        is cut out; every other byte (empty-string properties, the wire types
        of the other headers) stays as the publisher sent it, as in RabbitMQ."""
        props = self.properties
        if props.headers and name in props.headers:
            del props.headers[name]
            start, end = _headers_span(self.header)
            self.header = self.header[:start] + _table_without(self.header[start:end], name) + self.header[end:]

    def set_signed_header(self, name: str, value: int) -> None:
        """Give one header a signedint value (the delayed exchange's x-delay
        swap), every other entry of the table kept byte for byte. The
        message must have headers."""
        props = self.properties
        props.headers[name] = value
        start, end = _headers_span(self.header)
        key = name.encode("utf-8")
        entries = _table_without(self.header[start:end], name)[4:] + (
            _SHORT.pack(len(key)) + key + b"I" + _SIGNED.pack(value))
        self.header = self.header[:start] + _LONG.pack(len(entries)) + entries + self.header[end:]

    @property
    def persistent(self) -> bool:
        """delivery_mode == 2, read straight from the wire bytes."""
        return delivery_mode(self.header) == 2


def _property_flags(header: bytes) -> tuple[int, int]:
    """All property-flag words (bit 0 of a word says another follows)."""
    flags, index, offset = 0, 0, _FLAGS_AT
    while True:
        (word,) = _FLAGS.unpack_from(header, offset)
        offset += 2
        flags |= word << (index * 16)
        if not word & 1:
            return flags, offset - _FLAGS_AT
        index += 1


def _headers_offset(header: bytes) -> tuple[int, int]:
    """(property flags, offset of the headers table): the headers table comes
    after content_type and content_encoding, the only properties before it."""
    (flags,) = _FLAGS.unpack_from(header, _FLAGS_AT)
    offset = _FLAGS_AT + 2
    if flags & 1:  # a continuation word: rare, take the slow path
        flags, consumed = _property_flags(header)
        offset = _FLAGS_AT + consumed
    if flags & _CONTENT_TYPE:
        offset += 1 + header[offset]
    if flags & _CONTENT_ENCODING:
        offset += 1 + header[offset]
    return flags, offset


def _headers_span(header: bytes) -> tuple[int, int]:
    """Where the headers table (length prefix included) lies in a content
    header whose headers flag is set."""
    _flags, offset = _headers_offset(header)
    return offset, offset + 4 + _LONG.unpack_from(header, offset)[0]


def _table_without(table: bytes, name: str) -> bytes:
    """An encoded field table minus every entry named `name`, the others kept
    byte for byte."""
    key = name.encode("utf-8")
    kept = []
    pos, end = 4, len(table)
    while pos < end:
        start = pos
        pos += 1 + table[pos]
        entry_key = table[start + 1:pos]
        consumed, _ = decode.embedded_value(table[pos:end])
        pos += consumed
        if entry_key != key:
            kept.append(table[start:pos])
    entries = b"".join(kept)
    return _LONG.pack(len(entries)) + entries


def _past_headers(header: bytes) -> tuple[int, int]:
    """(property flags, offset of the first property after the headers table)."""
    flags, offset = _headers_offset(header)
    if flags & _HEADERS:
        offset += 4 + _LONG.unpack_from(header, offset)[0]
    return flags, offset


def delivery_mode(header: bytes) -> int:
    """The delivery_mode property without decoding the others (0 when absent)."""
    if not _FLAGS.unpack_from(header, _FLAGS_AT)[0] & _DELIVERY_MODE:
        return 0
    return header[_past_headers(header)[1]]


def priority(header: bytes) -> int:
    """The priority property without decoding the others (0 when absent)."""
    if not _FLAGS.unpack_from(header, _FLAGS_AT)[0] & _PRIORITY:
        return 0
    flags, offset = _past_headers(header)
    return header[offset + 1 if flags & _DELIVERY_MODE else offset]
