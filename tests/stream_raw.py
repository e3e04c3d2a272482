"""A raw-socket stream-protocol client for edge cases no client library sends
(written from PROTOCOL.adoc with struct, independent of the broker's codec)."""
from __future__ import annotations

import socket
import struct


def string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">H", len(data)) + data


def string_map(entries: dict) -> bytes:
    return struct.pack(">i", len(entries)) + b"".join(string(k) + string(v) for k, v in entries.items())


def frame(key: int, *fields: bytes, version: int = 1) -> bytes:
    body = struct.pack(">HH", key, version) + b"".join(fields)
    return struct.pack(">I", len(body)) + body


class StreamRaw:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "StreamRaw":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_id(self) -> bytes:
        self.correlation += 1
        return struct.pack(">I", self.correlation)

    def request(self, key: int, *fields: bytes, version: int = 1) -> None:
        self.send(frame(key, self.next_id(), *fields, version=version))

    def read(self) -> tuple[int, int, bytes] | None:
        """(key, version, rest) of the next frame; None once the broker closed."""
        while len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack_from(">I", self.buffer)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        size = struct.unpack_from(">I", self.buffer)[0]
        data, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
        key, version = struct.unpack_from(">HH", data)
        return key, version, data[4:]

    def read_key(self, key: int) -> bytes:
        """The rest of the next frame with `key` (skipping heartbeats and the like)."""
        while True:
            found = self.read()
            assert found is not None, "the broker closed the connection waiting for %#06x" % key
            if found[0] == key:
                return found[2]

    def response_code(self, key: int) -> int:
        """The response code of the next response to `key`."""
        return struct.unpack_from(">H", self.read_key(key | 0x8000), 4)[0]

    def closed(self) -> bool:
        """True once the broker closed the socket (reading what it sent first)."""
        try:
            while self.read() is not None:
                pass
        except (ConnectionResetError, socket.timeout):
            return False
        return True

    # -- the handshake ----------------------------------------------------------

    def authenticate(self, user: str = "guest", password: str = "guest", mechanism: str = "PLAIN",
                     opaque: bytes | None = None) -> int:
        self.request(0x11, string_map({"product": "raw"}))
        assert self.response_code(0x11) == 1
        self.request(0x12)
        self.read_key(0x8012)
        if opaque is None:
            opaque = b"\0" + user.encode() + b"\0" + password.encode()
        self.request(0x13, string(mechanism), struct.pack(">i", len(opaque)) + opaque)
        return self.response_code(0x13)

    def open(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> int:
        assert self.authenticate(user, password) == 1
        tune = self.read_key(0x14)
        self.send(frame(0x14, tune))
        self.request(0x15, string(vhost))
        return self.response_code(0x15)
