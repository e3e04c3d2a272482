"""amqp_server.amqp.fastpath must be byte-identical to pamqp (docs/architecture.md, "One message").

The oracle is pamqp itself: frames are marshalled and unmarshalled with
pamqp.frame and compared with the hand-written codecs. pamqp's constructors
validate exchange names against the spec's regex, which RabbitMQ does not
enforce, so the oracle classes below skip that validation (the encoding is
still pamqp's own).

On malformed input the fast decoders must raise (ValueError/IndexError, what
the channel turns into FRAME_ERROR) wherever pamqp fails, and otherwise agree
with `framing.decode_method` (pamqp plus RabbitMQ's "no truncated or
trailing bytes" rule).
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.body import ContentBody as Body
from pamqp import frame as pamqp_frame

from amqp_server.amqp import fastpath
from amqp_server.amqp.framing import decode_method
from vhosts.errors import AMQPError

MALFORMED = (ValueError, IndexError)  # UnicodeDecodeError is a ValueError


# No __slots__ here: pamqp marshals the attributes named in `self.__slots__`,
# which must stay the parent's.
class Deliver(commands.Basic.Deliver):
    def validate(self) -> None:  # RabbitMQ accepts any UTF-8 exchange name
        pass


class Publish(commands.Basic.Publish):
    def validate(self) -> None:
        pass


def _fit_shortstr(text: str) -> str:
    """Cut a string to at most 255 UTF-8 bytes without splitting a character."""
    return text.encode("utf-8")[:255].decode("utf-8", errors="ignore")


# Any unicode (including surrogate-free astral characters), 0..255 UTF-8 bytes,
# with the 255-byte boundary reached often.
shortstr = st.one_of(
    st.text(max_size=40),
    st.text(min_size=60, max_size=255).map(_fit_shortstr),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=255, max_size=300).map(_fit_shortstr),
    st.sampled_from(["", "amq.direct", "a" * 255, "é" * 127 + "a", "😀" * 63 + "abc"]),
)
delivery_tags = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 255, 256, 2**63, 2**64 - 1]))
channels = st.integers(0, 65535)


def _signed(tag: int) -> int:
    """pamqp encodes and decodes longlong as signed; the wire bytes of an
    unsigned delivery tag >= 2**63 are those of its two's complement."""
    return tag - 2**64 if tag >= 2**63 else tag


def _payload(frame: bytes) -> bytes:
    """Method frame -> payload (method id included)."""
    frame_type, _channel, size = struct.unpack_from(">BHI", frame)
    assert frame_type == 1 and frame[-1] == 0xCE and len(frame) == size + 8
    return frame[7:-1]


def _publish_payload(exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> bytes:
    method = Publish(exchange="", routing_key="", mandatory=mandatory, immediate=immediate)
    method.exchange = exchange
    method.routing_key = routing_key
    return _payload(pamqp_frame.marshal(method, 1))


# -- encoders ---------------------------------------------------------------


@given(channels, shortstr, delivery_tags, st.booleans(), shortstr, shortstr)
@example(0, "", 0, False, "", "")
@example(65535, "a" * 255, 2**64 - 1, True, "b" * 255, "c" * 255)
def test_deliver_frame_is_byte_identical_to_pamqp(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                                   routing_key):
    method = Deliver(consumer_tag=consumer_tag, delivery_tag=_signed(delivery_tag), redelivered=redelivered,
                     routing_key=routing_key)
    method.exchange = exchange
    expected = pamqp_frame.marshal(method, channel)
    got = fastpath.deliver_frame(channel, consumer_tag.encode(), delivery_tag, redelivered, exchange.encode(),
                                 routing_key.encode())
    assert got == expected


@given(channels, delivery_tags, st.booleans())
@example(0, 0, False)
@example(65535, 2**64 - 1, True)
def test_ack_frame_is_byte_identical_to_pamqp(channel, delivery_tag, multiple):
    expected = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=_signed(delivery_tag), multiple=multiple), channel)
    assert fastpath.ack_frame(channel, delivery_tag, multiple) == expected


@settings(max_examples=300)
@given(channels, shortstr, delivery_tags, st.booleans(), shortstr, shortstr, st.binary(min_size=14, max_size=60),
       st.binary(max_size=300), st.sampled_from([9, 10, 64, 4096, 131072]))
@example(65535, "a" * 255, 2**64 - 1, True, "b" * 255, "c" * 255, b"\x00" * 14, b"", 131072)
def test_a_whole_delivery_is_pamqp_frames_and_both_twins_agree(framing_c, channel, consumer_tag, delivery_tag,
                                                               redelivered, exchange, routing_key, header, body,
                                                               frame_max):
    args = (channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, header, body, frame_max)
    got = fastpath.deliver_python(*args)
    method = Deliver(consumer_tag=consumer_tag, delivery_tag=_signed(delivery_tag), redelivered=redelivered,
                     routing_key=routing_key)
    method.exchange = exchange
    chunk = frame_max - 8
    expected = b"".join([
        pamqp_frame.marshal(method, channel),
        struct.pack(">BHI", 2, channel, len(header)) + header + b"\xce",  # the header exactly as published
        *(pamqp_frame.marshal(Body(body[at:at + chunk]), channel) for at in range(0, len(body), chunk)),
    ])
    assert got == expected
    assert framing_c.deliver(*args) == got


def test_deliver_frame_round_trips_through_pamqp_unmarshal():
    frame = fastpath.deliver_frame(7, "ctag-é".encode(), 42, True, "ex.😀".encode(), "rk".encode())
    consumed, channel, method = pamqp_frame.unmarshal(frame)
    assert (consumed, channel) == (len(frame), 7)
    assert isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange, method.routing_key) == (
        "ctag-é", 42, True, "ex.😀", "rk")


# -- decoders on well-formed input --------------------------------------------


@given(shortstr, shortstr, st.booleans(), st.booleans())
@example("", "", False, False)
@example("x" * 255, "y" * 255, True, True)
def test_decode_publish_matches_pamqp(exchange, routing_key, mandatory, immediate):
    payload = _publish_payload(exchange, routing_key, mandatory, immediate)
    _, _, decoded = pamqp_frame.unmarshal(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    expected = (decoded.exchange, decoded.routing_key, decoded.mandatory, decoded.immediate)
    assert expected == (exchange, routing_key, mandatory, immediate)
    assert fastpath.decode_publish(payload) == expected


@given(delivery_tags, st.booleans())
@example(2**64 - 1, True)
def test_decode_ack_matches_pamqp(delivery_tag, multiple):
    frame = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=_signed(delivery_tag), multiple=multiple), 1)
    _, _, decoded = pamqp_frame.unmarshal(frame)
    assert fastpath.decode_ack(_payload(frame)) == (decoded.delivery_tag % 2**64, decoded.multiple) == (
        delivery_tag, multiple)


@given(st.integers(0, 255))
def test_decode_publish_ignores_ticket_and_unused_bits_like_pamqp(bits):
    payload = b"\x00\x3c\x00\x28" + b"\x12\x34" + b"\x01e" + b"\x02rk" + bytes((bits,))
    method = decode_method(payload)
    assert fastpath.decode_publish(payload) == (method.exchange, method.routing_key, method.mandatory,
                                                method.immediate) == ("e", "rk", bool(bits & 1), bool(bits & 2))


# -- decoders on malformed input -----------------------------------------------


def _pamqp_publish(payload: bytes):
    method = commands.Basic.Publish.__new__(commands.Basic.Publish)
    method.unmarshal(payload[4:])
    return method.exchange, method.routing_key, method.mandatory, method.immediate


def _pamqp_ack(payload: bytes):
    method = commands.Basic.Ack.__new__(commands.Basic.Ack)
    method.unmarshal(payload[4:])
    return method.delivery_tag % 2**64, method.multiple


def _check_against_oracles(fast, pamqp_decode, payload: bytes):
    """fast must raise wherever pamqp raises or hutch's strict decoder
    (pamqp + exact length) refuses, and agree with both otherwise."""
    try:
        expected = pamqp_decode(payload)
    except Exception:
        expected = None
    try:
        decode_method(payload)
        strict_ok = True
    except AMQPError as exc:
        assert exc.reply_code == 501
        strict_ok = False
    if expected is None or not strict_ok:
        with pytest.raises(MALFORMED):
            fast(payload)
    else:
        assert fast(payload) == expected


valid_publish_payloads = st.builds(_publish_payload, shortstr, shortstr, st.booleans(), st.booleans())


@settings(max_examples=300)
@given(st.one_of(
    st.binary(max_size=40).map(lambda tail: b"\x00\x3c\x00\x28" + tail),
    # a valid payload cut short anywhere, or with bytes added at the end
    st.tuples(valid_publish_payloads, st.integers(0, 600)).map(lambda t: t[0][:4 + t[1] % (len(t[0]) - 3)]),
    st.tuples(valid_publish_payloads, st.binary(min_size=1, max_size=4)).map(lambda t: t[0] + t[1]),
    # a valid payload with one byte changed (lengths, invalid UTF-8)
    st.tuples(valid_publish_payloads, st.integers(0, 10**6), st.integers(0, 255)).map(
        lambda t: t[0][:4 + t[1] % (len(t[0]) - 4)] + bytes((t[2],)) + t[0][5 + t[1] % (len(t[0]) - 4):]),
))
def test_decode_publish_malformed_raises_where_pamqp_would_fail(payload):
    _check_against_oracles(fastpath.decode_publish, _pamqp_publish, payload)


@pytest.mark.parametrize("payload", [
    b"\x00\x3c\x00\x28",  # no arguments at all
    b"\x00\x3c\x00\x28\x00\x00",  # ticket only
    b"\x00\x3c\x00\x28\x00\x00\x05abc",  # exchange cut short
    b"\x00\x3c\x00\x28\x00\x00\x00\x02rk",  # no bits octet
    b"\x00\x3c\x00\x28\x00\x00\x01\xff\x00\x00",  # exchange not UTF-8
    b"\x00\x3c\x00\x28\x00\x00\x00\x02\xc3\x28\x00",  # routing key not UTF-8
    b"\x00\x3c\x00\x28\x00\x00\x00\x00\x00\xff",  # trailing byte (RabbitMQ: cannot decode)
])
def test_decode_publish_malformed_examples(payload):
    with pytest.raises(MALFORMED):
        fastpath.decode_publish(payload)
    with pytest.raises(AMQPError) as info:
        decode_method(payload)
    assert info.value.reply_code == 501


@settings(max_examples=200)
@given(st.one_of(
    st.binary(max_size=20).map(lambda tail: b"\x00\x3c\x00\x50" + tail),
    st.tuples(delivery_tags, st.booleans(), st.integers(4, 12)).map(
        lambda t: fastpath.ack_frame(1, t[0], t[1])[7:-1][:t[2]]),
))
def test_decode_ack_malformed_raises_where_pamqp_would_fail(payload):
    _check_against_oracles(fastpath.decode_ack, _pamqp_ack, payload)


@pytest.mark.parametrize("size", range(4, 13))
def test_decode_ack_truncated_raises_value_error(size):
    payload = _payload(pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=2**63 - 1, multiple=True), 1))
    with pytest.raises(MALFORMED):
        fastpath.decode_ack(payload[:size])
