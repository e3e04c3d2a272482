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

`chunks_python` (and its C twin, `_framing.stream_chunks`) is the consume
path's bulk step: the raw bytes of a run of log records (storage's record
framing around the log's head and a vhosts.stream_records payload) straight
to Deliver frames, checking each record's CRC, with no Python step per
record. It takes only what it can serve as is: stream-protocol records
(their message bytes go out untouched); it stops at anything else (a record
published over AMQP 0-9-1, which needs converting; a record that does not
check out) and says so, and the subscription reads that part the general way.
"""
from __future__ import annotations

import struct
import zlib

import cramjam

_CHUNK_HEAD = struct.Struct(">BBHIqQQIIIBBBB")
MAX_ENTRIES = 0xFFFF  # a chunk header counts its entries in a uint16
MAGIC_VERSION = 0x51  # osiris: magic 5, chunk format version 1
USER_CHUNK = 0
_SIZE = struct.Struct(">I")
_U16 = struct.Struct(">H")
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


# What stopped `chunks_python` (and its C twin)
STOP_END = 0  # the end of the bytes given (or a record cut short at their end): read on
STOP_LIMIT = 1  # a record at or past `limit` (not readable yet)
STOP_CREDIT = 2  # `max_chunks` chunks made
STOP_OTHER = 3  # a record that is not a stream-protocol message (it needs converting)
STOP_DAMAGED = 4  # a record that does not check out (length, CRC or end marker)

_RECORD = struct.Struct(">IQQ")  # storage.record's length, then the log's head: offset, timestamp (ms)
_RECORD_MIN = _RECORD.size + 5  # and the trailer: CRC-32 of the body, end marker


def chunks_python(data, start: int, limit: int, subscription_id: int, committed: int, max_bytes: int,
                  max_chunks: int) -> tuple[list[tuple[bytes, int, int]], int, int]:
    """Deliver frames of the records in `data` (log records, storage.record
    framing, from a record boundary) with offsets in [start, limit): runs of
    consecutive offsets, each at most `max_bytes` of entries (and
    MAX_ENTRIES), at most `max_chunks` of them; version 2 frames carrying
    `committed` unless it is negative. Returns ([(frame, first offset,
    records)], the offset after the last one delivered (`start` if none),
    the STOP_ reason)."""
    frames: list[tuple[bytes, int, int]] = []
    run: list = []  # [first offset, timestamp, messages, entry bytes]
    following, pos, size = start, 0, len(data)
    previous = -2
    stop = STOP_END
    version_committed = committed if committed >= 0 else None
    while pos + _RECORD_MIN <= size:
        length, offset, stamp = _RECORD.unpack_from(data, pos)
        end = pos + 9 + length
        if end > size:
            break
        if length < 16 or data[end - 1] != 0xFF or zlib.crc32(data[pos + 4:pos + 4 + length]) != _SIZE.unpack_from(
                data, end - 5)[0]:
            stop = STOP_DAMAGED
            break
        if offset < start:
            pos = end
            continue
        if offset >= limit:
            stop = STOP_LIMIT
            break
        payload, body_end = pos + 20, pos + 4 + length
        at = payload + 5 + _U16.unpack_from(data, payload + 3)[0] if body_end - payload >= 5 else body_end
        if data[payload] != 0xFF or data[payload + 1] != 0xFF or at >= body_end:
            stop = STOP_OTHER  # an AMQP 0-9-1 record (or a payload too short for the other layout)
            break
        at += 1 + data[at] + (8 if data[at] else 0)
        if at > body_end:
            stop = STOP_OTHER
            break
        message = bytes(data[at:body_end])
        if run and (offset != previous + 1 or run[3] + 4 + len(message) > max_bytes or len(run[2]) == MAX_ENTRIES):
            frames.append((deliver_frame(subscription_id, run[0], run[1], run[2], version_committed), run[0],
                           len(run[2])))
            run = []
        if not run:
            if len(frames) == max_chunks:
                stop = STOP_CREDIT
                break
            run = [offset, stamp, [], 0]
        run[2].append(message)
        run[3] += 4 + len(message)
        previous, following, pos = offset, offset + 1, end
    if run:
        frames.append((deliver_frame(subscription_id, run[0], run[1], run[2], version_committed), run[0], len(run[2])))
    return frames, following, stop


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
