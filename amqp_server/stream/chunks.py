"""Records as the stream protocol delivers them: osiris chunks (PROTOCOL.adoc
"Deliver"; the chunk header is osiris's), and the sub-entry batches a
publisher may send, compressed or not.

A hutch log record is one message with one offset (vhosts.stream_records);
a chunk here is a run of consecutive offsets read together, so a client
numbers the entries of a chunk from its first offset, as with RabbitMQ.
Sub-entry batches are unpacked at publish, whatever their compression: each
message becomes a record of its own (and gets an offset of its own), which
AMQP 0-9-1 readers need; a stream-protocol reader gets them back as plain
entries.
"""
from __future__ import annotations

import struct
import zlib

import cramjam

_CHUNK_HEAD = struct.Struct(">BBHIqQQIIIBBBB")
MAGIC_VERSION = 0x51  # osiris: magic 5, chunk format version 1
USER_CHUNK = 0
_SIZE = struct.Struct(">I")
_DELIVER = struct.Struct(">IHHB")  # frame size, key, version, subscription id
_COMMITTED = struct.Struct(">Q")
DELIVER_KEY = 8
HEADER_BYTES = _DELIVER.size + _COMMITTED.size + _CHUNK_HEAD.size


def deliver_frame(subscription_id: int, first_offset: int, timestamp: int, messages: list[bytes],
                  committed: int | None = None) -> bytes:
    """A Deliver frame (version 2 when `committed`, the newest committed
    offset, is given) carrying `messages` as one chunk from `first_offset`."""
    data = b"".join(b for m in messages for b in (_SIZE.pack(len(m)), m))
    head = _CHUNK_HEAD.pack(MAGIC_VERSION, USER_CHUNK, len(messages), len(messages), timestamp, 1, first_offset,
                            zlib.crc32(data), len(data), 0, 0, 0, 0, 0)
    middle = b"" if committed is None else _COMMITTED.pack(committed)
    size = 5 + len(middle) + len(head) + len(data)
    return b"".join((_DELIVER.pack(size, DELIVER_KEY, 1 if committed is None else 2, subscription_id),
                     middle, head, data))


class BadBatch(ValueError):
    """A sub-entry batch that cannot be unpacked; `code` is the publish error's."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.code = code


NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)


# Decompressors of the sub-entry batch compression types, in the framings
# the stream clients write (the Java client's codecs, the Go client's alike):
# gzip (the standard library's zlib); Snappy's framing format (xerial's
# SnappyFramedOutputStream, golang/snappy's buffered writer), the LZ4 frame
# format (lz4-java's LZ4FrameOutputStream, pierrec/lz4) and zstd frames
# (zstd-jni, klauspost/compress), all three with cramjam (one small binding
# over Rust's snap and the reference LZ4 and zstd libraries). Each returns at most
# `limit` + 1 bytes, so a batch that inflates past its bound is refused
# without inflating all of it.
def _gunzip(data: bytes, uncompressed: int, limit: int) -> bytes:
    return zlib.decompressobj(wbits=31).decompress(data, limit + 1)


def _framed(module):
    """A cramjam codec, decoding into a buffer one byte larger than the
    size the publisher gave: more than that is an error, and is not decoded
    (cramjam streams into the buffer and stops when it is full)."""
    def decompress(data: bytes, uncompressed: int, limit: int) -> memoryview:
        out = bytearray(uncompressed + 1)
        length = module.decompress_into(data, out)
        if length > uncompressed:
            raise ValueError("more than the %d bytes its header gives" % uncompressed)
        return memoryview(out)[:length]
    return decompress


CODECS = {NONE: lambda data, uncompressed, limit: data, GZIP: _gunzip,
          SNAPPY: _framed(cramjam.snappy), LZ4: _framed(cramjam.lz4), ZSTD: _framed(cramjam.zstd)}


def unpack_batch(kind: int, count: int, uncompressed: int, data: bytes, limit: int,
                 unsupported_code: int, bad_code: int) -> list[bytes]:
    """The messages of a sub-entry batch (`kind`: its compression type)."""
    codec = CODECS.get(kind)
    if codec is None:
        raise BadBatch("compression type %d is not supported" % kind, unsupported_code)
    if uncompressed > limit or uncompressed < 0:
        raise BadBatch("a sub-entry batch of %d bytes uncompressed" % uncompressed, bad_code)
    try:
        plain = codec(data, uncompressed, limit)
    except Exception as exc:  # each library raises its own errors on corrupt input
        raise BadBatch("cannot decompress a sub-entry batch: %s" % exc, bad_code) from None
    if len(plain) > limit:
        raise BadBatch("a sub-entry batch of %d bytes uncompressed" % len(plain), bad_code)
    out = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(plain):
            raise BadBatch("a sub-entry batch ends inside a message", bad_code)
        (size,) = _SIZE.unpack_from(plain, pos)
        if pos + 4 + size > len(plain):
            raise BadBatch("a sub-entry batch ends inside a message", bad_code)
        out.append(bytes(plain[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return out
