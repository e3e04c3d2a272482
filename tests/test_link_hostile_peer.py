"""A link's peer is not trusted: a "broker" that a shovel connects to and
that sends frames beyond any frame_max, or garbage, makes the link fail
with the reason in its status and reconnect later; hutch neither crashes
nor buffers what the peer sends (amqp_server.links.frames).

The peer is a raw-socket server in a thread (it plays a hostile broker, so
it is not a broker). It sends a frame header announcing about 2 GiB and then
streams `FLOOD` bytes as long as the link reads them: before the handshake
(in place of connection.start), after it, or garbage after it; or it
proposes a frame_max of 8 bytes. The broker's
peak RSS (VmHWM) may not grow by anything near the flood: a bound, not a
timing."""
from __future__ import annotations

import socket
import struct
import threading

import pytest
from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from helpers import assert_serves, wait_for
from http_api import Api

pytestmark = pytest.mark.timeout(180)

FLOOD = 96 * 1024 * 1024  # what the peer tries to make the link buffer
RSS_BOUND = 40 * 1024 * 1024  # the broker's peak RSS may grow by less than this
HUGE_FRAME = struct.pack(">BHI", 1, 0, 0x7FFFFFF0)  # a method frame announcing ~2 GiB


class HostilePeer:
    """Accepts connections and misbehaves as `mode` says: "huge-start",
    "huge-after-handshake", "garbage-after-handshake", "tiny-frame-max"
    (proposes a frame_max below AMQP's minimum of 4096)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.tune_ok: list = []  # the frame_max of each Tune-Ok a link sent
        self.flooded: list = []  # bytes of flood each connection took
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._session, args=(sock,), daemon=True).start()

    def _session(self, sock: socket.socket) -> None:
        with sock:
            try:
                sock.settimeout(30)
                self._misbehave(sock)
            except (OSError, ValueError):
                pass

    def _read_frame(self, sock):
        header = self._read(sock, 7)
        _type, _channel, size = struct.unpack(">BHI", header)
        return pamqp_frame.unmarshal(header + self._read(sock, size + 1))[2]

    @staticmethod
    def _read(sock, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise ValueError("closed")
            data += chunk
        return data

    def _misbehave(self, sock) -> None:
        assert self._read(sock, 8) == b"AMQP\x00\x00\x09\x01"
        if self.mode == "huge-start":
            self._flood(sock, HUGE_FRAME)
            return
        sock.sendall(pamqp_frame.marshal(spec.Connection.Start(
            server_properties={"product": "hostile", "capabilities": {"publisher_confirms": True}},
            mechanisms="PLAIN", locales="en_US"), 0))
        self._read_frame(sock)  # start-ok
        proposed = 8 if self.mode == "tiny-frame-max" else 0  # 0: "no limit"
        sock.sendall(pamqp_frame.marshal(spec.Connection.Tune(channel_max=16, frame_max=proposed, heartbeat=0), 0))
        self.tune_ok.append(self._read_frame(sock).frame_max)
        self._read_frame(sock)  # connection.open
        sock.sendall(pamqp_frame.marshal(spec.Connection.OpenOk(), 0))
        self._read_frame(sock)  # channel.open
        if self.mode == "huge-after-handshake":
            self._flood(sock, HUGE_FRAME)
        else:  # a frame whose end octet is wrong, then noise
            self._flood(sock, struct.pack(">BHI", 1, 1, 4) + b"\x00\x14\x00\x0b" + b"\x00")

    def _flood(self, sock, first: bytes) -> None:
        sock.sendall(first)
        chunk = b"\x01" * (1024 * 1024)
        sent = 0
        try:
            while sent < FLOOD:
                sock.sendall(chunk)
                sent += len(chunk)
        finally:
            self.flooded.append(sent)


def peak_rss(broker) -> int:
    with open("/proc/%d/status" % broker.process.pid) as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("mode", ["huge-start", "huge-after-handshake", "garbage-after-handshake", "tiny-frame-max"])
def test_a_hostile_peer_fails_the_link_without_growing_the_broker(start_broker, mode):
    node = start_broker(expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    peer = HostilePeer(mode)
    try:
        before = peak_rss(node)
        reply = api.put("/api/parameters/shovel/%2F/from-hostile", {"value": {
            "src-uri": "amqp://guest:guest@127.0.0.1:%d/" % peer.port, "src-queue": "q",
            "dest-uri": "amqp://", "dest-queue": "q", "reconnect-delay": 0.2}})
        assert reply.status == 201, reply.body

        def terminated():
            for status in api.get("/api/shovels/%2F").body:
                floods = 0 if mode == "tiny-frame-max" else 2
                if status["state"] == "terminated" and peer.connections >= 3 and len(peer.flooded) >= floods:
                    return status
            return None
        status = wait_for(terminated, 90, what="the link failing and reconnecting")
        expected = {"huge-start": "larger than frame_max 131072",
                    "huge-after-handshake": "frame_too_large,2147483632,131064",
                    "garbage-after-handshake": "invalid_frame_end_marker",
                    "tiny-frame-max": "the server proposed frame_max 8, below AMQP's frame-min-size 4096"}[mode]
        assert expected in status["reason"], status["reason"]
        if mode == "tiny-frame-max":
            assert peer.tune_ok == []  # refused, not agreed to
        else:
            if mode != "huge-start":
                assert set(peer.tune_ok) == {131072}  # the link's own limit, though the peer proposed none
            assert max(peer.flooded) < FLOOD  # the link stopped reading: the flood could not be sent
        assert peak_rss(node) - before < RSS_BOUND
        assert node.process.poll() is None
        assert_serves(node.port)
    finally:
        api.delete("/api/parameters/shovel/%2F/from-hostile")
        peer.close()
