"""Sans-IO framing (amqp_server.amqp.framing): the frame reader fed whole, one byte
at a time, in random chunks and with trailing bytes; its 501 checks; the input
budget; splitting content into body frames; method decoding errors.

Frames are built here with struct (the wire format from the AMQP 0-9-1 spec,
section 4.2.3), not with the module under test.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp import frame as pamqp_frame

from amqp_server.amqp import framing
from amqp_server.amqp.framing import (
    CONTENT,
    FrameReader,
    content_frames,
    decode_method,
)
from vhosts.errors import AMQPError

FRAME_MAX = 4096
KNOWN_TYPES = (1, 2, 3, 8)
_PATTERN = bytes(range(256)) * 1100  # 281600 bytes


def encode(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


def payloads(frame_max: int = FRAME_MAX):
    """Mostly small payloads, sometimes up to the largest a frame may carry."""
    largest = frame_max - 8
    sizes = st.one_of(st.integers(0, 40), st.integers(0, largest), st.sampled_from([0, largest, largest - 1]))
    return st.tuples(sizes, st.integers(0, 255)).map(lambda t: _PATTERN[t[1]:t[1] + t[0]])


frames = st.tuples(st.sampled_from(KNOWN_TYPES), st.integers(0, 65535), payloads())
frame_lists = st.lists(frames, max_size=12)


def flatten(items: list) -> list:
    """Scanned items as the (frame_type, channel, payload) frames on the wire."""
    frames = []
    for frame_type, channel, payload, header, body, _end in items:
        if frame_type == CONTENT:
            frames += [(1, channel, payload[3]), (2, channel, header)] + ([(3, channel, body)] if body else [])
        else:
            frames.append((frame_type, channel, payload))
    return frames


def drain(reader: FrameReader, budget: int | None = None) -> list:
    """The frames one `scan` lists, consumed."""
    items = reader.scan(1 << 62 if budget is None else budget)
    if items:
        reader.consume(items[-1][-1])
    return flatten(items)


def read_until_error(reader: FrameReader) -> tuple[list, AMQPError]:
    got = []
    with pytest.raises(AMQPError) as info:
        while items := reader.scan(1 << 62):
            reader.consume(items[-1][-1])
            got += flatten(items)
    return got, info.value


# -- the stream, however it is cut --------------------------------------------


@given(frame_lists)
def test_whole_stream_yields_every_frame_in_order(items):
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items))
    assert drain(reader) == items
    assert reader.buffered == 0
    assert drain(reader) == []


@settings(max_examples=30)
@given(st.lists(st.tuples(st.sampled_from(KNOWN_TYPES), st.integers(0, 65535), st.binary(max_size=30)),
                max_size=6))
def test_one_byte_at_a_time(items):
    reader = FrameReader(FRAME_MAX)
    stream = b"".join(encode(*f) for f in items)
    got = []
    ends = set()
    position = 0
    for f in items:
        position += len(encode(*f))
        ends.add(position)
    for i in range(len(stream)):
        reader.feed(stream[i:i + 1])
        new = drain(reader)
        # a frame comes out exactly when its last byte (the frame end) arrives
        assert len(new) == (1 if i + 1 in ends else 0)
        got += new
    assert got == items
    assert reader.buffered == 0


@given(frame_lists, st.lists(st.integers(0, 10**6), max_size=20))
def test_random_chunking(items, cuts):
    stream = b"".join(encode(*f) for f in items)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader(FRAME_MAX)
    got = []
    for start, end in zip(points, points[1:]):
        reader.feed(stream[start:end])
        got += drain(reader)
        consumed = sum(len(encode(*f)) for f in got)
        assert reader.buffered == end - consumed
    assert got == items


@given(frame_lists, frames, st.integers(0, 10**6))
def test_trailing_partial_frame_is_kept(items, extra, cut):
    extra_bytes = encode(*extra)
    keep = cut % len(extra_bytes)  # 0 .. all but the frame-end octet
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items) + extra_bytes[:keep])
    assert drain(reader) == items
    assert reader.buffered == keep
    reader.feed(extra_bytes[keep:])
    assert drain(reader) == [extra]
    assert reader.buffered == 0


def test_payload_is_bytes_not_a_view_of_the_buffer():
    reader = FrameReader(FRAME_MAX)
    reader.feed(encode(1, 1, b"abc") + encode(3, 1, b"def")[:5])
    ((_, _, payload),) = drain(reader)
    reader.feed(b"more")
    assert type(payload) is bytes and payload == b"abc"


# -- frame-level errors (501) -------------------------------------------------


@given(st.integers(4096, 1 << 18), st.integers(1, 2**32), st.sampled_from(KNOWN_TYPES), st.integers(0, 65535))
@example(4096, 1, 1, 0)
@example(131072, 2**32 - 131072 + 7, 3, 1)
def test_oversized_frame_refused_from_its_header_alone(frame_max, over, frame_type, channel):
    size = frame_max - 8 + over
    assume(size < 2**32)
    header = struct.pack(">BHI", frame_type, channel, size)
    reader = FrameReader(frame_max)
    reader.feed(header[:6])
    assert drain(reader) == []
    reader.feed(header[6:])
    _, error = read_until_error(reader)
    assert error.reply_code == 501
    assert "frame_too_large" in error.reply_text


@given(st.integers(4096, 1 << 18))
def test_largest_allowed_frame_is_accepted(frame_max):
    payload = _PATTERN[:frame_max - 8]
    reader = FrameReader(frame_max)
    frame = encode(3, 1, payload)
    assert len(frame) == frame_max
    reader.feed(frame[:7])
    assert drain(reader) == []  # the header alone is not an error
    reader.feed(frame[7:])
    assert drain(reader) == [(3, 1, payload)]


@given(frame_lists, st.sampled_from(KNOWN_TYPES), st.binary(max_size=40), st.integers(0, 255))
def test_bad_frame_end_is_501_after_the_good_frames(items, frame_type, payload, end):
    assume(end != 0xCE)
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items) + encode(frame_type, 1, payload)[:-1] + bytes((end,)))
    got, error = read_until_error(reader)
    assert got == items
    assert error.reply_code == 501
    assert "invalid_frame_end_marker" in error.reply_text


@given(frame_lists, st.integers(0, 255).filter(lambda t: t not in KNOWN_TYPES), st.binary(max_size=40))
def test_unknown_frame_type_is_501_after_the_good_frames(items, frame_type, payload):
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items) + encode(frame_type, 0, payload))
    got, error = read_until_error(reader)
    assert got == items
    assert error.reply_code == 501
    assert "unknown_frame" in error.reply_text


# -- the input budget ----------------------------------------------------------


@given(st.lists(frames, min_size=1, max_size=12), st.integers(1, 3 * FRAME_MAX))
def test_budget_stops_early_and_the_rest_comes_next_call(items, budget):
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items))
    first = drain(reader, budget)
    # frames come out until the payload bytes yielded reach the budget
    expected_count, total = len(items), 0
    for i, (_, _, payload) in enumerate(items):
        total += len(payload)
        if total >= budget:
            expected_count = i + 1
            break
    assert first == items[:expected_count]
    assert reader.buffered == sum(len(encode(*f)) for f in items[expected_count:])
    rest = []
    while reader.buffered:
        chunk = drain(reader, budget)
        assert chunk  # every call makes progress
        rest += chunk
    assert first + rest == items


def test_budget_one_yields_one_non_empty_frame_per_call():
    items = [(1, 1, b"a"), (2, 1, b"bb"), (3, 1, b"ccc")]
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items))
    assert [drain(reader, 1) for _ in range(4)] == [[items[0]], [items[1]], [items[2]], []]


def test_scanned_frames_stay_until_consumed():
    items = [(1, 1, b"a"), (3, 2, b"b"), (8, 0, b"")]
    reader = FrameReader(FRAME_MAX)
    reader.feed(b"".join(encode(*f) for f in items))
    scanned = reader.scan(1 << 62)
    assert flatten(scanned) == items
    assert reader.scan(1 << 62) == scanned
    reader.consume(scanned[0][-1])
    assert drain(reader) == items[1:]


# -- a publish with its whole content is one item -----------------------------

PUBLISH = b"\x00\x3c\x00\x28\x00\x00\x00\x02rk\x00"  # basic.publish to "" with key "rk"


def content_header(body_size: int, class_id: int = 60) -> bytes:
    return struct.pack(">HHQH", class_id, 0, body_size, 0)


def test_publish_header_and_body_are_one_item():
    reader = FrameReader(FRAME_MAX)
    stream = encode(1, 5, PUBLISH) + encode(2, 5, content_header(3)) + encode(3, 5, b"abc") + encode(8, 0, b"")
    reader.feed(stream)
    items = reader.scan(1 << 62)
    assert items == [(CONTENT, 5, ("", "rk", False, PUBLISH), content_header(3), b"abc", len(stream) - 8),
                     (8, 0, b"", None, None, len(stream))]


def test_publish_of_an_empty_body_is_method_and_header():
    reader = FrameReader(FRAME_MAX)
    stream = encode(1, 5, PUBLISH) + encode(2, 5, content_header(0))
    reader.feed(stream)
    assert reader.scan(1 << 62) == [(CONTENT, 5, ("", "rk", False, PUBLISH), content_header(0), b"",
                                     len(stream))]


def publish_payload(exchange: bytes, routing_key: bytes, bits: int, ticket: int = 0) -> bytes:
    return (b"\x00\x3c\x00\x28" + struct.pack(">HB", ticket, len(exchange)) + exchange
            + bytes((len(routing_key),)) + routing_key + bytes((bits,)))


def test_publish_arguments_are_decoded_in_the_scan():
    method = publish_payload("é.x".encode(), b"a.b", 0x81, ticket=7)  # mandatory, an unused bit set
    reader = FrameReader(FRAME_MAX)
    reader.feed(encode(1, 5, method) + encode(2, 5, content_header(0)))
    assert reader.scan(1 << 62)[0][2] == ("é.x", "a.b", True, method)


@pytest.mark.parametrize("method", [
    pytest.param(publish_payload(b"", b"rk", 2), id="immediate"),
    pytest.param(publish_payload(b"\xff", b"rk", 0), id="exchange not UTF-8"),
    pytest.param(publish_payload(b"", b"\xed\xa0\x80", 0), id="routing key a surrogate"),
    pytest.param(publish_payload(b"", b"rk", 0) + b"\x00", id="trailing byte"),
    pytest.param(publish_payload(b"", b"rk", 0)[:-1], id="no bits"),
    pytest.param(b"\x00\x3c\x00\x28\x00\x00", id="cut short"),
])
def test_a_publish_that_is_not_plain_is_listed_frame_by_frame(method):
    reader = FrameReader(FRAME_MAX)
    reader.feed(encode(1, 5, method) + encode(2, 5, content_header(0)))
    assert [item[0] for item in reader.scan(1 << 62)] == [1, 2]


@pytest.mark.parametrize("rest", [
    pytest.param(encode(2, 5, content_header(6)) + encode(3, 5, b"abc") + encode(3, 5, b"def"), id="two body frames"),
    pytest.param(encode(2, 6, content_header(3)) + encode(3, 6, b"abc"), id="header on another channel"),
    pytest.param(encode(2, 5, content_header(3)) + encode(3, 6, b"abc"), id="body on another channel"),
    pytest.param(encode(2, 5, content_header(3, 50)) + encode(3, 5, b"abc"), id="not class basic"),
    pytest.param(encode(2, 5, content_header(3)[:13]) + encode(3, 5, b"abc"), id="header too short"),
    pytest.param(encode(1, 5, PUBLISH), id="no content"),
    pytest.param(encode(2, 5, content_header(3)) + encode(3, 5, b"abc")[:-1], id="body incomplete"),
    pytest.param(encode(2, 5, content_header(3)) + encode(3, 5, b"abc")[:-1] + b"\x00", id="bad body frame end"),
])
def test_anything_else_is_listed_frame_by_frame(rest):
    reader = FrameReader(FRAME_MAX)
    reader.feed(encode(1, 5, PUBLISH) + rest)
    items = reader.scan(1 << 62)
    assert items[0] == (1, 5, PUBLISH, None, None, len(encode(1, 5, PUBLISH)))
    assert all(item[0] != CONTENT for item in items)


names = st.one_of(st.text(max_size=6).map(lambda t: t.encode("utf-8")[:255]), st.binary(max_size=6))
# basic.publish payloads: mostly plain, sometimes immediate, not UTF-8, cut short or with trailing bytes.
publish_methods = st.one_of(
    st.just(PUBLISH),
    st.builds(publish_payload, names, names, st.integers(0, 255), st.integers(0, 65535)),
    st.builds(lambda m, cut: m[:cut], st.builds(publish_payload, names, names, st.integers(0, 3)), st.integers(0, 20)),
    st.builds(lambda m, extra: m + extra, st.builds(publish_payload, names, names, st.integers(0, 3)),
              st.binary(min_size=1, max_size=3)),
)


@st.composite
def wire_streams(draw):
    """Frames as a client sends them, publishes with content most of all, cut
    anywhere, sometimes damaged."""
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        channel = draw(st.sampled_from([0, 1, 2, 65535]))
        kind = draw(st.sampled_from(["publish", "publish", "frame", "header"]))
        if kind == "frame":
            parts.append(encode(*draw(frames)))
            continue
        body = draw(st.binary(max_size=40))
        declared = draw(st.sampled_from([len(body), len(body), 0, len(body) + 1]))
        parts.append(encode(1, channel, draw(publish_methods)))
        parts.append(encode(2, draw(st.sampled_from([channel, channel, 1])), content_header(declared)))
        if kind == "publish":
            for piece in draw(st.sampled_from([[body], [body], [body[:3], body[3:]]])):
                parts.append(encode(3, channel, piece))
    stream = b"".join(parts)
    if stream and draw(st.booleans()):
        at = draw(st.integers(0, len(stream) - 1))
        stream = stream[:at] + bytes((draw(st.integers(0, 255)),)) + stream[at + 1:]
    return stream[:draw(st.integers(0, len(stream)))]


@settings(max_examples=500, deadline=None)  # examples hold several frames; a loaded machine is slow
@given(wire_streams(), st.sampled_from([0, 40, 4096, 131072]), st.integers(1, 1 << 62))
def test_c_scan_lists_what_the_python_scan_lists(framing_c, stream, frame_max, budget):
    buf = bytearray(stream)
    assert framing_c.scan(buf, frame_max, budget) == framing._scan_python(buf, frame_max, budget)


# -- content frames -------------------------------------------------------------


def _parse(stream: bytes) -> list[tuple[int, int, bytes]]:
    out, pos = [], 0
    while pos < len(stream):
        frame_type, channel, size = struct.unpack_from(">BHI", stream, pos)
        assert stream[pos + 7 + size] == 0xCE
        out.append((frame_type, channel, stream[pos + 7:pos + 7 + size]))
        pos += 8 + size
    return out


@st.composite
def content_cases(draw):
    frame_max = draw(st.sampled_from([4096, 4097, 5000, 8192, 131072]))
    chunk = frame_max - 8
    size = draw(st.one_of(
        st.integers(0, 3 * chunk + 3),
        st.tuples(st.integers(0, 4), st.integers(-2, 2)).map(lambda t: max(0, t[0] * chunk + t[1])),
    ))
    start = draw(st.integers(0, 255))
    return frame_max, _PATTERN[start:start + size]


@given(content_cases(), st.integers(0, 65535), st.binary(min_size=14, max_size=60))
def test_content_frames_split_bodies_within_frame_max(case, channel, header):
    frame_max, body = case
    parts = content_frames(channel, header, body, frame_max)
    stream = b"".join(bytes(p) for p in parts)
    parsed = _parse(stream)
    assert parsed[0] == (2, channel, header)  # the header verbatim
    bodies = parsed[1:]
    chunk = frame_max - 8
    assert all(t == 3 and c == channel for t, c, _ in bodies)
    assert b"".join(p for _, _, p in bodies) == body
    assert len(bodies) == -(-len(body) // chunk)  # no empty body frame, none too many
    assert all(len(p) == chunk for _, _, p in bodies[:-1])
    assert all(0 < len(p) + 8 <= frame_max for _, _, p in bodies)
    # and the reader on the other side accepts them at that frame_max
    reader = FrameReader(frame_max)
    reader.feed(stream)
    assert drain(reader) == parsed


# -- method decoding ---------------------------------------------------------------

SAMPLE_METHODS = [
    commands.Connection.StartOk(client_properties={"product": "t", "capabilities": {"publisher_confirms": True}},
                                mechanism="PLAIN", response="\0guest\0guest", locale="en_US"),
    commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
    commands.Connection.Open(virtual_host="/"),
    commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
    commands.Connection.CloseOk(),
    commands.Channel.Open(),
    commands.Channel.Flow(active=True),
    commands.Channel.Close(reply_code=200, reply_text="ok", class_id=0, method_id=0),
    commands.Channel.CloseOk(),
    commands.Exchange.Declare(exchange="ex", exchange_type="topic", durable=True, arguments={"alternate-exchange": "x"}),
    commands.Exchange.Delete(exchange="ex", if_unused=True),
    commands.Exchange.Bind(destination="a", source="b", routing_key="k", arguments={"x": 1}),
    commands.Exchange.Unbind(destination="a", source="b", routing_key="k"),
    commands.Queue.Declare(queue="q", durable=True, exclusive=True, auto_delete=True, nowait=True,
                           arguments={"x-max-length": 10, "x-queue-type": "classic"}),
    commands.Queue.Bind(queue="q", exchange="ex", routing_key="rk", arguments={"x-match": "all"}),
    commands.Queue.Purge(queue="q"),
    commands.Queue.Delete(queue="q", if_unused=True, if_empty=True),
    commands.Queue.Unbind(queue="q", exchange="ex", routing_key="rk"),
    commands.Basic.Qos(prefetch_count=10, global_=True),
    commands.Basic.Consume(queue="q", consumer_tag="ctag", no_ack=True, exclusive=True, arguments={"x-priority": 3}),
    commands.Basic.Cancel(consumer_tag="ctag"),
    commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True),
    commands.Basic.Get(queue="q", no_ack=True),
    commands.Basic.Ack(delivery_tag=7, multiple=True),
    commands.Basic.Reject(delivery_tag=7, requeue=False),
    commands.Basic.Nack(delivery_tag=7, multiple=True, requeue=False),
    commands.Basic.Recover(requeue=True),
    commands.Tx.Select(),
    commands.Confirm.Select(nowait=True),
]


def _method_payload(method) -> bytes:
    return pamqp_frame.marshal(method, 1)[7:-1]


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
def test_decode_method_round_trips(method):
    decoded = decode_method(_method_payload(method))
    assert type(decoded) is type(method)
    assert {name: getattr(decoded, name) for name in method.__slots__} == {
        name: getattr(method, name) for name in method.__slots__}


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
def test_decode_method_truncated_is_501(method):
    payload = _method_payload(method)
    for size in range(4, len(payload)):
        with pytest.raises(AMQPError) as info:
            decode_method(payload[:size])
        assert info.value.reply_code == 501, size
        assert info.value.reply_text.startswith("FRAME_ERROR - cannot decode")


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
def test_decode_method_trailing_bytes_is_501(method):
    # RabbitMQ 3.10: "FRAME_ERROR - cannot decode <<...>>" for any extra octet
    with pytest.raises(AMQPError) as info:
        decode_method(_method_payload(method) + b"\x00")
    assert info.value.reply_code == 501


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\x00\x3c\x00"])
def test_decode_method_without_a_method_id_is_501(payload):
    with pytest.raises(AMQPError) as info:
        decode_method(payload)
    assert info.value.reply_code == 501


@given(st.integers(0, 2**32 - 1).filter(lambda i: i not in commands.INDEX_MAPPING), st.binary(max_size=20))
@example(0x003C0063, b"")  # basic, method 99
@example(0x03E70001, b"")  # class 999
def test_decode_method_unknown_method_is_503(index, arguments):
    with pytest.raises(AMQPError) as info:
        decode_method(struct.pack(">I", index) + arguments)
    assert info.value.reply_code == 503


@pytest.mark.parametrize("method_id", [0x003C0050, 0x003C005A, 0x003C0078], ids=["ack", "reject", "nack"])
@pytest.mark.parametrize("tag", [2**63 - 1, 2**63, 2**64 - 1])
def test_decode_method_delivery_tags_are_unsigned(method_id, tag):
    # RabbitMQ 3.10 answers basic.reject of 2**63+1 with "unknown delivery tag 9223372036854775809"
    method = decode_method(struct.pack(">IQB", method_id, tag, 1))
    assert method.delivery_tag == tag
