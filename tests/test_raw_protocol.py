"""Protocol edge cases over a raw socket: the protocol header, malformed and
unexpected frames, closing handshakes, and byte-stream framing.

The expected reply codes and texts are RabbitMQ 3.10's, observed with the same
frames. After every test a fresh client must still be able to connect, publish
and get (the `still_serving` fixture).
"""
from __future__ import annotations

import socket
import struct

import pytest
from pamqp import body, commands, frame, header

from amqp_raw import (
    EOF,
    PROTOCOL_HEADER,
    TIMEOUT,
    RawClient,
    method_frame_bytes,
    plain_response,
    raw_frame_bytes,
    start_ok_frame,
)
from helpers import connect, unique, wait_for

pytestmark = pytest.mark.usefixtures("still_serving")


def close_info(close) -> tuple:
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def barrier(client: RawClient, channel: int = 2) -> list:
    """Open `channel`, run a synchronous method on it and return every other
    frame that arrived before its reply. Frames are handled in order, so this
    proves nothing was answered to what was sent before it."""
    client.send_frames(
        (channel, commands.Channel.Open()),
        (channel, commands.Queue.Declare(queue="", exclusive=True)),
    )
    others = []
    while True:
        number, value = client.read_frame()
        if number == channel and isinstance(value, commands.Queue.DeclareOk):
            return others
        if not (number == channel and isinstance(value, commands.Channel.OpenOk)):
            others.append((number, value))


def publish_frames(channel: int, routing_key: str, payload: bytes, exchange: str = "") -> list:
    return [
        (channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key)),
        (channel, header.ContentHeader(body_size=len(payload))),
        (channel, body.ContentBody(payload)),
    ]


# -- protocol header ------------------------------------------------------------


def read_all(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, str]:
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return data, "reset"
        except socket.timeout:
            return data, "open"
        if not chunk:
            return data, "eof"
        data += chunk


@pytest.mark.parametrize(
    "sent",
    [
        b"AMQP\x00\x00\x08\x00",  # AMQP 0-8
        b"AMQP\x01\x01\x00\x0a",  # AMQP 0-10 (as RabbitMQ 0-10 clients send it)
        b"AMQP\x00\x00\x09\x00",  # 0-9 without the revision
        b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
        b"HTTP/1.1",
    ],
)
def test_unsupported_protocol_header_gets_ours_back_then_close(broker, sent):
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(sent)
        data, end = read_all(sock)
    assert data == PROTOCOL_HEADER
    assert end in ("eof", "reset")


def test_protocol_header_may_arrive_in_pieces(raw):
    raw.send(PROTOCOL_HEADER[:4])
    assert raw.is_open(0.2) and raw.buf == b""  # nothing said yet, still waiting
    raw.send(PROTOCOL_HEADER[4:])
    start = raw.expect(commands.Connection.Start, 0)
    assert (start.version_major, start.version_minor) == (0, 9)


def test_frames_right_behind_the_header_in_the_same_write(raw):
    raw.send(PROTOCOL_HEADER + start_ok_frame("PLAIN", plain_response("guest", "guest")))
    raw.expect(commands.Connection.Start, 0)
    raw.expect(commands.Connection.Tune, 0)


# -- malformed and unexpected frames: each closes the connection -------------------


CONTENT_HEADER = header.ContentHeader(body_size=3)
HEADER_ON_CHANNEL_0 = raw_frame_bytes(2, 0, CONTENT_HEADER.marshal())

# Errors after which the byte stream can no longer be followed: the server
# sends Connection.Close and stops reading (as RabbitMQ), closing the socket
# itself after its Close-Ok timeout (3 s).
STREAM_ERRORS = {
    "bad frame end": (
        b"\x01\x00\x00\x00\x00\x00\x04abcd\x00",
        (501, 'FRAME_ERROR - type 1, all octets = <<"abcd">>: {invalid_frame_end_marker,0}', 0, 0),
    ),
    "garbage": (
        b"\x00garbage-garbage-garbage",
        (501, "FRAME_ERROR - type 0, all octets = <<>>: {frame_too_large,1919050087,131064}", 0, 0),
    ),
    "oversized frame, header only": (
        struct.pack(">BHI", 1, 0, 200000),  # 7 bytes: refused before any payload
        (501, "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,200000,131064}", 0, 0),
    ),
}


@pytest.mark.parametrize("sent, expected", STREAM_ERRORS.values(), ids=STREAM_ERRORS.keys())
def test_stream_error(raw, sent, expected):
    raw.handshake()
    raw.send(sent)
    close = raw.expect_connection_close(closed_within=None)
    assert close_info(close) == expected


def test_server_closes_the_socket_if_close_ok_never_comes(raw):
    """Within the negotiated heartbeat (RabbitMQ's rule; 30 s without one,
    test_closing_timeout_is_a_setting)."""
    raw.handshake(heartbeat=1)
    raw.send(b"\x01\x00\x00\x00\x00\x00\x04abcd\x00")
    _, close = raw.read_frame()
    assert close.reply_code == 501
    raw.wait_closed(6.0)


# Errors in well-formed frames: Connection.Close, then the client's Close-Ok
# is read and the socket closed at once.
# (opened channel 1 first?, bytes sent, expected Connection.Close)
CONNECTION_ERRORS = {
    "unknown frame type": (
        False,
        b"\x09\x00\x00\x00\x00\x00\x01a\xce",
        (501, 'FRAME_ERROR - type 9, all octets = <<"a">>: unknown_frame', 0, 0),
    ),
    "truncated arguments": (
        True,
        method_frame_bytes(50, 10, b"\x00\x00", channel=1),  # queue.declare cut after 'ticket'
        (501, "FRAME_ERROR - cannot decode <<0,0>>", 50, 10),
    ),
    "method on an unopened channel": (
        False,
        method_frame_bytes(50, 10, commands.Queue.Declare(queue="x").marshal(), channel=3),
        (504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10),
    ),
    "second channel.open": (
        True,
        method_frame_bytes(20, 10, b"\x00", channel=1),
        (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10),
    ),
    "content header without publish": (
        True,
        raw_frame_bytes(2, 1, CONTENT_HEADER.marshal()),
        (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ),
    "content body without publish": (
        True,
        raw_frame_bytes(3, 1, b"abc"),
        (505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    ),
    "method while content expected": (
        True,
        b"".join([
            method_frame_bytes(60, 40, commands.Basic.Publish(routing_key="x").marshal(), channel=1),
            method_frame_bytes(50, 10, commands.Queue.Declare(queue="x").marshal(), channel=1),
        ]),
        (505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead",
         60, 40),
    ),
    "connection method on channel 1": (
        True,
        method_frame_bytes(10, 40, commands.Connection.Open().marshal(), channel=1),
        (503, "COMMAND_INVALID - unimplemented method", 10, 40),
    ),
    "server method from the client": (
        True,
        method_frame_bytes(20, 11, commands.Channel.OpenOk().marshal(), channel=1),
        (503, "COMMAND_INVALID - unimplemented method", 20, 11),
    ),
    "channel.close-ok on an open channel": (
        True,
        method_frame_bytes(20, 41, b"", channel=1),
        (503, "COMMAND_INVALID - unimplemented method", 20, 41),
    ),
    "queue method on channel 0": (
        False,
        method_frame_bytes(50, 10, commands.Queue.Declare(queue="x").marshal(), channel=0),
        (504, "CHANNEL_ERROR - unexpected method in connection state running", 50, 10),
    ),
    "second connection.open": (
        False,
        method_frame_bytes(10, 40, commands.Connection.Open().marshal(), channel=0),
        (504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 40),
    ),
    "heartbeat on channel 1": (
        True,
        raw_frame_bytes(8, 1, b""),
        (505, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0),
    ),
    "content header on channel 0": (
        False,
        HEADER_ON_CHANNEL_0,
        (505, "UNEXPECTED_FRAME - type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,3,0,0>>", 0, 0),
    ),
}


@pytest.mark.parametrize("opened, sent, expected", CONNECTION_ERRORS.values(), ids=CONNECTION_ERRORS.keys())
def test_connection_error(raw, opened, sent, expected):
    raw.handshake()
    if opened:
        raw.open_channel(1)
    raw.send(sent)
    close = raw.expect_connection_close()  # answers Close-Ok, EOF within 2 s
    assert close_info(close) == expected


def test_frame_larger_than_a_lowered_frame_max_is_a_frame_error(raw):
    raw.handshake(frame_max=4096)
    raw.open_channel(1)
    raw.send_frames(
        (1, commands.Basic.Publish(routing_key=unique("q"))),
        (1, header.ContentHeader(body_size=5000)),
        (1, body.ContentBody(b"a" * 5000)),
    )
    close = raw.expect_connection_close(closed_within=None)
    assert close_info(close) == (501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}", 0, 0)


def test_deliveries_respect_the_frame_max_the_client_lowered(raw):
    queue = unique("q")
    payload = bytes(range(256)) * 40  # 10240 bytes: three body frames at frame_max 4096
    raw.handshake(frame_max=4096)
    raw.open_channel(1)
    chunks = [payload[i:i + 4088] for i in range(0, len(payload), 4088)]
    raw.send_frames(
        (1, commands.Queue.Declare(queue=queue, exclusive=True)),
        (1, commands.Basic.Publish(routing_key=queue)),
        (1, header.ContentHeader(body_size=len(payload))),
        *[(1, body.ContentBody(chunk)) for chunk in chunks],
        (1, commands.Basic.Get(queue=queue, no_ack=True)),
    )
    raw.expect(commands.Queue.DeclareOk, 1)
    raw.expect(commands.Basic.GetOk, 1)
    raw.expect(header.ContentHeader, 1)
    received, sizes = b"", []
    while len(received) < len(payload):
        received += raw.expect(body.ContentBody, 1).value
        sizes.append(raw.last_frame_size)
    assert received == payload
    assert sizes == [4096, 4096, len(payload) - 2 * 4088 + 8]


# -- after the server sent Connection.Close ----------------------------------------------


def test_after_connection_close_everything_but_close_ok_is_ignored(raw):
    raw.handshake()
    raw.open_channel(1)
    raw.send_frame(commands.Channel.Open(), 1)  # a 504
    close = raw.read_frame()[1]
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 504
    raw.send_frames(
        (1, commands.Queue.Declare(queue=unique("q"))),
        (5, commands.Channel.Open()),
        (0, commands.Connection.Open()),
        (0, commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0)),
    )
    assert raw.collect(0.3) == [TIMEOUT]  # no reply to any of them, socket still open
    raw.send_frame(commands.Connection.CloseOk())
    assert raw.collect(2.0) == [EOF]


def test_client_close_while_server_closing_gets_close_ok(raw):
    raw.handshake()
    raw.send(b"\x09\x00\x00\x00\x00\x00\x01a\xce")  # unknown frame type: 501
    close = raw.read_frame()[1]
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 501
    raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    raw.expect(commands.Connection.CloseOk, 0)


# -- closing: the client closes the socket, within a timeout -----------------------------------


def _client_close(client: RawClient) -> None:
    client.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    client.expect(commands.Connection.CloseOk, 0)


def test_after_close_ok_the_socket_waits_for_the_client(raw):
    """As RabbitMQ: Close-Ok, then the client closes the socket (a broker
    that closed first would race the client's own close); what the client
    still sends is read and discarded."""
    raw.handshake()
    raw.open_channel(1)
    _client_close(raw)
    raw.send_frame(commands.Queue.Declare(queue=unique("q")), 1)
    raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="again", class_id=0, method_id=0))
    raw.expect(commands.Connection.CloseOk, 0)  # RabbitMQ answers a Close while closed, too
    assert raw.collect(0.5) == [TIMEOUT]  # nothing else, socket still open
    raw.send_frame(commands.Connection.CloseOk())  # a Close-Ok ends the wait
    raw.wait_closed(2.0)


def test_a_client_that_never_closes_is_disconnected_after_its_heartbeat(raw):
    """RabbitMQ's timeout: the negotiated heartbeat when it is under 30 s."""
    raw.handshake(heartbeat=1)
    _client_close(raw)
    assert raw.is_open(0.5)
    raw.wait_closed(5.0)


def test_closing_timeout_is_a_setting(start_broker):
    """Without a heartbeat the wait is closing_timeout (RabbitMQ: 30 s), for
    a client that never closes after our Close-Ok and for one that never
    answers our Close."""
    broker = start_broker("--closing-timeout", "1")
    with RawClient.connected(broker.port) as quiet, RawClient.connected(broker.port) as mute:
        _client_close(quiet)
        mute.send_frame(commands.Basic.Qos(prefetch_count=1), 5)  # unopened channel: 504
        assert mute.expect(commands.Connection.Close, 0).reply_code == 504
        assert quiet.is_open(0.3) and mute.is_open(0.1)
        quiet.wait_closed(5.0)
        mute.wait_closed(5.0)


def test_update_secret_is_answered_ok_whatever_the_secret(raw):
    """RabbitMQ 3.10's internal backend: the connection is authenticated
    already, so any new secret gets update-secret-ok and the connection
    goes on (pika's and amqplib's suites rely on it)."""
    raw.handshake()
    raw.send_frame(commands.Connection.UpdateSecret(new_secret="guest", reason="refresh"))
    raw.expect(commands.Connection.UpdateSecretOk, 0)
    raw.send_frame(commands.Connection.UpdateSecret(new_secret="stale", reason="refresh"))
    raw.expect(commands.Connection.UpdateSecretOk, 0)
    raw.open_channel(1)


# -- channels: close, Close-Ok, reopen ---------------------------------------------------------


def test_channel_close_then_reopen_same_number(raw):
    raw.handshake()
    raw.open_channel(1)
    raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 1)
    raw.expect(commands.Channel.CloseOk, 1)
    raw.open_channel(1)
    raw.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
    assert raw.expect(commands.Queue.DeclareOk, 1).queue.startswith("amq.gen-")


def provoke_404(raw: RawClient) -> commands.Channel.Close:
    raw.handshake()
    raw.open_channel(1)
    raw.send_frame(commands.Queue.Declare(queue=unique("missing"), passive=True), 1)
    close = raw.expect(commands.Channel.Close, 1)
    assert close.reply_code == 404
    return close


def test_frames_on_a_closing_channel_are_discarded_until_close_ok(raw):
    provoke_404(raw)
    queue = unique("q")
    raw.send_frames(
        (1, commands.Queue.Declare(queue=queue)),  # would create it
        (1, commands.Basic.Qos(prefetch_count=1)),
        (1, commands.Exchange.Declare(exchange=unique("x"), exchange_type="nope")),  # would be a 503
        *publish_frames(1, queue, b"dropped"),
        (1, commands.Basic.Get(queue=queue)),
    )
    assert barrier(raw) == []  # nothing answered on channel 1
    # the discarded queue.declare created nothing
    raw.send_frame(commands.Queue.Declare(queue=queue, passive=True), 2)
    assert raw.expect(commands.Channel.Close, 2).reply_code == 404
    raw.send_frame(commands.Channel.CloseOk(), 2)
    # Close-Ok ends the closing; the number can be opened again and works
    raw.send_frame(commands.Channel.CloseOk(), 1)
    raw.open_channel(1)
    raw.send_frame(commands.Queue.Declare(queue=queue, exclusive=True), 1)
    declared = raw.expect(commands.Queue.DeclareOk, 1)
    assert (declared.queue, declared.message_count) == (queue, 0)


def test_close_crossing_the_servers_close_gets_close_ok(raw):
    """Client and server close channel 1 at the same time: each answers the
    other's Close; the connection survives and the number can be reused."""
    provoke_404(raw)
    raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 1)
    raw.expect(commands.Channel.CloseOk, 1)
    raw.send_frame(commands.Channel.CloseOk(), 1)  # the answer to the server's Close
    assert barrier(raw) == []
    raw.open_channel(1)


def test_channel_open_on_a_closing_channel_is_a_second_open(raw):
    provoke_404(raw)
    raw.send_frame(commands.Channel.Open(), 1)
    close = raw.expect_connection_close()
    assert close_info(close) == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


# -- channel_max: the number of open channels is limited, as in RabbitMQ ------------------------


def test_negotiated_channel_max_limits_open_channels(raw):
    raw.handshake(channel_max=2)
    raw.open_channel(1)
    raw.open_channel(7)  # the number itself may be above channel_max
    raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 1)
    raw.expect(commands.Channel.CloseOk, 1)
    raw.open_channel(9)  # a closed channel no longer counts
    raw.send_frame(commands.Channel.Open(), 1)
    close = raw.expect_connection_close()
    assert close_info(close) == (
        530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)", 0, 0)


# -- byte stream: any split, any batching ----------------------------------------------------------


def session_bytes(queue: str, payload: bytes) -> bytes:
    frames = [
        start_ok_frame("PLAIN", plain_response("guest", "guest"), {"product": "bytewise"}),
    ]
    values = [
        (0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
        (0, commands.Connection.Open(virtual_host="/")),
        (1, commands.Channel.Open()),
        (1, commands.Queue.Declare(queue=queue, exclusive=True)),
        *publish_frames(1, queue, payload),
        (1, commands.Basic.Get(queue=queue, no_ack=True)),
    ]
    return PROTOCOL_HEADER + b"".join(frames) + b"".join(frame.marshal(v, ch) for ch, v in values)


def expect_session_replies(raw: RawClient, queue: str, payload: bytes) -> None:
    raw.expect(commands.Connection.Start, 0)
    raw.expect(commands.Connection.Tune, 0)
    raw.expect(commands.Connection.OpenOk, 0)
    raw.expect(commands.Channel.OpenOk, 1)
    assert raw.expect(commands.Queue.DeclareOk, 1).queue == queue
    raw.expect(commands.Basic.GetOk, 1)
    assert raw.expect(header.ContentHeader, 1).body_size == len(payload)
    assert raw.expect(body.ContentBody, 1).value == payload


def test_whole_session_sent_one_byte_at_a_time(raw):
    queue, payload = unique("q"), b"byte by byte"
    for byte in session_bytes(queue, payload):
        raw.send(bytes([byte]))
    expect_session_replies(raw, queue, payload)


def test_whole_session_in_one_write(raw):
    queue, payload = unique("q"), b"all at once"
    raw.send(session_bytes(queue, payload))
    expect_session_replies(raw, queue, payload)


def test_many_frames_in_one_large_write_are_all_handled(raw):
    """About 400 KiB in one write (more than one turn's input budget), spread
    over 50 channels."""
    raw.handshake()
    raw.open_channel(1)
    queue = unique("q")
    raw.send_frame(commands.Queue.Declare(queue=queue, exclusive=True), 1)
    raw.expect(commands.Queue.DeclareOk, 1)
    count = 2000
    frames = [(n, commands.Channel.Open()) for n in range(2, 51)]
    for i in range(count):
        frames += publish_frames(1 + i % 50, queue, b"%06d" % i + b"." * 100)
    frames += [(n, commands.Basic.Qos(prefetch_count=n)) for n in range(1, 51)]
    raw.send_frames(*frames)
    replies = {}
    while len(replies) < 99:
        number, value = raw.read_frame()
        replies[number, type(value)] = value
    assert set(replies) == (
        {(n, commands.Channel.OpenOk) for n in range(2, 51)} | {(n, commands.Basic.QosOk) for n in range(1, 51)}
    )

    def message_count():
        raw.send_frame(commands.Queue.Declare(queue=queue, passive=True), 1)
        return raw.expect(commands.Queue.DeclareOk, 1).message_count == count

    wait_for(message_count)
    raw.send_frame(commands.Basic.Get(queue=queue, no_ack=True), 1)
    raw.expect(commands.Basic.GetOk, 1)
    raw.expect(header.ContentHeader, 1)
    assert raw.expect(body.ContentBody, 1).value.startswith(b"000000.")


# -- isolation: one connection's bad frame does not disturb another --------------------------------


def test_malformed_frame_on_one_connection_leaves_another_working(broker, raw):
    connection = connect(broker.port)
    try:
        channel = connection.channel()
        queue = channel.queue_declare(unique("q"), exclusive=True).method.queue
        received = []
        channel.basic_consume(queue, lambda ch, method, props, body: received.append(body), auto_ack=True)
        channel.basic_publish("", queue, b"before")
        while not received:
            connection.process_data_events(time_limit=1)

        raw.handshake()
        raw.send(b"\x01\x00\x00\x00\x00\x00\x04abcd\x00")
        assert raw.expect_connection_close(closed_within=None).reply_code == 501

        channel.basic_publish("", queue, b"after")
        while len(received) < 2:
            connection.process_data_events(time_limit=1)
        assert received == [b"before", b"after"]
    finally:
        connection.close()


def test_abrupt_disconnect_mid_frame_leaves_broker_serving(broker):
    client = RawClient.connected(broker.port, channels=(1,))
    frame_bytes = method_frame_bytes(50, 10, commands.Queue.Declare(queue=unique("q")).marshal(), channel=1)
    client.send(frame_bytes[:9])
    client.close()
    with RawClient.connected(broker.port, channels=(1,)) as other:
        assert barrier(other) == []


def test_eof_before_the_header_completes(broker):
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(b"AMQ")
        sock.shutdown(socket.SHUT_WR)
        data, end = read_all(sock)
    assert data == b"" and end in ("eof", "reset")
