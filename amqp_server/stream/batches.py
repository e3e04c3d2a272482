"""A Publish frame's messages as log records in bulk: the publish path's
step for the common frame (version 1, plain entries, a publisher without a
reference), with no Python step per message.

`scan_python` checks the frame's entries and gathers their publishing ids
(already in the wire form a PublishConfirm carries them in); `records_python`
frames the messages as the stream's log records (storage.record framing
around the log's head, offset and timestamp, and the payload
vhosts.stream_records.amqp10_prefix starts) and finds the offset-index
entries due among them (the rule of storage.log_segment.Segment.note), for
storage.stream_log.StreamLog.append_run. Their C twins
(_framing.publish_scan, _framing.publish_records) give the same bytes
(tests/test_stream_chunks.py); the Python ones are the reference and run
where the C extension was not built.
"""
from __future__ import annotations

import struct
import zlib

from storage import record
from storage.log_segment import HEAD

_ENTRY = struct.Struct(">QI")  # publishing id, message size (top bit clear: not a sub-entry batch)
_LENGTH = struct.Struct(">I")
_TRAILER = struct.Struct(">IB")
OVERHEAD = record.OVERHEAD + HEAD.size  # framing and head of one record, besides its payload


def scan_python(data: bytes, pos: int, count: int) -> tuple[int, bytes] | None:
    """(bytes of the messages, their publishing ids as packed uint64s) of
    the `count` entries at `pos`, which must be plain entries ending exactly
    at the end of `data`; None otherwise (the caller reads them one by one)."""
    ids, total, size = [], 0, len(data)
    for _ in range(count):
        if pos + 12 > size or data[pos + 8] & 0x80:
            return None
        length = _LENGTH.unpack_from(data, pos + 8)[0]
        if pos + 12 + length > size:
            return None
        ids.append(data[pos:pos + 8])
        total += length
        pos += 12 + length
    return (total, b"".join(ids)) if pos == size else None


def records_python(data: bytes, pos: int, count: int, prefix: bytes, first: int, timestamp: int, since_index: int,
                   interval: int) -> tuple[bytes, list[tuple[int, int]], int]:
    """The records of the `count` entries at `pos` (checked by `scan`):
    each `prefix` + message, offsets from `first`; the index entries due
    [(offset, position in the bytes)] with `since_index` bytes since the
    last entry and one due every `interval` bytes; the bytes after the last."""
    out: list[bytes] = []
    entries: list[tuple[int, int]] = []
    position = 0
    for i in range(count):
        length = _LENGTH.unpack_from(data, pos + 8)[0]
        body = HEAD.pack(first + i, timestamp) + prefix + data[pos + 12:pos + 12 + length]
        framed = b"".join((_LENGTH.pack(len(body)), body, _TRAILER.pack(zlib.crc32(body), record.END_MARKER)))
        if since_index >= interval:
            entries.append((first + i, position))
            since_index = 0
        since_index += len(framed)
        out.append(framed)
        position += len(framed)
        pos += 12 + length
    return b"".join(out), entries, since_index
