"""A raw peer of a hutch leader's replication port, for the cluster tests:
written from docs/cluster.md's description of the wire (not from the
broker's modules), so it can play a stranger, a member that reads slowly,
or a leader with a stale term.

Frames: u32 length, u8 kind, body (JSON for kinds >= 16). Handshake:
CHALLENGE {nonce} / HELLO {name, purpose, protocol, client, nonce, proof} /
WELCOME {term, proof} or REFUSED {reason}; proofs are HMAC-SHA256 (hex) of
the compact JSON list of their parts under the cluster secret.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import time

HEAD = struct.Struct(">IB")
FILE_OP = struct.Struct(">QH")
WRITE = 2  # storage.files' kind of a whole file's content (docs/cluster.md: the records)
HELLO, SNAPSHOT_END, ACK, CHALLENGE, WELCOME, REFUSED, LISTING, HEARTBEAT = range(16, 24)


def proof(secret: str, *parts) -> str:
    return hmac.new(secret.encode(), json.dumps(parts, separators=(",", ":")).encode(), hashlib.sha256).hexdigest()


def frame(kind: int, value: dict) -> bytes:
    body = json.dumps(value).encode()
    return HEAD.pack(len(body), kind) + body


def file_frame(kind: int, path: str, offset: int, data: bytes) -> bytes:
    name = path.encode()
    return HEAD.pack(FILE_OP.size + len(name) + len(data), kind) + FILE_OP.pack(offset, len(name)) + name + data


class Peer:
    """One connection to a replication port (blocking socket)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0, sock=None,
                 source: str | None = None) -> None:
        self.sock = sock if sock is not None else socket.create_connection(
            (host, port), timeout=timeout, source_address=(source, 0) if source else None)
        self.sock.settimeout(timeout)
        self.received = bytearray()  # every byte read, for "was anything of value sent?"
        self._buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, count: int) -> bool:
        while len(self._buffer) < count:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return False
            self.received += chunk
            self._buffer += chunk
        return True

    def read_frame(self) -> tuple[int, bytes] | None:
        """(kind, body), or None at the end of the stream."""
        if not self._fill(HEAD.size):
            return None
        size, kind = HEAD.unpack_from(self._buffer)
        if not self._fill(HEAD.size + size):
            return None
        body = bytes(self._buffer[HEAD.size:HEAD.size + size])
        del self._buffer[:HEAD.size + size]
        return kind, body

    def read_json(self) -> tuple[int, dict] | None:
        got = self.read_frame()
        return None if got is None else (got[0], json.loads(got[1]))

    def drain(self) -> bytes:
        """Everything until the other end closes (or the timeout)."""
        try:
            while self.sock.recv(1 << 16):
                pass
        except OSError:
            pass
        return bytes(self.received)

    def closed_within(self, seconds: float) -> bool:
        """Whether the other end closes (EOF or reset) within `seconds`,
        whatever it sends meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                return False
            except OSError:
                return True
            if not chunk:
                return True
            self.received += chunk
        return False

    # -- the dialer's handshake -------------------------------------------------

    def hello(self, secret: str, name: str, purpose: str = "replicate", protocol=None, client=None) -> tuple[int, dict]:
        """(WELCOME or REFUSED, its body); raises when a WELCOME's proof is wrong."""
        kind, challenge = self.read_json()
        assert kind == CHALLENGE, kind
        ours = os.urandom(16).hex()
        self.send(frame(HELLO, {"name": name, "purpose": purpose, "protocol": protocol, "client": client,
                                "nonce": ours,
                                "proof": proof(secret, "hello", challenge["nonce"], ours, name, purpose, protocol,
                                               client)}))
        kind, answer = self.read_json()
        if kind == WELCOME:
            assert answer["proof"] == proof(secret, "welcome", challenge["nonce"], ours, name, purpose,
                                            answer["term"]), "the leader's proof is wrong"
        return kind, answer

    def file_bytes(self) -> int:
        """Bytes of file records (kinds < 16) among the frames read so far
        through `read_frame` (a stranger must get none)."""
        data, total, at = bytes(self.received), 0, 0
        while at + HEAD.size <= len(data):
            size, kind = HEAD.unpack_from(data, at)
            if kind < 16:
                total += size
            at += HEAD.size + size
        return total


def serve_handshake(conn: socket.socket, secret: str, term: int) -> tuple[Peer, dict] | None:
    """The leader's side of the handshake on an accepted connection: (the
    peer, its HELLO), once WELCOME (with `term`) is sent; None when the
    dialer left."""
    peer = Peer(0, sock=conn)
    ours = os.urandom(16).hex()
    peer.send(frame(CHALLENGE, {"nonce": ours}))
    got = peer.read_json()
    if got is None:
        return None
    hello = got[1]
    peer.send(frame(WELCOME, {"term": term, "proof": proof(secret, "welcome", ours, hello["nonce"], hello["name"],
                                                            hello["purpose"], term)}))
    return peer, hello
