"""The stream protocol's wire format, sans IO: frames out of a byte stream,
fields out of a frame, frames out of fields (PROTOCOL.adoc "Types" and
"Frame Structure").

A frame is a uint32 size and that many bytes: uint16 key (top bit: a
response), uint16 version, then the command's fields. Integers are big
endian; a string is an int16 length (-1: null) and UTF-8 bytes; bytes an
int32 length (-1: null) and the bytes; an array an int32 count and its items.
`Fields` raises `Malformed` on anything that does not parse (short, negative
counts, bad UTF-8), which the connection answers as RabbitMQ does; nothing
here allocates more than the frame holds.
"""
from __future__ import annotations

import struct

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_HEAD = struct.Struct(">IHH")  # size, key, version


class Malformed(ValueError):
    """A frame whose fields do not parse."""


class FrameTooLarge(ValueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__("frame of %d bytes, larger than the %d negotiated" % (size, limit))
        self.size = size


class FrameReader:
    """Whole frames out of what the socket gave, in order."""

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max  # 0: no limit
        self._buffer = bytearray()

    def feed(self, data) -> None:
        self._buffer += data

    def frames(self):
        """Yield (key, version, payload after the header as bytes) per frame
        received whole; raise FrameTooLarge (and stop) on an oversized one."""
        buffer = self._buffer
        pos = 0
        try:
            while len(buffer) - pos >= 4:
                (size,) = _U32.unpack_from(buffer, pos)
                if size < 4:
                    raise Malformed("a frame of %d bytes has no key and version" % size)
                if self.frame_max and size + 4 > self.frame_max:
                    raise FrameTooLarge(size + 4, self.frame_max)
                if len(buffer) - pos - 4 < size:
                    break
                key, version = _U16.unpack_from(buffer, pos + 4)[0], _U16.unpack_from(buffer, pos + 6)[0]
                payload = bytes(buffer[pos + 8:pos + 4 + size])
                pos += 4 + size
                yield key, version, payload
        finally:
            del buffer[:pos]

    @property
    def pending(self) -> int:
        return len(self._buffer)


class Fields:
    """A cursor over one frame's fields."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _take(self, fmt: struct.Struct):
        try:
            (value,) = fmt.unpack_from(self.data, self.pos)
        except struct.error:
            raise Malformed("frame ends inside a field") from None
        self.pos += fmt.size
        return value

    def u8(self) -> int:
        return self._take(_U8)

    def u16(self) -> int:
        return self._take(_U16)

    def i16(self) -> int:
        return self._take(_I16)

    def u32(self) -> int:
        return self._take(_U32)

    def i32(self) -> int:
        return self._take(_I32)

    def u64(self) -> int:
        return self._take(_U64)

    def i64(self) -> int:
        return self._take(_I64)

    def raw(self, length: int) -> bytes:
        if length < 0 or self.pos + length > len(self.data):
            raise Malformed("frame ends inside a field")
        value = self.data[self.pos:self.pos + length]
        self.pos += length
        return value

    def string(self) -> str | None:
        length = self.i16()
        if length == -1:
            return None
        try:
            return self.raw(length).decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed("a string is not UTF-8") from None

    def text(self) -> str:
        """A string that must not be null."""
        value = self.string()
        if value is None:
            raise Malformed("a null string where a value is required")
        return value

    def bytes_(self) -> bytes | None:
        length = self.i32()
        return None if length == -1 else self.raw(length)

    def count(self, item_size: int = 1) -> int:
        """An array's count, checked against what is left (each item at least `item_size` bytes)."""
        n = self.i32()
        if n < 0 or n * item_size > len(self.data) - self.pos:
            raise Malformed("array count %d beyond the frame" % n)
        return n

    def strings(self) -> list[str]:
        return [self.text() for _ in range(self.count(2))]

    def string_map(self) -> dict[str, str]:
        out = {}
        for _ in range(self.count(4)):
            key = self.text()
            out[key] = self.string() or ""
        return out

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def end(self) -> None:
        if self.pos != len(self.data):
            raise Malformed("%d bytes after the last field" % (len(self.data) - self.pos))


# -- encoding ---------------------------------------------------------------

def u8(v: int) -> bytes:
    return _U8.pack(v)


def u16(v: int) -> bytes:
    return _U16.pack(v)


def u32(v: int) -> bytes:
    return _U32.pack(v)


def i32(v: int) -> bytes:
    return _I32.pack(v)


def u64(v: int) -> bytes:
    return _U64.pack(v)


def i64(v: int) -> bytes:
    return _I64.pack(v)


def string(v: str | None) -> bytes:
    if v is None:
        return _I16.pack(-1)
    data = v.encode("utf-8")
    return _U16.pack(len(data)) + data


def bytes_(v: bytes | None) -> bytes:
    return _I32.pack(-1) if v is None else _I32.pack(len(v)) + v


def array(items: list[bytes]) -> bytes:
    return _I32.pack(len(items)) + b"".join(items)


def string_map(entries: dict[str, str]) -> bytes:
    return array([string(k) + string(v) for k, v in entries.items()])


def frame(key: int, version: int, *fields: bytes) -> bytes:
    body = b"".join(fields)
    return _HEAD.pack(len(body) + 4, key, version) + body


def response(key: int, correlation_id: int, code: int, *fields: bytes, version: int = 1) -> bytes:
    """A request's response: the key with the response bit, its correlation id and code."""
    return frame(key | 0x8000, version, _U32.pack(correlation_id), _U16.pack(code), *fields)
