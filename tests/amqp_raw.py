"""A blocking raw-socket AMQP 0-9-1 client for protocol-level tests.

It speaks frames through pamqp (`frame.marshal` / `frame.unmarshal`) but lets a
test choose every handshake parameter, write arbitrary bytes, and read back
what the server sends: frames, the bare protocol header, EOF or nothing.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, constants, encode, frame, heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

# The capabilities a client library announces that change what the broker
# does (consumer_cancel_notify: Basic.Cancel when a consumed queue goes).
CLIENT_CAPABILITIES = {"publisher_confirms": True, "consumer_cancel_notify": True}

# Markers `collect` appends after the frames it read.
EOF = "EOF"
TIMEOUT = "TIMEOUT"


class Closed(Exception):
    """The server closed the socket (EOF or reset)."""


def start_ok_frame(mechanism: str, response: bytes, client_properties: dict | None = None,
                   locale: str = "en_US") -> bytes:
    """Connection.StartOk built by hand, so `response` can be any bytes
    (pamqp only takes a str for a longstr)."""
    payload = (
        struct.pack(">HH", 10, 11)
        + encode.field_table(client_properties or {})
        + encode.short_string(mechanism)
        + struct.pack(">I", len(response)) + response
        + encode.short_string(locale)
    )
    return struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"


def plain_response(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain_response(user: str, password: str) -> bytes:
    """AMQPLAIN: a field table with LOGIN and PASSWORD, without its 4-byte length."""
    return encode.field_table({"LOGIN": user, "PASSWORD": password})[4:]


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0, nodelay: bool = True) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if nodelay:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.timeout = timeout
        self.start = None  # Connection.Start
        self.tune = None  # Connection.Tune
        self.last_frame_size = 0  # bytes on the wire of the last frame read

    # -- writing ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value, channel: int = 0) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def send_frames(self, *frames) -> None:
        """(channel, frame) pairs, all in one write."""
        self.sock.sendall(b"".join(frame.marshal(value, channel) for channel, value in frames))

    # -- reading -----------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            raise Closed() from None
        if not data:
            raise Closed()
        self.buf += data

    def read_bytes(self, count: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < count:
            self._fill(deadline)
        data, self.buf = self.buf[:count], self.buf[count:]
        return data

    def _take_frame(self, deadline: float) -> bytes:
        """The next whole frame's bytes, taken off the buffer."""
        while len(self.buf) < 7:
            self._fill(deadline)
        (size,) = struct.unpack_from(">I", self.buf, 3)
        while len(self.buf) < 8 + size:
            self._fill(deadline)
        data, self.buf = self.buf[:8 + size], self.buf[8 + size:]
        self.last_frame_size = len(data)
        return data

    def read_frame(self, timeout: float | None = None, heartbeats: bool = False):
        """Next (channel, frame); heartbeat frames are skipped unless asked for.
        Raises Closed on EOF and socket.timeout when nothing arrives in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            _consumed, channel, value = frame.unmarshal(self._take_frame(deadline))
            if isinstance(value, heartbeat.Heartbeat) and not heartbeats:
                continue
            return channel, value

    def read_raw_frame(self, timeout: float | None = None, heartbeats: bool = False) -> tuple[int, int, bytes]:
        """Next frame undecoded: (frame type, channel, payload), for tests that
        check exact bytes; heartbeat frames are skipped unless asked for."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            data = self._take_frame(deadline)
            frame_type, channel, size = struct.unpack_from(">BHI", data)
            assert data[-1] == constants.FRAME_END, "frame end byte is %#x" % data[-1]
            if frame_type == constants.FRAME_HEARTBEAT and not heartbeats:
                continue
            return frame_type, channel, data[7:7 + size]

    def read_content(self, channel: int, timeout: float | None = None) -> tuple[bytes, list[bytes]]:
        """After a Deliver/GetOk/Return: the raw content-header payload and the
        body frames' payloads (as many as the header's body size needs)."""
        frame_type, got, header_payload = self.read_raw_frame(timeout)
        assert (frame_type, got) == (constants.FRAME_HEADER, channel), (frame_type, got)
        (size,) = struct.unpack_from(">Q", header_payload, 4)
        bodies: list[bytes] = []
        while sum(map(len, bodies)) < size:
            frame_type, got, payload = self.read_raw_frame(timeout)
            assert (frame_type, got) == (constants.FRAME_BODY, channel), (frame_type, got)
            bodies.append(payload)
        return header_payload, bodies

    def expect(self, cls, channel: int | None = None, timeout: float | None = None):
        """Read the next frame and check it is a `cls` (on `channel`)."""
        got_channel, value = self.read_frame(timeout)
        assert isinstance(value, cls), "expected %s, got %r on channel %d" % (cls.__name__, value, got_channel)
        if channel is not None:
            assert got_channel == channel, "expected channel %d, got %d" % (channel, got_channel)
        return value

    def collect(self, timeout: float = 1.0, heartbeats: bool = False) -> list:
        """Frames read until Connection.Close/CloseOk, EOF or `timeout` of
        silence; ends with EOF or TIMEOUT when that is how it stopped."""
        out = []
        while True:
            try:
                item = self.read_frame(timeout, heartbeats)
            except Closed:
                out.append(EOF)
                return out
            except socket.timeout:
                out.append(TIMEOUT)
                return out
            out.append(item)
            if isinstance(item[1], (commands.Connection.Close, commands.Connection.CloseOk)):
                return out

    def expect_connection_close(self, timeout: float | None = None, closed_within: float | None = 2.0):
        """Read the server's Connection.Close (no other frame may come first)
        and answer Close-Ok; then, unless `closed_within` is None, check the
        server closes the socket within that many seconds (it waits up to
        closing_timeout, 30 s, for a Close-Ok, so a short limit proves the
        Close-Ok was read)."""
        channel, value = self.read_frame(timeout)
        assert channel == 0 and isinstance(value, commands.Connection.Close), "expected Connection.Close, got %r" % (value,)
        self.send_frame(commands.Connection.CloseOk())
        if closed_within is not None:
            self.wait_closed(closed_within)
        return value

    def wait_closed(self, timeout: float | None = None) -> float:
        """Discard input until EOF; returns when it came (time.monotonic())."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            try:
                self._fill(deadline)
            except Closed:
                return time.monotonic()
            except socket.timeout:
                raise AssertionError("the server did not close the socket within %.1f s" % limit) from None
            self.buf = b""

    def at_eof(self, timeout: float | None = None) -> bool:
        """True if the server closes the socket before sending another byte;
        False if a byte comes first (socket.timeout if neither happens)."""
        if self.buf:
            return False
        try:
            self._fill(time.monotonic() + (self.timeout if timeout is None else timeout))
        except Closed:
            return True
        return False

    def is_open(self, wait: float = 0.2) -> bool:
        """True if the socket stays open (no EOF) for `wait` seconds; input is kept."""
        try:
            self._fill(time.monotonic() + wait)
        except socket.timeout:
            return True
        except Closed:
            return False
        return True

    # -- handshake -----------------------------------------------------------------

    def handshake_start(self):
        self.send(PROTOCOL_HEADER)
        self.start = self.expect(commands.Connection.Start, 0)
        return self.start

    def login(self, user: str = "guest", password: str = "guest", mechanism: str = "PLAIN",
              capabilities: bool | dict = True, response: bytes | None = None) -> None:
        """Connection.StartOk. `capabilities`: True announces
        authentication_failure_close, a dict is sent as it is, False none."""
        if response is None:
            response = (amqplain_response if mechanism == "AMQPLAIN" else plain_response)(user, password)
        props = {"product": "hutch-tests"}
        if capabilities is True:
            props["capabilities"] = {"authentication_failure_close": True}
        elif isinstance(capabilities, dict):
            props["capabilities"] = dict(capabilities)
        self.send(start_ok_frame(mechanism, response, props))

    def handshake(self, user: str = "guest", password: str = "guest", mechanism: str = "PLAIN",
                  vhost: str = "/", channel_max: int | None = None, frame_max: int | None = None,
                  heartbeat: int = 0, open_ok: bool = True, capabilities: bool | dict = True):
        """Header, Start/StartOk, Tune/TuneOk (server values unless given), Open.
        Returns the Connection.Tune the server sent; waits for Open-Ok if asked."""
        self.handshake_start()
        self.login(user, password, mechanism, capabilities)
        self.tune = self.expect(commands.Connection.Tune, 0)
        self.send_frames(
            (0, commands.Connection.TuneOk(
                channel_max=self.tune.channel_max if channel_max is None else channel_max,
                frame_max=self.tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            )),
            (0, commands.Connection.Open(virtual_host=vhost)),
        )
        if open_ok:
            self.expect(commands.Connection.OpenOk, 0)
        return self.tune

    @classmethod
    def connected(cls, port: int, *, capabilities: bool | dict = True, channels: tuple = (),
                  **handshake) -> "RawClient":
        """A client through the handshake (guest on "/" unless given), with
        `channels` open."""
        client = cls(port)
        try:
            client.handshake(capabilities=capabilities, **handshake)
            for number in channels:
                client.open_channel(number)
        except BaseException:
            client.close()
            raise
        return client

    # -- common methods, synchronously ---------------------------------------------

    def open_channel(self, number: int = 1) -> None:
        self.send_frame(commands.Channel.Open(), number)
        self.expect(commands.Channel.OpenOk, number)

    def declare_queue(self, channel: int = 1) -> str:
        """An exclusive server-named queue; returns its name."""
        self.send_frame(commands.Queue.Declare(queue="", exclusive=True), channel)
        return self.expect(commands.Queue.DeclareOk, channel).queue

    def confirm_select(self, channel: int = 1) -> None:
        self.send_frame(commands.Confirm.Select(), channel)
        self.expect(commands.Confirm.SelectOk, channel)

    # -- publishing --------------------------------------------------------------------

    def publish_bytes(self, routing_key: str, body: bytes, channel: int = 1, *, exchange: str = "",
                      header: bytes | None = None, chunk: int | None = None, **flags) -> bytes:
        """Basic.Publish (`flags`: mandatory, immediate), a content header
        (`header` is its raw payload; default: no properties) and the body in
        frames of `chunk` bytes (default: as large as the negotiated frame_max allows)."""
        if header is None:
            header = struct.pack(">HHQH", 60, 0, len(body), 0)
        chunk = chunk or self.tune.frame_max - 8
        parts = [frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key, **flags), channel),
                 raw_frame_bytes(constants.FRAME_HEADER, channel, header)]
        parts += [raw_frame_bytes(constants.FRAME_BODY, channel, body[i:i + chunk])
                  for i in range(0, len(body), chunk)]
        return b"".join(parts)

    def publish(self, routing_key: str, body: bytes, channel: int = 1, **options) -> None:
        """Write what publish_bytes builds, in one write."""
        self.send(self.publish_bytes(routing_key, body, channel, **options))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def method_frame_bytes(class_id: int, method_id: int, arguments: bytes = b"", channel: int = 0) -> bytes:
    payload = struct.pack(">HH", class_id, method_id) + arguments
    return struct.pack(">BHI", 1, channel, len(payload)) + payload + b"\xce"


def raw_frame_bytes(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])
