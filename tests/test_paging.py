"""Memory-bound paging and disk reclaim, at a small scale.

A real broker runs with a tiny paging budget (a 4 GB absolute watermark, far
above its memory so no alarm blocks publishers, at a paging ratio of 0.0005:
a 2 MB budget for bodies in RAM), so a backlog of
tens of megabytes has to live on disk (the delta state). Raw-socket clients
publish with confirms (many publishes per write, ~1 MiB of them unconfirmed
at a time) and consume with a prefetch window, checking order as they go,
while a thread samples the broker's RSS (VmRSS in /proc/PID/status).

The bound: RSS stays under its value after start plus RSS_ALLOWANCE (32 MiB)
while the bodies alone are 49-57 MiB, so a broker holding the backlog in RAM
exceeds it whatever its overhead. Measured on 2 cores (baseline ~29.5 MB),
peaks during fill / drain:
  paged (these tests):     durable 1 KiB +6 / +10 MB, 5 KB in the message
                           store +10 / +16 MB, transient +5 / +9 MB;
  4 GB watermark (no paging): durable +74 / +75 MB, 5 KB +68 / +71 MB,
                           transient +64 MB (that test fails first on its
                           disk check: nothing was paged).
The transient test also needs the writes queued for the disk to be bounded
(paging turns the flood into writes, and no confirm slows the publisher):
the server caps the writer's backlog at the memory budget; with the 64 MiB
cap alone it peaked at up to +51 MB.
With the default 4096-entry index segments the drain peaked at +24 MB (a
segment is read back at once), hence 1024-entry segments here: the scale is
divided, segments included (50k messages span 49 segments).

After draining, the data directory falls back to what a drained queue keeps:
the head index segment (at most one fully acked segment per queue) and the
message store's current file.
"""
from __future__ import annotations

import os
import struct
import threading
import time

from pamqp import commands, frame

from amqp_raw import RawClient, raw_frame_bytes
from helpers import unique, wait_for

MiB = 1024 * 1024
RSS_ALLOWANCE = 32 * MiB
SMALL_SCALE = (
    "--storage-vm-memory-high-watermark-absolute", "4000000000", "--storage-paging-ratio", "0.0005",
    "--storage-segment-entries", "1024",
)
STORE_FILE_SIZE = 4 * MiB


# -- measuring ----------------------------------------------------------------------


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes."""
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def disk_usage(directory) -> int:
    """Bytes in the files under `directory` (they may vanish meanwhile)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except FileNotFoundError:
                pass
    return total


class Peak:
    """Samples a value in a thread (every 20 ms) until stopped; keeps the maximum."""

    def __init__(self, sample) -> None:
        self._sample = sample
        self.peak = sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._sample())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())
        return self.peak


# -- fast raw clients ----------------------------------------------------------------


def body(i: int, size: int) -> bytes:
    return b"%08d" % i + b"x" * (size - 8)


def publish(port: int, queue: str, count: int, size: int, persistent: bool = True,
            durable: bool = True, window_bytes: int = MiB) -> None:
    """Declare `queue` and publish `count` messages of `size` bytes, numbered
    in their first 8 bytes, in confirm mode: batches of publishes in one
    write, at most `window_bytes` of them unconfirmed; returns once all are
    confirmed."""
    window = max(1, window_bytes // size)
    batch = max(1, window // 4)
    with RawClient.connected(port, channels=(1,)) as client:
        client.confirm_select()
        client.send_frame(commands.Queue.Declare(queue=queue, durable=durable), 1)
        client.expect(commands.Queue.DeclareOk, 1)
        method = frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
        header = raw_frame_bytes(2, 1, struct.pack(">HHQHB", 60, 0, size, 0x1000, 2 if persistent else 1))
        sent = confirmed = 0
        while confirmed < count:
            if sent < count and sent - confirmed < window:
                end = min(count, sent + batch)
                client.send(b"".join(method + header + raw_frame_bytes(3, 1, body(i, size))
                                     for i in range(sent, end)))
                sent = end
                continue
            _channel, ack = client.read_frame(timeout=10)
            assert isinstance(ack, commands.Basic.Ack), ack
            confirmed = ack.delivery_tag if ack.multiple else max(confirmed, ack.delivery_tag)


def consume(port: int, queue: str, count: int, size: int, prefetch: int = 1000,
            first: list | None = None) -> None:
    """Consume `count` messages with manual acks (multiple, every half
    prefetch), checking each is the next number with the right body; then the
    queue must be empty. `first` gets the time the first one arrived."""
    with RawClient.connected(port, channels=(1,)) as client:
        client.send_frame(commands.Basic.Qos(prefetch_count=prefetch), 1)
        client.expect(commands.Basic.QosOk, 1)
        client.send_frame(commands.Basic.Consume(queue=queue, consumer_tag="c"), 1)
        client.expect(commands.Basic.ConsumeOk, 1)
        sock = client.sock
        sock.settimeout(10)
        buf, parts, remaining = client.buf, [], 0
        got = tag = acked = 0
        while got < count:
            data = sock.recv(1 << 20)
            assert data, "connection closed after %d messages" % got
            buf += data
            pos = 0
            while len(buf) - pos >= 7:
                frame_type, _channel, length = struct.unpack_from(">BHI", buf, pos)
                if len(buf) - pos < length + 8:
                    break
                payload = pos + 7
                if frame_type == 1:
                    method = struct.unpack_from(">HH", buf, payload)
                    assert method == (60, 60), "expected Basic.Deliver, got method %s" % (method,)
                    at = payload + 4
                    at += 1 + buf[at]  # consumer tag
                    (tag,) = struct.unpack_from(">Q", buf, at)
                elif frame_type == 2:
                    (remaining,) = struct.unpack_from(">Q", buf, payload + 4)
                    parts = []
                elif frame_type == 3:
                    parts.append(buf[payload:payload + length])
                    remaining -= length
                    if remaining == 0:
                        received = b"".join(parts)
                        if received != body(got, size):
                            raise AssertionError("message %d: got %r..." % (got, received[:20]))
                        if first is not None and not first:
                            first.append(time.monotonic())
                        got += 1
                pos += length + 8
            buf = buf[pos:]
            if tag - acked >= prefetch // 2 or got == count:
                client.send_frame(commands.Basic.Ack(delivery_tag=tag, multiple=True), 1)
                acked = tag
        client.buf = buf
        client.send_frame(commands.Queue.Declare(queue=queue, passive=True), 1)
        declare_ok = client.expect(commands.Queue.DeclareOk, 1)
        assert declare_ok.message_count == 0, "more messages than published"


# -- tests ------------------------------------------------------------------------------


def check_paged_backlog(broker, count: int, size: int, persistent: bool, durable: bool) -> None:
    """Fill, then drain, a queue of `count` messages under the RSS bound;
    the backlog went to disk, and the disk is reclaimed after the drain."""
    queue = unique("paged")
    pid = broker.process.pid
    baseline = rss(pid)
    bound = baseline + RSS_ALLOWANCE
    memory = Peak(lambda: rss(pid))
    publish(broker.port, queue, count, size, persistent=persistent, durable=durable)
    filled = memory.stop()
    # Nearly all of it reached the disk (paged, or persisted at publish): the
    # 2 MB budget keeps at most that much of it in RAM only.
    wait_for(lambda: disk_usage(broker.data_dir) > count * size - 4 * MiB, timeout=10)
    memory = Peak(lambda: rss(pid))
    consume(broker.port, queue, count, size)
    drained = memory.stop()
    report = "baseline %.1f MB, fill peak %.1f MB, drain peak %.1f MB, bound %.1f MB" % (
        baseline / MiB, filled / MiB, drained / MiB, bound / MiB)
    assert filled < bound and drained < bound, report
    # Disk reclaim: a drained queue keeps its head index segment (1024
    # entries at most, ~1.1 MB of 1 KiB messages), the message store its
    # current file if that is under half the file size limit; and there is
    # definitions.db.
    wait_for(lambda: disk_usage(broker.data_dir) < 3 * MiB + STORE_FILE_SIZE // 2, timeout=10)
    assert "Traceback" not in broker.log


def test_durable_backlog_is_paged_and_the_disk_reclaimed(start_broker):
    """50k persistent 1 KiB messages (embedded in the queue index)."""
    broker = start_broker(*SMALL_SCALE)
    check_paged_backlog(broker, 50000, 1024, persistent=True, durable=True)


def test_durable_backlog_in_the_message_store(start_broker):
    """12k persistent 5 KB messages (60 MB): bodies in the shared message
    store, whose files are deleted or compacted as the queue drains."""
    broker = start_broker(*SMALL_SCALE, "--storage-msg-store-file-size", str(STORE_FILE_SIZE))
    check_paged_backlog(broker, 12000, 5000, persistent=True, durable=True)


def test_transient_backlog_is_paged(start_broker):
    """50k transient messages in a non-durable queue: nothing needs the
    disk for durability, but the backlog still goes there (paged out)."""
    broker = start_broker(*SMALL_SCALE)
    check_paged_backlog(broker, 50000, 1024, persistent=False, durable=False)


def test_restart_with_a_backlog_serves_quickly(start_broker):
    """20k persistent messages, a clean stop, a start on the same data
    directory: the broker listens and delivers the first message within
    generous bounds (the issue's target is 10 s for 1M messages; the real
    numbers come from the benchmark), then serves them all in order."""
    count, size = 20000, 1024
    first = start_broker()
    queue = unique("backlog")
    publish(first.port, queue, count, size)
    first.stop()
    assert first.process.returncode == 0, first.log
    began = time.monotonic()
    second = start_broker("--data-dir", str(first.data_dir))
    listening = time.monotonic() - began
    second.data_dir = first.data_dir
    arrived: list = []
    consume(second.port, queue, count, size, first=arrived)
    first_delivery = arrived[0] - began
    assert listening < 10 and first_delivery < 10, (listening, first_delivery)
    assert "Traceback" not in second.log
