"""A published message, kept as it arrived on the wire.

Invariant: `header` is the content-header frame payload exactly as the publisher
sent it (class id, weight, body size, property flags, property list); deliveries
send it back verbatim, so properties are decoded only when a feature needs them
(`properties`, `headers`), and then once.
"""
from __future__ import annotations

import struct

from pamqp import commands

_FLAGS = struct.Struct(">H")
_LONG = struct.Struct(">I")
_BODY_SIZE = struct.Struct(">Q")

# Property flag bits of basic's content header, in wire order.
_CONTENT_TYPE = 0x8000
_CONTENT_ENCODING = 0x4000
_HEADERS = 0x2000
_DELIVERY_MODE = 0x1000
# Offset of the first property-flags word: class-id(2) weight(2) body-size(8).
_FLAGS_AT = 12


class Message:
    __slots__ = ("exchange", "routing_key", "header", "body", "_properties")

    def __init__(self, exchange: str, routing_key: str, header: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body
        self._properties: commands.Basic.Properties | None = None

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
        """Drop one header (BCC must not reach consumers); re-encodes the
        content header, the only case where it is not passed through as is."""
        props = self.properties
        if props.headers and name in props.headers:
            del props.headers[name]
            self.header = self.header[:_FLAGS_AT - 8] + _BODY_SIZE.pack(len(self.body)) + props.marshal()

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


def delivery_mode(header: bytes) -> int:
    """The delivery_mode property without decoding the others (0 when absent)."""
    (flags,) = _FLAGS.unpack_from(header, _FLAGS_AT)
    if not flags & _DELIVERY_MODE:
        return 0
    offset = _FLAGS_AT + 2
    if flags & 1:  # a continuation word: rare, take the slow path
        flags, consumed = _property_flags(header)
        offset = _FLAGS_AT + consumed
    if flags & _CONTENT_TYPE:
        offset += 1 + header[offset]
    if flags & _CONTENT_ENCODING:
        offset += 1 + header[offset]
    if flags & _HEADERS:
        offset += 4 + _LONG.unpack_from(header, offset)[0]
    return header[offset]
