"""Mutated AMQP sessions against a live broker (shared by tests/test_fuzz_live.py
and bench/fuzz_soak.py).

A *valid session* is the byte stream a client sends for: protocol header,
handshake (PLAIN guest/guest), a channel, a server-named queue, a publish whose
body spans two frames, a Basic.Get, confirms, a transaction, a channel close and
a connection close. `mutate` applies one of the usual fuzzing operators to it
(bit flips, byte overwrites, truncation, splices of two sessions, frame
duplication/deletion, and rewriting a frame's type, channel or length field).

`run_case` sends the bytes in one go, half-closes, and reads what the broker
answers until it closes the socket. The checks a case must pass:
- no hang: the socket is closed within `timeout` after our EOF;
- every Connection.Close carries a reply code AMQP defines for a connection
  close; 541 only as RabbitMQ sends it for undecodable content properties
  (text "INTERNAL_ERROR"), never for an exception escaping a handler;
- every Channel.Close carries a soft-error code.
"""
from __future__ import annotations

import os
import random
import socket
import struct
import time

from pamqp import commands, frame

from amqp_raw import PROTOCOL_HEADER, plain_response, start_ok_frame

CONNECTION_CODES = {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 403}
CHANNEL_CODES = {311, 312, 313, 403, 404, 405, 406}
_HEADER = struct.Struct(">BHI")


def _method(channel: int, method) -> bytes:
    return frame.marshal(method, channel)


def _content(channel: int, body: bytes, split: int) -> bytes:
    properties = b"\x90\x00" + b"\x0atext/plain" + b"\x02"  # content-type, delivery-mode
    payload = struct.pack(">HHQ", 60, 0, len(body)) + properties
    out = _HEADER.pack(2, channel, len(payload)) + payload + b"\xce"
    for part in (body[:split], body[split:]):
        out += _HEADER.pack(3, channel, len(part)) + part + b"\xce"
    return out


def valid_frames(body: bytes = b"hello fuzz, a body of two frames") -> list[bytes]:
    """The frames of a valid session (after the protocol header), one per item."""
    return [
        start_ok_frame("PLAIN", plain_response("guest", "guest"), {"capabilities": {"publisher_confirms": True}}),
        _method(0, commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0)),
        _method(0, commands.Connection.Open(virtual_host="/")),
        _method(1, commands.Channel.Open()),
        _method(1, commands.Queue.Declare(queue="", exclusive=True, arguments={"x-max-length": 10})),
        _method(1, commands.Confirm.Select()),
        _method(1, commands.Basic.Publish(exchange="amq.direct", routing_key="fuzz")),
        _content(1, body, len(body) // 2),
        _method(1, commands.Basic.Publish(exchange="", routing_key="amq.gen-none", mandatory=True)),
        _content(1, body, 3),
        _method(1, commands.Basic.Get(queue="", no_ack=True)),
        _method(1, commands.Basic.Qos(prefetch_count=5)),
        _method(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
        _method(2, commands.Channel.Open()),
        _method(2, commands.Tx.Select()),
        _method(2, commands.Exchange.Declare(exchange="fuzz.x", exchange_type="topic", auto_delete=True)),
        _method(2, commands.Tx.Commit()),
        _method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
    ]


def valid_session() -> bytes:
    return PROTOCOL_HEADER + b"".join(valid_frames())


def _set_length(frame_bytes: bytes, rnd: random.Random) -> bytes:
    size = rnd.choice([0, 1, 3, 7, len(frame_bytes) - 9, len(frame_bytes) - 7, 1 << 20, 0xFFFFFFFF,
                       rnd.randrange(0, 1 << 32)])
    return frame_bytes[:3] + struct.pack(">I", max(size, 0)) + frame_bytes[7:]


def mutate(rnd: random.Random) -> tuple[str, bytes]:
    """One mutated session and the name of the operator applied."""
    frames = valid_frames(rnd.randbytes(rnd.choice([0, 1, 40, 300])) if rnd.random() < 0.3 else
                          b"hello fuzz, a body of two frames")
    op = rnd.choice(["bitflip", "bytes", "truncate", "splice", "dup", "drop", "type", "channel", "length",
                     "argument"])
    if op in ("dup", "drop", "type", "channel", "length", "argument"):
        index = rnd.randrange(len(frames))
        chosen = frames[index]
        if op == "dup":
            frames.insert(index, chosen)
        elif op == "drop":
            del frames[index]
        elif op == "type":
            frames[index] = bytes([rnd.choice([0, 1, 2, 3, 4, 8, 9, 0xCE, 255])]) + chosen[1:]
        elif op == "channel":
            frames[index] = chosen[:1] + struct.pack(">H", rnd.choice([0, 1, 2, 3, 16, 17, 65535])) + chosen[3:]
        elif op == "length":
            frames[index] = _set_length(chosen, rnd)
        else:  # corrupt the arguments of one method frame, keeping the framing valid
            payload = bytearray(chosen[7:-1])
            for _ in range(rnd.randint(1, 4)):
                if len(payload) > 4:
                    payload[rnd.randrange(4, len(payload))] = rnd.randrange(256)
            frames[index] = chosen[:7] + bytes(payload) + chosen[-1:]
        return op, PROTOCOL_HEADER + b"".join(frames)
    data = bytearray(PROTOCOL_HEADER + b"".join(frames))
    if op == "bitflip":
        for _ in range(rnd.randint(1, 8)):
            position = rnd.randrange(8, len(data))
            data[position] ^= 1 << rnd.randrange(8)
    elif op == "bytes":
        for _ in range(rnd.randint(1, 8)):
            data[rnd.randrange(8, len(data))] = rnd.choice([0, 1, 0x7F, 0x80, 0xCE, 0xFF, rnd.randrange(256)])
    elif op == "truncate":
        del data[rnd.randrange(8, len(data)):]
    else:  # splice: the head of one session, the tail of another at a different offset
        other = valid_session()
        data = data[:rnd.randrange(8, len(data))] + other[rnd.randrange(8, len(other)):]
    return op, bytes(data)


class Hang(AssertionError):
    """The broker neither answered nor closed within the timeout."""


def run_case(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data`, half-close, read until EOF; what the broker sent. Raises Hang."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    received = bytearray()
    deadline = time.monotonic() + timeout
    try:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker closed first (e.g. a bad protocol header); read what it said
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Hang("no EOF within %.0fs" % timeout)
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                raise Hang("no EOF within %.0fs" % timeout) from None
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    return bytes(received)


def methods(received: bytes) -> list[tuple[int, int, int, bytes]]:
    """(channel, class id, method id, arguments) of every method frame the broker sent."""
    found = []
    pos = 8 if received.startswith(b"AMQP") else 0
    while len(received) - pos >= 7:
        frame_type, channel, size = _HEADER.unpack_from(received, pos)
        payload = received[pos + 7:pos + 7 + size]
        if frame_type == 1 and len(payload) >= 4:
            class_id, method_id = struct.unpack_from(">HH", payload)
            found.append((channel, class_id, method_id, payload[4:]))
        pos += 8 + size
    return found


def closes(received: bytes) -> list[tuple[int, int, int, str]]:
    """(channel, class, reply code, reply text) of every Connection.Close / Channel.Close."""
    found = []
    for channel, class_id, method_id, arguments in methods(received):
        if (class_id, method_id) in ((10, 50), (20, 40)):
            text = arguments[3:3 + arguments[2]].decode("utf-8", "replace")
            found.append((channel, class_id, struct.unpack_from(">H", arguments)[0], text))
    return found


def check_closes(found: list[tuple[int, int, int, str]]) -> None:
    for channel, class_id, code, text in found:
        if (class_id, code, text) == (10, 541, "INTERNAL_ERROR"):
            continue  # undecodable content properties: RabbitMQ's exact answer
        allowed = CONNECTION_CODES if class_id == 10 else CHANNEL_CODES
        assert code in allowed, "close %d %r on channel %d (class %d)" % (code, text, channel, class_id)


def broker_resources(pid: int) -> tuple[int, int]:
    """(open file descriptors, resident set size in KiB) of a process."""
    fds = len(os.listdir("/proc/%d/fd" % pid))
    with open("/proc/%d/status" % pid) as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return fds, rss
