"""Crash cycles: kill -9 a broker under confirmed publishing and consuming,
restart it on the same data directory, and check what came back.

Shared by tests/test_crash.py (a short run in the suite) and
bench/crash_soak.py (a long soak); both drive a `Crasher`.

One data directory, one durable queue. Each cycle starts a broker on the
directory (port 0), runs a publisher and/or a consumer against it, kills the
broker with SIGKILL after a random delay (the only random element; the seed is
in every failure message), and waits for both clients to see the socket close.
The cycle kinds follow a fixed plan (`plan`): "mixed" (publisher and consumer
at once), "fill" (publisher only: the backlog grows and pages to disk) and
"drain" (consumer only: the backlog is read back from disk); some cycles also
append a torn record to the newest index segment and message store file after
the kill ("torn"), as a write cut short would leave them.

The clients are raw AMQP 0-9-1 over asyncio (frames through pamqp and by
hand), so the test knows exactly which frames were written and which arrived:
- publisher: confirm mode, persistent messages into the durable queue, at
  most WINDOW unconfirmed; the body holds a unique id (ascending in publish
  order) and filler derived from it, a quarter of them large enough to go to
  the message store, the others small enough to be embedded in the queue
  index. An id counts as confirmed only when its basic.ack arrived.
- consumer: manual acks with a prefetch, acking (multiple) every few
  deliveries. Its channel is in confirm mode too: after acks it publishes a
  persistent marker message to a second durable queue. The broker handles a
  channel's frames in order, so those acks were applied before the marker was
  enqueued, and hutch writes nothing on a connection after acks until their
  records are written (docs/storage.md "Acks"; on a node of several shards
  by whichever shard owns the queue), so the marker's confirm follows the
  acks' records. The ids acked before a confirmed
  marker are "durably acked". An ack that was sent but not followed by a
  confirmed marker may or may not have been processed before the crash.
  (AMQP has no confirm of an ack; the marker makes one out of hutch's
  write ordering.)

Invariants (client-side history across all cycles; `History`):
 I1 no loss: at every restart, the ready count is at least the number of
    confirmed ids never acked and at most the number of published ids not
    durably acked; within a run the consumer sees the queue in order, so
    every confirmed, never-acked id below the highest id it received in that
    run must have been received in that run; after the last cycle the queue
    is drained and every confirmed id has been delivered at least once (those
    never acked before, in the final drain).
 I2 acks stick: a durably acked id is never delivered again; an id whose ack
    was sent but maybe not processed may come back, marked redelivered.
 I3 no duplicates: an id is delivered at most once per broker run (nothing
    is requeued within a run), and every delivery after its first one has
    redelivered=true (as RabbitMQ, which marks every message recovered after
    an unclean shutdown redelivered).
 I4 order: within one run deliveries come in ascending id order (the queue's
    order is the publish order; recovered messages precede new ones).
 I5 integrity: every delivered body is exactly the body published for its id.
 I6 start-up: each restart is listening within `start_limit` seconds, says it
    found no clean-shutdown marker, and logs no error or warning other than
    torn tails (a torn record appended on purpose must be reported); no
    broker log has a traceback.
At the end: after the final drain's acks are durable a kill -9 and restart
leave the queue empty, and a SIGTERM stop plus restart is clean and empty too.
"""
from __future__ import annotations

import asyncio
import hashlib
import random
import re
import signal
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from pamqp import commands, frame

from amqp_raw import PROTOCOL_HEADER, plain_response, start_ok_frame
from conftest import BrokerProcess, launch
from storage.vhost_storage import dir_name

QUEUE = "crash-q"
MARKERS = "crash-markers"
WINDOW = 128  # unconfirmed publishes at most

# Small files and segments, and a small memory budget, so that a short run
# rolls, compacts and deletes store files, deletes index segments and pages
# the backlog out to disk: every one of those is crashed in the middle.
BROKER_FLAGS = (
    "--storage-msg-store-file-size", "262144",
    "--storage-segment-entries", "128",
    # a 4 MiB paging budget; the watermark itself is far above the broker's memory (no alarm)
    "--storage-vm-memory-high-watermark-absolute", str(8 * 1024 * 1024 * 1000), "--storage-paging-ratio", "0.0005",
)

# -- message bodies ---------------------------------------------------------------


def body_for(n: int) -> bytes:
    """The body of id n: "n|" then filler derived from n; every fourth one is
    large (4.5-16 KiB: message store), the others small (index-embedded)."""
    size = 4500 + (n * 7919) % 12000 if n % 4 == 3 else 20 + (n * 131) % 2500
    head = b"%d|" % n
    seed = hashlib.blake2b(head, digest_size=32).digest()
    filler = (seed * (size // 32 + 1))[:max(0, size - len(head))]
    return head + filler


def id_of(body: bytes) -> int | None:
    head, sep, _rest = body.partition(b"|")
    return int(head) if sep and head.isdigit() else None


# -- a raw AMQP client on asyncio ---------------------------------------------------

_FRAME = struct.Struct(">BHI")
METHOD, HEADER, BODY = 1, 2, 3
_PUBLISH_METHOD = struct.pack(">HHH", 60, 40, 0)  # basic.publish, reserved-1
_ACK = struct.Struct(">HHQB")  # basic.ack: class, method, tag, multiple


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME.pack(kind, channel, len(payload)) + payload + b"\xce"


def publish_frames(channel: int, routing_key: str, body: bytes, frame_max: int) -> bytes:
    """basic.publish to the default exchange, persistent (delivery-mode 2)."""
    key = routing_key.encode()
    method = _PUBLISH_METHOD + b"\x00" + bytes([len(key)]) + key + b"\x00"
    header = struct.pack(">HHQHB", 60, 0, len(body), 0x1000, 2)
    parts = [_frame(METHOD, channel, method), _frame(HEADER, channel, header)]
    step = frame_max - 8
    for i in range(0, len(body), step):
        parts.append(_frame(BODY, channel, body[i:i + step]))
    return b"".join(parts)


class ConnectionLost(Exception):
    pass


class Client(asyncio.Protocol):
    """One AMQP connection. Synchronous replies are awaited with `call`;
    basic.ack/nack (confirms) go to `on_confirm(channel, tag, multiple, nack)`,
    deliveries to `on_delivery(channel, deliver, body)`, both called from
    `data_received`. `lost` resolves when the socket closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.replies: dict[int, list] = {}  # channel -> [(class, future)]
        self.on_confirm = None
        self.on_delivery = None
        self.lost = asyncio.get_running_loop().create_future()
        self.server_close = None  # a Connection.Close or Channel.Close from the broker
        self.frame_max = 131072
        self._content: dict[int, list] = {}  # channel -> [deliver, size, parts]

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)
        for waiters in self.replies.values():
            for _cls, fut in waiters:
                if not fut.done():
                    fut.set_exception(ConnectionLost())
        self.replies.clear()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 7:
            kind, channel, size = _FRAME.unpack_from(buf, pos)
            end = pos + 7 + size + 1
            if len(buf) < end:
                break
            self._frame(kind, channel, bytes(buf[pos:end]))
            pos = end
        del buf[:pos]

    def _frame(self, kind: int, channel: int, raw: bytes) -> None:
        payload = raw[7:-1]
        if kind == METHOD:
            method = frame.unmarshal(raw)[2]
            if isinstance(method, (commands.Basic.Ack, commands.Basic.Nack)):
                if self.on_confirm is not None:
                    self.on_confirm(channel, method.delivery_tag, method.multiple,
                                    isinstance(method, commands.Basic.Nack))
            elif isinstance(method, commands.Basic.Deliver):
                self._content[channel] = [method, None, []]
            elif isinstance(method, (commands.Connection.Close, commands.Channel.Close)):
                self.server_close = method
                self.transport.close()
            else:
                waiters = self.replies.get(channel)
                if waiters:
                    cls, fut = waiters.pop(0)
                    if not fut.done():
                        if isinstance(method, cls):
                            fut.set_result(method)
                        else:
                            fut.set_exception(AssertionError("expected %s, got %r" % (cls.__name__, method)))
        elif kind == HEADER:
            pending = self._content[channel]
            pending[1] = struct.unpack_from(">Q", payload, 4)[0]
            if pending[1] == 0:
                self._deliver(channel)
        elif kind == BODY:
            pending = self._content[channel]
            pending[2].append(payload)
            if sum(map(len, pending[2])) >= pending[1]:
                self._deliver(channel)

    def _deliver(self, channel: int) -> None:
        deliver, _size, parts = self._content.pop(channel)
        if self.on_delivery is not None:
            self.on_delivery(channel, deliver, b"".join(parts))

    # sending
    @property
    def is_open(self) -> bool:
        return not self.lost.done() and self.transport is not None and not self.transport.is_closing()

    def write(self, data: bytes) -> bool:
        if not self.is_open:
            return False
        self.transport.write(data)
        return True

    def send(self, method, channel: int = 1) -> bool:
        return self.write(frame.marshal(method, channel))

    def expect(self, cls, channel: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)  # a reply lost with the socket need not be awaited
        if self.lost.done():
            fut.set_exception(ConnectionLost())
        else:
            self.replies.setdefault(channel, []).append((cls, fut))
        return fut

    async def call(self, method, reply_cls, channel: int = 1):
        fut = self.expect(reply_cls, channel)
        self.send(method, channel)
        return await fut

    def ack(self, tag: int, multiple: bool, channel: int = 1) -> bool:
        return self.write(_frame(METHOD, channel, _ACK.pack(60, 80, tag, 1 if multiple else 0)))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


async def connect(port: int, timeout: float = 10.0) -> Client:
    """Connected, logged in as guest, with channel 1 open."""
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(Client, "127.0.0.1", port)

    async def handshake() -> None:
        start = client.expect(commands.Connection.Start, 0)
        client.write(PROTOCOL_HEADER)
        await start
        tune = client.expect(commands.Connection.Tune, 0)
        client.write(start_ok_frame("PLAIN", plain_response("guest", "guest"), {
            "product": "hutch-crash-tests",
            "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True}}))
        tuned = await tune
        client.frame_max = tuned.frame_max
        open_ok = client.expect(commands.Connection.OpenOk, 0)
        client.send(commands.Connection.TuneOk(channel_max=tuned.channel_max, frame_max=tuned.frame_max,
                                               heartbeat=0), 0)
        client.send(commands.Connection.Open(virtual_host="/"), 0)
        await open_ok
        await client.call(commands.Channel.Open(), commands.Channel.OpenOk, 1)

    try:
        await asyncio.wait_for(handshake(), timeout)
    except BaseException:
        client.close()
        raise
    return client


async def close(client: Client) -> None:
    """A polite Connection.Close (the broker logs nothing alarming)."""
    if client.is_open:
        try:
            goodbye = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
            await asyncio.wait_for(client.call(goodbye, commands.Connection.CloseOk, 0), 5)
        except (ConnectionLost, asyncio.TimeoutError):
            pass
    client.close()


# -- the client-side history and the invariants -----------------------------------------


@dataclass
class History:
    """Everything the clients saw, across all broker runs. `run` numbers the
    broker processes (0, 1, ...); violations are collected, not raised, so a
    run reports all it found."""

    next_id: int = 0
    published: dict = field(default_factory=dict)  # id -> run its publish was written in
    confirmed: set = field(default_factory=set)
    nacked: set = field(default_factory=set)
    deliveries: dict = field(default_factory=dict)  # id -> [(run, redelivered)]
    ack_sent: set = field(default_factory=set)  # ids whose ack was written (maybe not processed)
    durably_acked: set = field(default_factory=set)
    violations: list = field(default_factory=list)
    run: int = -1
    # per run
    run_delivered: list = field(default_factory=list)  # ids in arrival order
    run_seen: set = field(default_factory=set)
    must_at_start: list = field(default_factory=list)  # confirmed, never-acked ids at the restart
    ready_at_start: int = 0
    run_published: int = 0
    run_acked: int = 0
    totals: dict = field(default_factory=lambda: {"deliveries": 0, "redelivered": 0, "acks": 0, "markers": 0})

    def fail(self, text: str) -> None:
        self.violations.append("run %d: %s" % (self.run, text))

    def new_run(self) -> None:
        self.run += 1
        self.run_delivered = []
        self.run_seen = set()
        self.must_at_start = sorted(self.confirmed - self.ack_sent)
        self.ready_at_start = self.run_published = self.run_acked = 0

    @property
    def backlog(self) -> int:
        """Roughly what the queue holds: what it held at the restart, plus
        what this run published, minus what this run acked."""
        return self.ready_at_start + self.run_published - self.run_acked

    def check_ready_count(self, ready: int) -> None:
        """I1 at a restart: the ready count lies between what must be there
        and what may be there."""
        self.ready_at_start = ready
        low = len(self.must_at_start)
        high = len(self.published.keys() - self.durably_acked)
        if not low <= ready <= high:
            self.fail("ready count %d after restart, expected %d..%d (confirmed and never acked .. "
                      "published and not durably acked)" % (ready, low, high))

    def delivered(self, body: bytes, redelivered: bool) -> int | None:
        """I2-I5 for one delivery."""
        self.totals["deliveries"] += 1
        self.totals["redelivered"] += redelivered
        n = id_of(body)
        if n is None or n not in self.published:
            self.fail("delivery of a body that was never published: %r" % body[:40])
            return None
        if body != body_for(n):
            self.fail("id %d delivered with a different body (%d bytes, expected %d)" % (n, len(body), len(body_for(n))))
        previous = self.deliveries.setdefault(n, [])
        if n in self.durably_acked:
            self.fail("id %d delivered again after its ack was durable (earlier deliveries %s)" % (n, previous))
        if n in self.run_seen:
            self.fail("id %d delivered twice in one broker run" % n)
        elif previous and not redelivered:
            self.fail("id %d delivered again with redelivered=false (earlier deliveries %s)" % (n, previous))
        if self.run_delivered and n <= self.run_delivered[-1]:
            self.fail("id %d delivered after id %d in the same run (publish order)" % (n, self.run_delivered[-1]))
        previous.append((self.run, redelivered))
        self.run_seen.add(n)
        self.run_delivered.append(n)
        return n

    def check_run_gaps(self) -> None:
        """I1 within a run: deliveries follow queue order, so every id that
        had to be in the queue at the restart and lies below the highest id
        delivered in this run was delivered in this run."""
        if not self.run_delivered:
            return
        top = max(self.run_delivered)
        missing = [n for n in self.must_at_start if n < top and n not in self.run_seen]
        if missing:
            self.fail("%d confirmed, never-acked id(s) skipped by the consumer (below id %d): %s"
                      % (len(missing), top, missing[:10]))

    def check_all_delivered(self, final_run: int) -> None:
        """I1 at the end, after the final drain."""
        never = sorted(n for n in self.confirmed if n not in self.deliveries)
        if never:
            self.fail("%d confirmed id(s) never delivered: %s" % (len(never), never[:10]))
        not_in_drain = sorted(n for n in self.confirmed - self.ack_sent
                              if final_run not in (r for r, _ in self.deliveries.get(n, ())))
        if not_in_drain:
            self.fail("%d confirmed id(s) never acked and missing from the final drain: %s"
                      % (len(not_in_drain), not_in_drain[:10]))


# -- publisher and consumer --------------------------------------------------------------


class Publisher:
    def __init__(self, client: Client, history: History, cap: int, max_backlog: int) -> None:
        self.client = client
        self.history = history
        self.cap = cap  # publishes at most this many in this run
        self.max_backlog = max_backlog
        self.outstanding: dict[int, int] = {}  # delivery tag -> id
        self.next_tag = 1
        self.count = 0
        self.wake = asyncio.Event()
        client.on_confirm = self._confirm

    def _confirm(self, channel: int, tag: int, multiple: bool, nack: bool) -> None:
        done = [t for t in self.outstanding if t <= tag] if multiple else [tag]
        for t in done:
            n = self.outstanding.pop(t, None)
            if n is None:
                self.history.fail("publisher confirm for unknown delivery tag %d" % t)
                continue
            (self.history.nacked if nack else self.history.confirmed).add(n)
        self.wake.set()

    async def run(self, ready: asyncio.Event) -> None:
        client, history = self.client, self.history
        await client.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        ready.set()
        while client.is_open:
            if (len(self.outstanding) >= WINDOW or self.count >= self.cap
                    or history.backlog >= self.max_backlog):
                self.wake.clear()
                waiter = asyncio.ensure_future(self.wake.wait())
                await asyncio.wait((waiter, client.lost), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            batch = []
            for _ in range(min(16, WINDOW - len(self.outstanding))):
                n = history.next_id
                history.next_id += 1
                history.published[n] = history.run
                history.run_published += 1
                self.outstanding[self.next_tag] = n
                self.next_tag += 1
                self.count += 1
                batch.append(publish_frames(1, QUEUE, body_for(n), client.frame_max))
            client.write(b"".join(batch))
            await asyncio.sleep(0)  # let confirms and deliveries in


class Consumer:
    def __init__(self, client: Client, history: History, prefetch: int, ack_every: int,
                 wake_publisher=None) -> None:
        self.client = client
        self.history = history
        self.prefetch = prefetch
        self.ack_every = ack_every
        self.unacked: list[tuple[int, int | None]] = []  # (delivery tag, id)
        self.acked_since_marker: list[int] = []
        self.markers: dict[int, list[int]] = {}  # marker confirm tag -> ids acked before it
        self.marker_tag = 0
        self.settled = asyncio.Event()  # no ack waits for a marker's confirm
        self.wake_publisher = wake_publisher
        client.on_delivery = self._delivery
        client.on_confirm = self._confirm

    def _delivery(self, channel: int, deliver, body: bytes) -> None:
        n = self.history.delivered(body, deliver.redelivered)
        self.unacked.append((deliver.delivery_tag, n))
        if len(self.unacked) >= self.ack_every:
            self.ack_all()

    def ack_all(self) -> None:
        if not self.unacked:
            return
        tag = self.unacked[-1][0]
        if not self.client.ack(tag, multiple=len(self.unacked) > 1):
            return
        ids = [n for _t, n in self.unacked if n is not None]
        self.unacked.clear()
        self.history.ack_sent.update(ids)
        self.history.run_acked += len(ids)
        self.history.totals["acks"] += 1
        self.acked_since_marker.extend(ids)
        if not self.markers:
            self.send_marker()
        if self.wake_publisher is not None:
            self.wake_publisher()

    def send_marker(self) -> None:
        if not self.acked_since_marker:
            return
        if self.client.write(publish_frames(1, MARKERS, b"marker", self.client.frame_max)):
            self.marker_tag += 1
            self.markers[self.marker_tag] = self.acked_since_marker
            self.acked_since_marker = []
            self.history.totals["markers"] += 1

    def _confirm(self, channel: int, tag: int, multiple: bool, nack: bool) -> None:
        done = [t for t in self.markers if t <= tag] if multiple else [tag]
        for t in done:
            ids = self.markers.pop(t, None)
            if ids is None:
                self.history.fail("marker confirm for unknown delivery tag %d" % t)
            elif not nack:
                self.history.durably_acked.update(ids)
        if not self.markers:
            self.send_marker()
        if not self.markers and not self.acked_since_marker:
            self.settled.set()

    async def start(self) -> None:
        client = self.client
        await client.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        await client.call(commands.Basic.Qos(prefetch_count=self.prefetch), commands.Basic.QosOk)
        await client.call(commands.Basic.Consume(queue=QUEUE, consumer_tag="crash"), commands.Basic.ConsumeOk)

    async def settle(self) -> None:
        """Ack everything received and wait until a marker confirmed it."""
        self.settled.clear()
        self.ack_all()
        self.send_marker()
        if self.markers or self.acked_since_marker:
            settled = asyncio.ensure_future(self.settled.wait())
            await asyncio.wait((settled, self.client.lost), timeout=30, return_when=asyncio.FIRST_COMPLETED)
            settled.cancel()
        if self.markers or self.acked_since_marker:
            raise RuntimeError("the acks of the final drain were not confirmed durable by a marker")


# -- the broker ---------------------------------------------------------------------------


@dataclass
class Settings:
    cycles: int = 24
    seed: int | None = None
    delay: tuple = (0.15, 0.8)  # seconds between the clients being ready and the kill
    fill_cap: int = 800  # publishes per fill cycle at most
    mixed_cap: int = 2000  # publishes per mixed cycle at most
    max_backlog: int = 2500  # the publisher waits while this many are published and not acked
    start_limit: float = 5.0  # seconds from exec to listening
    flags: tuple = BROKER_FLAGS
    log: object = print  # progress lines


KINDS = ("mixed", "fill", "drain", "mixed", "fill", "fill", "drain", "drain")
PREFETCH = (50, 200, 1, 20, 500, 100)


def plan(cycle: int) -> dict:
    """What cycle `cycle` does: fixed, so a failure names a reproducible cycle."""
    prefetch = PREFETCH[cycle % len(PREFETCH)]
    return {
        "kind": KINDS[cycle % len(KINDS)],
        "torn": cycle % 5 == 4,
        "prefetch": prefetch,
        "ack_every": max(1, prefetch // 4),
    }


_ALLOWED_LOG = (
    re.compile(r"torn tail of \d+ bytes after offset \d+ truncated"),
    re.compile(r"queue index .*: \d+ entries in \d+ segment\(s\), \d+ records, 0 corrupt region\(s\), "
               r"\d+ torn bytes, 0 invalid record\(s\)"),
)
_ALARMING = re.compile(r"\[(ERROR|WARNING|CRITICAL)\]|Traceback")
_STORE_RECOVERED = re.compile(r"msg_store_persistent recovered: \d+ file\(s\), (\d+) message\(s\)")


def log_problems(text: str) -> list[str]:
    """Lines of a broker log that report damage other than a torn tail, or a crash."""
    return [line for line in text.splitlines()
            if _ALARMING.search(line) and not any(p.search(line) for p in _ALLOWED_LOG)]


def tear(data_dir: Path) -> list[str]:
    """Append a cut-short record (a length saying 256 bytes, then 8 bytes) to
    the newest segment of the queue's index and to the newest message store
    file: what a write interrupted mid-record leaves. Returns the paths. On
    a node of several shards, in the directory of the shard that holds the
    queue (DATA_DIR or DATA_DIR/shards/K: docs/scaling.md)."""
    shards = [data_dir, *sorted((data_dir / "shards").glob("*"))]
    vhost = next((root / "vhosts" / dir_name("/") for root in shards
                  if (root / "vhosts" / dir_name("/") / "queues" / dir_name(QUEUE)).is_dir()),
                 data_dir / "vhosts" / dir_name("/"))
    torn = []
    for directory, suffix in ((vhost / "queues" / dir_name(QUEUE), ".idx"), (vhost / "msg_store_persistent", ".rdq")):
        files = [p for p in directory.glob("*" + suffix) if p.stem.isdigit()] if directory.is_dir() else []
        if files:
            newest = max(files, key=lambda p: int(p.stem))
            with open(newest, "ab") as f:
                f.write(struct.pack(">I", 256) + b"torn-rec")
            torn.append(str(newest))
    return torn


class Crasher:
    """The cycles on one data directory under `workdir`: `await
    Crasher(workdir, settings).run()` returns a summary, or raises
    AssertionError naming the seed and every violation found."""

    def __init__(self, workdir: Path, settings: Settings) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "crash-data"
        self.settings = settings
        self.seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(2 ** 32)
        self.rng = random.Random(self.seed)
        self.history = History()
        self.broker: BrokerProcess | None = None
        self.start_times: list[float] = []
        self.checked_lines = 0  # broker log lines already checked
        self.store_recovered: list[int] = []  # message store entries each start recovered
        self.summary: dict = {}

    # -- broker processes

    def start(self, torn: list[str] = (), clean: bool = False) -> BrokerProcess:
        began = time.monotonic()
        broker = launch(self.workdir, "--data-dir", str(self.data_dir), *self.settings.flags)
        elapsed = time.monotonic() - began
        broker.data_dir = self.data_dir
        self.broker = broker
        self.start_times.append(elapsed)
        self.history.new_run()
        history = self.history
        if elapsed > self.settings.start_limit:
            history.fail("broker took %.1f s to start (limit %.1f s)" % (elapsed, self.settings.start_limit))
        if history.run > 0:
            dirty = "no clean-shutdown marker" in broker.log
            if dirty == clean:
                history.fail("start after a %s did%s report a dirty start" % (
                    "clean stop" if clean else "kill -9", "" if dirty else " not"))
        for path in torn:
            if not re.search(re.escape(path) + r": torn tail of \d+ bytes", broker.log):
                history.fail("the torn record appended to %s was not reported" % path)
        for line in log_problems(broker.log):
            history.fail("broker start logged: %s" % line.strip())
        recovered = _STORE_RECOVERED.search(broker.log)
        self.store_recovered.append(int(recovered.group(1)) if recovered else 0)
        self.checked_lines = len(broker.log_lines)
        return broker

    def kill(self) -> None:
        broker = self.broker
        broker.process.send_signal(signal.SIGKILL)
        broker.process.wait()
        for line in log_problems("".join(broker.log_lines[self.checked_lines:])):
            self.history.fail("broker logged before the kill: %s" % line.strip())

    def stop(self) -> None:
        broker = self.broker
        broker.stop()
        if broker.process.returncode != 0:
            self.history.fail("clean stop exited with %s" % broker.process.returncode)
        for line in log_problems("".join(broker.log_lines[self.checked_lines:])):
            self.history.fail("broker logged: %s" % line.strip())

    async def inspect(self) -> int:
        """Declare the queues (idempotent), purge the markers, and return the
        queue's ready count."""
        client = await connect(self.broker.port)
        try:
            await client.call(commands.Queue.Declare(queue=QUEUE, durable=True), commands.Queue.DeclareOk)
            await client.call(commands.Queue.Declare(queue=MARKERS, durable=True), commands.Queue.DeclareOk)
            await client.call(commands.Queue.Purge(queue=MARKERS), commands.Queue.PurgeOk)
            ok = await client.call(commands.Queue.Declare(queue=QUEUE, passive=True), commands.Queue.DeclareOk)
            return ok.message_count
        finally:
            await close(client)

    # -- one cycle

    async def cycle(self, number: int) -> list[str]:
        step = plan(number)
        history = self.history
        ready_count = await self.inspect()
        history.check_ready_count(ready_count)
        clients: list[Client] = []
        tasks = []
        ready: list[asyncio.Event] = []
        publisher = None
        if step["kind"] in ("mixed", "fill"):
            client = await connect(self.broker.port)
            clients.append(client)
            cap = self.settings.fill_cap if step["kind"] == "fill" else self.settings.mixed_cap
            publisher = Publisher(client, history, cap, self.settings.max_backlog)
            event = asyncio.Event()
            ready.append(event)
            tasks.append(asyncio.ensure_future(publisher.run(event)))
        if step["kind"] in ("mixed", "drain"):
            client = await connect(self.broker.port)
            clients.append(client)
            consumer = Consumer(client, history, step["prefetch"], step["ack_every"],
                                publisher.wake.set if publisher else None)
            await consumer.start()
        for event in ready:
            await asyncio.wait_for(event.wait(), 10)
        delay = self.rng.uniform(*self.settings.delay)
        await asyncio.sleep(delay)  # the random moment of the crash
        self.kill()
        await asyncio.wait_for(asyncio.gather(*(c.lost for c in clients)), 10)
        for task in tasks:
            try:
                await asyncio.wait_for(task, 10)
            except ConnectionLost:
                pass
        for client in clients:
            if client.server_close is not None:
                history.fail("the broker closed a client: %r" % client.server_close)
        history.check_run_gaps()
        torn = tear(self.data_dir) if step["torn"] else []
        self.settings.log("cycle %3d %-5s%s delay %.2fs ready %5d | published %6d confirmed %6d "
                          "delivered %6d acked %6d durable %6d | start %.2fs" % (
                              number, step["kind"], "+torn" if torn else "      ", delay, ready_count,
                              len(history.published), len(history.confirmed), len(history.deliveries),
                              len(history.ack_sent), len(history.durably_acked), self.start_times[-1]))
        return torn

    async def final_drain(self) -> int:
        """Consume until the queue is empty; returns how many came."""
        history = self.history
        history.check_ready_count(await self.inspect())
        client = await connect(self.broker.port)
        try:
            consumer = Consumer(client, history, prefetch=500, ack_every=100)
            before = len(history.run_delivered)
            await consumer.start()
            await client.call(commands.Channel.Open(), commands.Channel.OpenOk, 2)
            deadline = time.monotonic() + 60
            while True:
                # Same connection: deliveries dispatched before this reply arrive before it.
                ok = await client.call(commands.Queue.Declare(queue=QUEUE, passive=True),
                                       commands.Queue.DeclareOk, 2)
                if ok.message_count == 0:
                    break
                if time.monotonic() > deadline:
                    history.fail("final drain did not empty the queue: %d ready" % ok.message_count)
                    break
                await asyncio.sleep(0.05)
            await consumer.settle()
            history.check_run_gaps()
            return len(history.run_delivered) - before
        finally:
            await close(client)

    async def run(self) -> dict:
        settings, history = self.settings, self.history
        settings.log("crash cycles: seed %d, data dir %s" % (self.seed, self.data_dir))
        torn: list[str] = []
        where = "the first start"
        try:
            self.start()
            for number in range(settings.cycles):
                where = "cycle %d (%s)" % (number, plan(number)["kind"])
                if number:
                    self.start(torn)
                torn = await self.cycle(number)
                self.raise_violations(where)
            where = "the final drain"
            self.start(torn)
            drained = await self.final_drain()
            history.check_all_delivered(history.run)
            self.raise_violations(where)
            # Every ack of the drain is durable: a kill now must not bring anything back.
            where = "the restarts after the final drain"
            self.kill()
            self.start()
            left = await self.inspect()
            if left:
                history.fail("%d message(s) back after the drain's acks were durable" % left)
            self.stop()
            self.start(clean=True)
            left = await self.inspect()
            if left:
                history.fail("%d message(s) after a clean restart of the empty queue" % left)
            self.stop()
            self.raise_violations(where)
        except (AssertionError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a broker that did not start, a client that timed out, ...
            history.fail("%s: %s" % (type(exc).__name__, exc))
            self.raise_violations(where)
        finally:
            if self.broker is not None and self.broker.process.poll() is None:
                self.broker.process.kill()
                self.broker.process.wait()
        self.summary = {
            "seed": self.seed,
            "cycles": settings.cycles,
            "published": len(history.published),
            "confirmed": len(history.confirmed),
            "nacked": len(history.nacked),
            "delivered_ids": len(history.deliveries),
            "deliveries": history.totals["deliveries"],
            "redelivered": history.totals["redelivered"],
            "acks_sent": history.totals["acks"],
            "durably_acked": len(history.durably_acked),
            "final_drain": drained,
            "max_store_messages_recovered": max(self.store_recovered),
            "max_start_s": round(max(self.start_times), 2),
            "mean_start_s": round(sum(self.start_times) / len(self.start_times), 2),
        }
        return self.summary

    def raise_violations(self, where: str) -> None:
        violations = self.history.violations
        if not violations:
            return
        tail = "".join(self.broker.log_lines[-15:]) if self.broker else ""
        raise AssertionError(
            "crash test failed at %s (seed %d: HUTCH_CRASH_SEED=%d for the test, --seed %d for the soak; "
            "data dir %s): %d violation(s):\n  %s\nlast broker log lines:\n%s" % (
                where, self.seed, self.seed, self.seed, self.data_dir, len(violations),
                "\n  ".join(violations[:25]), tail))
