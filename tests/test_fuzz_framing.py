"""Fuzzing the sans-IO frame reader and method decoder (hypothesis, bounded).

Whatever bytes arrive, in whatever chunks: the reader yields well-delimited
frames or raises AMQPError with 501 FRAME_ERROR, and the method decoder returns
a method or raises 501 / 503 COMMAND_INVALID; no other exception escapes.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from amqp_server.amqp.framing import CONTENT, FrameReader, content_header_prefix, decode_method
from vhosts.errors import AMQPError

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_session import valid_frames  # noqa: E402

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = b"".join(valid_frames())


def read_all(chunks: list[bytes], frame_max: int = 131072) -> tuple[list, AMQPError | None]:
    reader = FrameReader(frame_max)
    frames = []
    try:
        for chunk in chunks:
            reader.feed(chunk)
            while items := reader.scan(1 << 62):
                reader.consume(items[-1][-1])
                frames += [frame for item in items for frame in _frames(item)]
    except AMQPError as exc:
        return frames, exc
    return frames, None


def _frames(item: tuple) -> list:
    frame_type, channel, payload, header, body, _end = item
    if frame_type != CONTENT:
        return [(frame_type, channel, payload)]
    return [(1, channel, payload), (2, channel, header)] + ([(3, channel, body)] if body else [])


def mutated(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for position, value in edits:
        out[position % len(out)] = value
    return bytes(out)


def check_frames(frames: list) -> None:
    for frame_type, channel, payload in frames:
        assert frame_type in (1, 2, 3, 8)
        assert 0 <= channel <= 0xFFFF and isinstance(payload, bytes)
        if frame_type == 1:
            try:
                decode_method(payload)
            except AMQPError as exc:
                assert exc.reply_code in (501, 503), exc.reply_text
        elif frame_type == 2:
            try:
                content_header_prefix(payload)
            except AMQPError as exc:
                assert exc.reply_code == 501


@FUZZ
@given(st.binary(max_size=2000), st.integers(1, 64))
def test_random_bytes(data, chunk):
    frames, error = read_all([data[i:i + chunk] for i in range(0, len(data), chunk)])
    assert error is None or error.reply_code == 501
    check_frames(frames)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8),
       st.integers(1, 300))
def test_mutated_valid_stream(edits, chunk):
    data = mutated(VALID, edits)
    frames, error = read_all([data[i:i + chunk] for i in range(0, len(data), chunk)])
    assert error is None or error.reply_code == 501
    check_frames(frames)


@FUZZ
@given(st.integers(0, 255), st.binary(max_size=300))
def test_any_method_payload(class_byte, arguments):
    # a known class/method id with random arguments, and random ids
    for index in (0x000A000B, 0x0014000A, 0x0032000A, 0x003C0028, class_byte << 16 | 10):
        try:
            decode_method(struct.pack(">I", index) + arguments)
        except AMQPError as exc:
            assert exc.reply_code in (501, 503), exc.reply_text


@FUZZ
@given(st.integers(0, (1 << 32) - 1), st.integers(4096, 1 << 20))
def test_oversized_frame_refused_from_its_header(size, frame_max):
    frames, error = read_all([struct.pack(">BHI", 3, 1, size)], frame_max)
    assert frames == []
    if size + 8 > frame_max:
        assert error is not None and error.reply_code == 501 and "frame_too_large" in error.reply_text
    else:
        assert error is None


def test_the_valid_stream_reads_back_whole():
    frames, error = read_all([VALID[i:i + 7] for i in range(0, len(VALID), 7)])
    assert error is None
    assert len(frames) == len(valid_frames()) + 4  # each of the two contents is one item of three frames
    check_frames(frames)
