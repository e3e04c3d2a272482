"""A published message, kept as it arrived on the wire.

Invariant: `header` is the content-header frame payload exactly as the publisher
sent it (class id, weight, body size, property flags, property list); deliveries
send it back verbatim, so properties are decoded only when a feature needs them
(`properties`, `headers`), and then once.
"""
from __future__ import annotations

import datetime
import itertools
import os
import struct

from pamqp import commands, decode, encode

_FLAGS = struct.Struct(">H")
_LONG = struct.Struct(">I")

# Property flag bits of basic's content header, in wire order.
_CONTENT_TYPE = 0x8000
_CONTENT_ENCODING = 0x4000
HEADERS = 0x2000
_DELIVERY_MODE = 0x1000
_PRIORITY = 0x0800
REPLY_TO = 0x0200
_EXPIRATION = 0x0100
# Where the expiration flag is in a content header (for hot paths that test it inline).
EXPIRATION_BYTE, EXPIRATION_BIT = 12, 0x01
# Offset of the first property-flags word: class-id(2) weight(2) body-size(8).
_FLAGS_AT = 12


_ID_PREFIX = os.urandom(8)
_id_counter = itertools.count()
_SHORT = struct.Struct(">B")
_SIGNED = struct.Struct(">i")
_LONGLONG = struct.Struct(">q")
_ULONGLONG = struct.Struct(">Q")
_EMPTY_TABLE = b"\x00\x00\x00\x00"


class MalformedProperties(ValueError):
    """A content header whose properties cannot be decoded (they are decoded
    lazily, when a feature first needs them)."""


class Message:
    __slots__ = ("exchange", "routing_key", "header", "body", "_properties", "_msg_id", "_persistent")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes,
                 msg_id: bytes | None = None) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._properties: commands.Basic.Properties | None = None
        self._msg_id = msg_id  # None: given on first use (msg_id)
        self._persistent: bool | None = None

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
        return cls(exchange, routing_key, header, data[pos + 4 + length:], msg_id)

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def has_headers(self) -> bool:
        return bool(_FLAGS.unpack_from(self.header, _FLAGS_AT)[0] & HEADERS)

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            props = commands.Basic.Properties()
            try:
                flags, consumed = _property_flags(self.header)
                props.unmarshal(flags, self.header[_FLAGS_AT + consumed:])
            except Exception as exc:
                raise MalformedProperties(str(exc)) from None
            self._properties = props
        return self._properties

    @property
    def headers(self) -> dict | None:
        if not self.has_headers:
            return None
        return self.properties.headers

    def headers_table(self) -> bytes | None:
        """The headers table as encoded by the publisher (length prefix
        included, wire types kept); None without headers."""
        if not self.has_headers:
            return None
        start, end = _headers_span(self.header)
        return self.header[start:end]

    def remove_header(self, name: str) -> None:
        """Drop one header (BCC must not reach consumers): the only case where
        the content header is not passed through as is. Only that table entry
        is cut out; every other byte (empty-string properties, the wire types
        of the other headers) stays as the publisher sent it, as in RabbitMQ."""
        props = self.properties
        if props.headers and name in props.headers:
            del props.headers[name]
            start, end = _headers_span(self.header)
            self.header = self.header[:start] + table_edit(self.header[start:end], {}, (name,)) + self.header[end:]

    def header_with(self, entries: dict[str, bytes], remove: tuple = (), drop_expiration: bool = False) -> bytes:
        """A content header like this message's, with the headers table
        entries `entries` (name -> encoded field value, see `encode_value`)
        set in place or appended, `remove` dropped, and the expiration
        property dropped when asked. Every other byte is kept as published;
        the message itself is not changed (it may be shared by queues)."""
        header = self.header
        if drop_expiration:
            flags, start, end = _property_span(header, _EXPIRATION)
            if flags & _EXPIRATION:
                header = _with_flags(header[:start] + header[end:], flags & ~_EXPIRATION)
        flags, start, end = _property_span(header, HEADERS)
        table = header[start:end] if flags & HEADERS else _EMPTY_TABLE
        table = table_edit(table, entries, remove)
        return _with_flags(header[:start] + table + header[end:], flags | HEADERS)

    @property
    def has_expiration(self) -> bool:
        """Whether the expiration property is set (one bit of the flags)."""
        return bool(self.header[EXPIRATION_BYTE] & EXPIRATION_BIT)

    @property
    def expiration(self) -> int | None:
        """The expiration property in ms (validated at publish), read straight
        from the wire bytes; None when absent."""
        flags, start, end = _property_span(self.header, _EXPIRATION)
        if not flags & _EXPIRATION:
            return None
        return int(self.header[start + 1:end])

    def set_signed_header(self, name: str, value: int) -> None:
        """Give one header a signedint value (the delayed exchange's x-delay
        swap), every other entry of the table kept byte for byte. The
        message must have headers."""
        props = self.properties
        props.headers[name] = value
        start, end = _headers_span(self.header)
        table = table_edit(self.header[start:end], {name: b"I" + _SIGNED.pack(value)})
        self.header = self.header[:start] + table + self.header[end:]

    @property
    def persistent(self) -> bool:
        """delivery_mode == 2, read straight from the wire bytes once (the
        header edits here never touch delivery_mode)."""
        if self._persistent is None:
            self._persistent = delivery_mode(self.header) == 2
        return self._persistent


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


def table_edit(table: bytes, entries: dict[str, bytes], remove: tuple = ()) -> bytes:
    """An encoded field table (length prefix included) with the entries named
    in `entries` set to their encoded values (in place when present, else
    appended) and those named in `remove` dropped; every other entry is kept
    byte for byte."""
    encoded = {name.encode("utf-8"): value for name, value in entries.items()}
    dropped = {name.encode("utf-8") for name in remove}
    kept = []
    pos, end = 4, len(table)
    while pos < end:
        start = pos
        pos += 1 + table[pos]
        entry_key = table[start + 1:pos]
        consumed, _ = decode.embedded_value(table[pos:end])
        pos += consumed
        if entry_key in dropped:
            continue
        value = encoded.pop(entry_key, None)
        kept.append(table[start:pos] if value is None else table[start:start + 1 + len(entry_key)] + value)
    for key, value in encoded.items():
        kept.append(_SHORT.pack(len(key)) + key + value)
    body = b"".join(kept)
    return _LONG.pack(len(body)) + body


def encode_value(value) -> bytes:
    """A field value as RabbitMQ writes the headers it adds: integers as
    long (l), datetimes as timestamp (T), strings as longstr (S)."""
    if isinstance(value, bool):
        return b"t" + bytes((value,))
    if isinstance(value, int):
        return b"l" + _LONGLONG.pack(value)
    if isinstance(value, (str, bytes)):
        raw = value.encode("utf-8") if isinstance(value, str) else value
        return b"S" + _LONG.pack(len(raw)) + raw
    if isinstance(value, datetime.datetime):
        return b"T" + _ULONGLONG.pack(int(value.timestamp()))
    if isinstance(value, list):
        body = b"".join(encode_value(v) for v in value)
        return b"A" + _LONG.pack(len(body)) + body
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    return encode.encode_table_value(value)


def encode_table(entries: dict) -> bytes:
    body = b"".join(_SHORT.pack(len(k.encode("utf-8"))) + k.encode("utf-8") + encode_value(v)
                    for k, v in entries.items())
    return _LONG.pack(len(body)) + body


# Basic properties of the first flags word in wire order, with how each is
# encoded: "s" shortstr, "t" table, "o" octet, "q" 64-bit timestamp.
_LAYOUT = ((0x8000, "s"), (0x4000, "s"), (0x2000, "t"), (0x1000, "o"), (0x0800, "o"), (0x0400, "s"),
           (0x0200, "s"), (0x0100, "s"), (0x0080, "s"), (0x0040, "q"), (0x0020, "s"), (0x0010, "s"),
           (0x0008, "s"), (0x0004, "s"))


def _property_span(header: bytes, bit: int) -> tuple[int, int, int]:
    """(first flags word, start, end) of the property `bit` in a content
    header; when absent, start == end is where it would be inserted."""
    (flags,) = _FLAGS.unpack_from(header, _FLAGS_AT)
    offset = _FLAGS_AT + 2
    if flags & 1:
        offset = _FLAGS_AT + _property_flags(header)[1]
    for flag, kind in _LAYOUT:
        if flag == bit:
            if not flags & flag:
                return flags, offset, offset
            break
        if flags & flag:
            offset += _property_size(header, offset, kind)
    return flags, offset, offset + _property_size(header, offset, _LAYOUT_KIND[bit])


_LAYOUT_KIND = dict(_LAYOUT)


def _property_size(header: bytes, offset: int, kind: str) -> int:
    if kind == "s":
        return 1 + header[offset]
    if kind == "t":
        return 4 + _LONG.unpack_from(header, offset)[0]
    return 1 if kind == "o" else 8


def _with_flags(header: bytes, flags: int) -> bytes:
    return header[:_FLAGS_AT] + _FLAGS.pack(flags) + header[_FLAGS_AT + 2:]


def _past_headers(header: bytes) -> tuple[int, int]:
    """(property flags, offset of the first property after the headers table)."""
    flags, offset = _headers_offset(header)
    if flags & HEADERS:
        offset += 4 + _LONG.unpack_from(header, offset)[0]
    return flags, offset


def reply_to(header: bytes) -> bytes | None:
    """The reply_to property's bytes without decoding the others (None when absent)."""
    flags, start, end = _property_span(header, REPLY_TO)
    return header[start + 1:end] if flags & REPLY_TO else None


def with_reply_to(header: bytes, value: bytes) -> bytes:
    """The content header with reply_to (which must be set) replaced by
    `value`; every other byte as published."""
    _flags, start, end = _property_span(header, REPLY_TO)
    return header[:start] + _SHORT.pack(len(value)) + value + header[end:]


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
