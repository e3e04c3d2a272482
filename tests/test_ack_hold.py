"""The rule that output after acks waits for their records (amqp_server.shared.client,
docs/storage.md "Acks"), held at the protocol with a real disk writer.

tests/test_ack_crash.py shows the rule end to end (acks, a later reply, SIGKILL);
it cannot make the writer slow on purpose. Here the writer thread is held on a
job, so the acks' record is queued and not written while the protocol is asked
to write again and again: by the acks' connection itself, and by something else
that wakes it (a publisher confirm on another channel of the same connection,
which calls `wake` through `Connection.confirm_pending`). Nothing may reach the
socket before the record is written.
"""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from amqp_server.amqp.protocol import AMQPProtocol
from storage.writer import AppendFile, GroupCommitWriter


class Output:
    """What ClientProtocol asks of a connection when it writes."""

    def __init__(self) -> None:
        self.acks_handled = False
        self.queued: list[bytes] = []

    def take_output(self) -> list[bytes]:
        out, self.queued = self.queued, []
        return out


class Socket:
    """The transport: what was written to it."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def writelines(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _held_until_the_acks_record_is_written(tmp_path) -> None:
    loop = asyncio.get_running_loop()
    writer = GroupCommitWriter(loop, "flush")
    release = threading.Event()
    try:
        # a broker of a single node: it always promises (no cluster lease fences its output)
        protocol = AMQPProtocol(SimpleNamespace(promising=None), None, set(), None, None, writer)
        protocol.transport, protocol.connection = Socket(), Output()
        connection, socket = protocol.connection, protocol.transport
        writer.run(lambda: release.wait(60))  # the writer is busy (an fsync, a compaction)
        # An ack was handled: its record is queued behind that job, and a reply follows it.
        writer.append(AppendFile(str(tmp_path / "0.idx"), size=0), b"ACK record")
        connection.acks_handled = True
        connection.queued.append(b"basic.qos-ok")
        protocol.wake()
        await _turns()
        assert socket.written == []
        # Woken again before the record is written, by a confirm on another channel.
        connection.queued.append(b"basic.ack (confirm)")
        protocol.wake()
        await _turns()
        assert socket.written == [], "output after acks went out before their record was written"
        release.set()
        deadline = loop.time() + 30  # the writer thread may wait for a core on a busy machine
        while not socket.written and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert socket.written == [b"basic.qos-ok", b"basic.ack (confirm)"]
        assert (tmp_path / "0.idx").read_bytes() == b"ACK record"
    finally:
        release.set()
        writer.stop()


def test_output_after_acks_waits_for_their_record_however_often_woken(tmp_path):
    asyncio.run(_held_until_the_acks_record_is_written(tmp_path))
