"""A raw-socket MQTT client for protocol edge cases: build packets by hand,
read whole packets back (with a timeout, never a sleep)."""
from __future__ import annotations

import socket
import struct


def string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def remaining_length(length: int) -> bytes:
    out = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def connect_packet(client_id: str, clean: bool = True, keepalive: int = 60, username: str | None = None,
                   password: str | None = None, will: tuple | None = None, name: str = "MQTT",
                   level: int = 4) -> bytes:
    flags = 0x02 if clean else 0
    payload = string(client_id)
    if will is not None:
        topic, message, qos, retain = will
        flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        payload += string(topic) + string(message)
    if username is not None:
        flags |= 0x80
        payload += string(username)
    if password is not None:
        flags |= 0x40
        payload += string(password)
    return packet(0x10, string(name) + bytes((level, flags)) + struct.pack(">H", keepalive) + payload)


def publish_packet(topic: str, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False) -> bytes:
    body = string(topic) + (struct.pack(">H", pid) if qos else b"") + payload
    return packet(0x30 | (qos << 1) | (1 if retain else 0), body)


def subscribe_packet(pid: int, *filters: tuple[str, int]) -> bytes:
    return packet(0x82, struct.pack(">H", pid) + b"".join(string(f) + bytes((q,)) for f, q in filters))


def puback_packet(pid: int) -> bytes:
    return bytes((0x40, 2)) + struct.pack(">H", pid)


DISCONNECT = bytes((0xE0, 0))
PINGREQ = bytes((0xC0, 0))


class RawMQTT:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def __enter__(self) -> "RawMQTT":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int) -> bool:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def read(self) -> tuple[int, int, bytes] | None:
        """(type, flags, body) of the next packet; None when the server closed."""
        if not self._fill(2):
            return None
        length = 0
        shift = 0
        at = 1
        while True:
            if not self._fill(at + 1):
                return None
            byte = self.buffer[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if not self._fill(at + length):
            return None
        first = self.buffer[0]
        body = self.buffer[at:at + length]
        self.buffer = self.buffer[at + length:]
        return first >> 4, first & 0x0F, body

    def closed_by_server(self) -> bool:
        """Whether the server closes the connection (reads past any packets)."""
        try:
            while self.read() is not None:
                pass
        except ConnectionResetError:
            pass
        return True

    def connect(self, client_id: str, **kwargs) -> bytes:
        """CONNECT; returns the CONNACK's variable header (session present, code)."""
        self.send(connect_packet(client_id, **kwargs))
        reply = self.read()
        assert reply is not None and reply[0] == 2, reply
        return reply[2]


def parse_publish(flags: int, body: bytes) -> tuple[str, int, int, bool, bool, bytes]:
    """(topic, qos, packet id, retain, dup, payload) of a PUBLISH from the server."""
    (length,) = struct.unpack_from(">H", body)
    topic = body[2:2 + length].decode("utf-8")
    pos = 2 + length
    qos = (flags >> 1) & 3
    pid = 0
    if qos:
        (pid,) = struct.unpack_from(">H", body, pos)
        pos += 2
    return topic, qos, pid, bool(flags & 1), bool(flags & 8), body[pos:]


def until_ping(raw: RawMQTT) -> list:
    """Packets the server sends before answering a PINGREQ: publishes as
    (topic, qos, retain, dup, payload), others as (type, body)."""
    raw.send(PINGREQ)
    seen = []
    while True:
        kind, flags, body = raw.read()
        if kind == 13:
            return seen
        if kind == 3:
            topic, qos, _pid, retain, dup, payload = parse_publish(flags, body)
            seen.append((topic, qos, retain, dup, payload))
        else:
            seen.append((kind, body))
