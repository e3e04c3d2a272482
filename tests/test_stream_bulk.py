"""The stream protocol's bulk steps and their C twins give the same bytes for
every input, and the same as the general paths:
- consume: amqp_server.stream.chunks.chunks_python and _framing.stream_chunks
  (hypothesis: runs of log records of both layouts, with gaps, a damaged
  record, a cut tail, any start, limit, frame size and credit); what they
  deliver is what the general path (records decoded one by one,
  vhosts.stream_records) makes of the same records;
- publish: amqp_server.stream.batches (scan, records) and
  _framing.publish_scan / publish_records (any Publish frame body, valid or
  not); the records are what StreamLog.append frames one by one, with the
  index entries Segment.note would make."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_server.stream import batches, chunks
from storage import record
from storage.log_segment import HEAD, INDEX_INTERVAL
from vhosts.stream_records import amqp10_of, amqp10_prefix, decode_filter

_ENTRY = struct.Struct(">I")
_ID = struct.Struct(">Q")


def stream_payload(message: bytes, filter_value: bytes, reference: bytes, publishing_id: int) -> bytes:
    return amqp10_prefix(filter_value, reference) + (_ID.pack(publishing_id) if reference else b"") + message


def amqp091_payload(body: bytes) -> bytes:
    return struct.pack(">H", 0) + body  # the AMQP 0-9-1 layout: no filter, then the message's bytes


records = st.lists(st.tuples(
    st.integers(0, 2),  # gap before this record
    st.binary(max_size=40),  # message
    st.sampled_from([b"", b"eu", b"x" * 300]),  # filter value
    st.sampled_from([b"", b"publisher-1"]),  # reference
    st.booleans(),  # published over AMQP 0-9-1 (rarely)
), max_size=40)


def log_bytes(items, base: int, amqp091_rate: bool) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    out, kept, offset = [], [], base
    for gap, message, filter_value, reference, amqp091 in items:
        offset += gap if gap == 2 else 0
        payload = amqp091_payload(message) if amqp091 and amqp091_rate else stream_payload(
            message, filter_value, reference, offset)
        stamp = 1_700_000_000_000 + offset
        out.append(record.encode(HEAD.pack(offset, stamp) + payload))
        kept.append((offset, stamp, payload))
        offset += 1
    return b"".join(out), kept


def messages_of(frame: bytes) -> tuple[int, list[bytes]]:
    """(first offset, messages) of one Deliver frame, checking its header."""
    size, key, version, _sub = struct.unpack_from(">IHHB", frame)
    assert size == len(frame) - 4 and key == chunks.DELIVER_KEY
    at = 9 + (8 if version == 2 else 0)
    head = struct.unpack_from(">BBHIqQQIIIBBBB", frame, at)
    count, first, data_len = head[2], head[6], head[8]
    data = frame[at + 48:]
    assert len(data) == data_len and head[3] == count
    out, pos = [], 0
    for _ in range(count):
        (length,) = _ENTRY.unpack_from(data, pos)
        out.append(data[pos + 4:pos + 4 + length])
        pos += 4 + length
    assert pos == data_len
    return first, out


@settings(max_examples=300, deadline=None)
@given(records, st.integers(0, 5), st.integers(0, 60), st.integers(0, 60), st.integers(1, 400), st.integers(0, 5),
       st.integers(-1, 100), st.booleans(), st.integers(0, 3))
def test_c_and_python_agree(framing_c, items, base, start_at, limit_at, max_bytes, max_chunks, committed, amqp091,
                            damage):
    data, kept = log_bytes(items, base, amqp091)
    if damage == 1 and kept:  # flip a byte in the middle
        data = bytearray(data)
        data[len(data) // 2] ^= 0x55
        data = bytes(data)
    elif damage == 2 and data:  # a tail cut short
        data = data[:-3]
    start, limit = base + start_at, base + limit_at
    args = (start, limit, 3, committed, max_bytes, max_chunks)
    assert framing_c.stream_chunks(data, *args) == chunks.chunks_python(data, *args)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(1, 2000), st.integers(1, 50))
def test_what_it_delivers_is_what_the_records_hold(items, max_bytes, max_chunks):
    """Undamaged stream-protocol records: the frames carry each record from
    `start` on in order, its message as the general path reads it
    (amqp10_of), chunks of consecutive offsets within the frame size."""
    data, kept = log_bytes(items, 7, amqp091_rate=False)
    frames, following, stop = chunks.chunks_python(data, 7, 10**9, 0, -1, max_bytes, max_chunks)
    delivered = []
    for frame, first, count in frames:
        offset, messages = messages_of(frame)
        assert offset == first and len(messages) == count
        assert sum(4 + len(m) for m in messages) <= max_bytes or count == 1
        delivered.extend((first + i, m) for i, m in enumerate(messages))
    expected = [(offset, amqp10_of(payload, decode_filter(payload)[1])) for offset, _stamp, payload in kept]
    assert delivered == expected[:len(delivered)]
    if stop == chunks.STOP_END:
        assert len(delivered) == len(expected)
    else:
        assert stop == chunks.STOP_CREDIT and len(frames) == max_chunks
    assert following == (delivered[-1][0] + 1 if delivered else 7)


entries = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=300)), max_size=30)


def publish_body(items) -> bytes:
    return b"".join(struct.pack(">QI", pid, len(m)) + m for pid, m in items)


@settings(max_examples=300, deadline=None)
@given(entries, st.integers(-2, 2), st.binary(max_size=3), st.integers(0, 5), st.booleans())
def test_publish_scan_c_and_python_agree(framing_c, items, miscount, tail, cut, sub_entry):
    body = b"\x00" * 3 + publish_body(items) + tail  # three bytes before the entries, as a frame has
    if cut:
        body = body[:-cut]
    if sub_entry and len(body) > 3 + 8:
        body = body[:3 + 8] + bytes([body[3 + 8] | 0x80]) + body[3 + 9:]
    count = max(len(items) + miscount, 0)
    assert framing_c.publish_scan(body, 3, count) == batches.scan_python(body, 3, count)


@settings(max_examples=300, deadline=None)
@given(entries, st.sampled_from([b"", b"\xff\xff\x01\x00\x00\x00"]), st.integers(0, 2**40),
       st.integers(0, 5000), st.sampled_from([INDEX_INTERVAL, 100]))
def test_publish_records_are_the_log_records(framing_c, items, prefix, first, since_index, interval):
    body = b"\x00" * 3 + publish_body(items)
    total, ids = batches.scan_python(body, 3, len(items))
    assert total == sum(len(m) for _pid, m in items)
    assert ids == b"".join(struct.pack(">Q", pid) for pid, _m in items)
    args = (body, 3, len(items), prefix, first, 1_700_000_000_000, since_index, interval)
    data, index, after = batches.records_python(*args)
    assert framing_c.publish_records(*args) == (data, index, after)
    framed = [record.encode(HEAD.pack(first + i, 1_700_000_000_000) + prefix + m) for i, (_pid, m) in enumerate(items)]
    assert data == b"".join(framed)
    assert len(data) == total + len(items) * (batches.OVERHEAD + len(prefix))
    expected, position, since = [], 0, since_index  # Segment.note's rule, record by record
    for i, one in enumerate(framed):
        if since >= interval:
            expected.append((first + i, position))
            since = 0
        since += len(one)
        position += len(one)
    assert (index, after) == (expected, since)
