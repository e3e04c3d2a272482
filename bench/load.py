#!/usr/bin/env python3
"""Load: many connections, queues and bindings, and a mixed-workload soak.

Starts hutch on a free port with a fresh data directory, then runs, in order:

1. `--connections N` (1,000) concurrent connections with one open channel each
   (raw AMQP clients, heartbeats off), held open together;
2. `--queues N` (10,000) queues (non-durable, on one channel, pipelined);
3. `--bindings N` (100,000) bindings of those queues to a direct exchange;

reporting after each the broker's RSS growth divided by the count (memory per
connection, per queue, per binding: /proc/<pid>/status VmRSS) and the time
taken; then, with `--minutes M` (0 skips it), a mixed workload for M minutes:
publishers with confirms and consumers with acks on a few queues, plus churn
(connections opened and closed, queues declared and deleted, polled gets),
sampling RSS every 10 s and reporting its drift and every error seen.

    python bench/load.py --minutes 1                 # the short variants
    python bench/load.py --minutes 30                # the soak
    python bench/load.py --connections 200 --queues 1000 --bindings 10000 --minutes 0

Prints a JSON summary; exit status 1 if any error was seen.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import pika  # noqa: E402
from pamqp import commands, frame  # noqa: E402

from amqp_raw import RawClient  # noqa: E402  (needs the paths above)
from conftest import launch  # noqa: E402
from fuzz_session import broker_resources  # noqa: E402
from helpers import assert_serves  # noqa: E402

BATCH = 500  # pipelined methods between synchronous round trips


def rss(pid: int) -> int:
    return broker_resources(pid)[1]


def settle(pid: int) -> int:
    """RSS once it stops moving (the broker finished what we sent)."""
    last, stable = rss(pid), 0
    while stable < 3:
        time.sleep(0.2)
        now = rss(pid)
        stable = stable + 1 if abs(now - last) < 64 else 0
        last = now
    return last


def connections(port: int, pid: int, count: int) -> dict:
    before = settle(pid)
    started = time.monotonic()
    clients = [RawClient.connected(port, channels=(1,)) for _ in range(count)]
    elapsed = time.monotonic() - started
    after = settle(pid)
    assert_serves(port)
    for client in clients:
        client.close()
    return {"count": count, "seconds": round(elapsed, 1), "rss_kib_before": before, "rss_kib_after": after,
            "kib_per_connection": round((after - before) / count, 2)}


def pipelined(client: RawClient, methods: list) -> None:
    """Send nowait methods in batches, each batch followed by a synchronous
    Basic.Qos round trip so the broker has processed it."""
    for start in range(0, len(methods), BATCH):
        client.send(b"".join(frame.marshal(m, 1) for m in methods[start:start + BATCH]))
        client.send_frame(commands.Basic.Qos(prefetch_count=0), 1)
        client.expect(commands.Basic.QosOk, 1, timeout=120)


def queues_and_bindings(port: int, pid: int, queue_count: int, binding_count: int) -> tuple[dict, dict]:
    client = RawClient.connected(port, channels=(1,))
    client.timeout = 120
    names = ["load.q.%d" % i for i in range(queue_count)]
    before = settle(pid)
    started = time.monotonic()
    pipelined(client, [commands.Queue.Declare(queue=name, nowait=True) for name in names])
    elapsed = time.monotonic() - started
    after = settle(pid)
    queues = {"count": queue_count, "seconds": round(elapsed, 1), "rss_kib_before": before, "rss_kib_after": after,
              "kib_per_queue": round((after - before) / queue_count, 2)}
    pipelined(client, [commands.Exchange.Declare(exchange="load.x", exchange_type="direct", nowait=True)])
    before = settle(pid)
    started = time.monotonic()
    pipelined(client, [commands.Queue.Bind(queue=names[i % queue_count], exchange="load.x",
                                           routing_key="k.%d" % i, nowait=True) for i in range(binding_count)])
    elapsed = time.monotonic() - started
    after = settle(pid)
    bindings = {"count": binding_count, "seconds": round(elapsed, 1), "rss_kib_before": before,
                "rss_kib_after": after, "kib_per_binding": round((after - before) / binding_count, 3)}
    pipelined(client, [commands.Exchange.Delete(exchange="load.x", nowait=True)]
              + [commands.Queue.Delete(queue=name, nowait=True) for name in names])
    client.close()
    return queues, bindings


class Mixed:
    """The mixed workload: each kind of worker loops until `stop` is set."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.counts = {"published": 0, "consumed": 0, "connections": 0, "queues": 0, "gets": 0}
        self.lock = threading.Lock()

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def guard(self, work) -> None:
        while not self.stop.is_set():
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - every error is reported
                if not self.stop.is_set():
                    self.errors.append("%s: %r" % (work.__name__, exc))
                    time.sleep(1)

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))

    def publisher(self, queue: str):
        def publish() -> None:
            with self.connect() as connection:
                channel = connection.channel()
                channel.queue_declare(queue, durable=True)
                channel.confirm_delivery()
                properties = pika.BasicProperties(delivery_mode=2)
                while not self.stop.is_set():
                    for _ in range(50):
                        channel.basic_publish("", queue, b"m" * 512, properties)
                    self.add("published", 50)
                    # stay near the consumers' pace: the soak measures drift, not backlog
                    while channel.queue_declare(queue, passive=True).method.message_count > 5000:
                        connection.sleep(0.05)
        return publish

    def consumer(self, queue: str):
        def consume() -> None:
            with self.connect() as connection:
                channel = connection.channel()
                channel.queue_declare(queue, durable=True)
                channel.basic_qos(prefetch_count=100)
                for method, _props, _body in channel.consume(queue, inactivity_timeout=1):
                    if self.stop.is_set():
                        break
                    if method is not None:
                        channel.basic_ack(method.delivery_tag)
                        self.add("consumed")
        return consume

    def churn(self) -> None:
        with self.connect() as connection:
            channel = connection.channel()
            queue = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_bind(queue, "amq.topic", "churn.#")
            channel.basic_publish("amq.topic", "churn.x", b"c")
            channel.basic_get(queue, auto_ack=True)
            channel.queue_delete(queue)
        self.add("connections")
        self.add("queues")
        self.add("gets")

    def run(self, pid: int, minutes: float, pairs: int = 3) -> dict:
        threads = []
        for index in range(pairs):
            queue = "load.mixed.%d" % index
            threads += [threading.Thread(target=self.guard, args=(self.publisher(queue),)),
                        threading.Thread(target=self.guard, args=(self.consumer(queue),))]
        threads.append(threading.Thread(target=self.guard, args=(self.churn,)))
        for thread in threads:
            thread.start()
        samples = []
        started = time.monotonic()
        while time.monotonic() - started < minutes * 60:
            time.sleep(10)
            fds, resident = broker_resources(pid)
            samples.append((round(time.monotonic() - started), fds, resident))
            print("%5ds  rss %7d KiB  fds %5d  %s  errors %d" % (samples[-1][0], resident, fds, self.counts,
                                                                 len(self.errors)), file=sys.stderr, flush=True)
        self.stop.set()
        for thread in threads:
            thread.join(30)
        # drift: the last third of the run against the first third, after warm-up
        third = max(len(samples) // 3, 1)
        early = sum(s[2] for s in samples[:third]) / third
        late = sum(s[2] for s in samples[-third:]) / third
        return {"minutes": minutes, "counts": self.counts, "rss_kib_first_max_last":
                [samples[0][2], max(s[2] for s in samples), samples[-1][2]] if samples else [],
                "rss_drift_kib_last_third_vs_first_third": round(late - early),
                "fds_first_max_last": [samples[0][1], max(s[1] for s in samples), samples[-1][1]] if samples else [],
                "errors": self.errors[:20], "error_count": len(self.errors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=10000)
    parser.add_argument("--bindings", type=int, default=100000)
    parser.add_argument("--minutes", type=float, default=1.0, help="mixed-workload soak length; 0 skips it")
    args = parser.parse_args(argv)

    broker = launch(Path(tempfile.mkdtemp(prefix="hutch-load-")))
    pid = broker.process.pid
    summary: dict = {"rss_kib_idle": settle(pid)}
    try:
        if args.connections:
            summary["connections"] = connections(broker.port, pid, args.connections)
        if args.queues:
            summary["queues"], summary["bindings"] = queues_and_bindings(broker.port, pid, args.queues,
                                                                         args.bindings)
        if args.minutes:
            summary["mixed"] = Mixed(broker.port).run(pid, args.minutes)
        summary["broker_alive"] = broker.process.poll() is None
    finally:
        broker.stop()
    print(json.dumps(summary, indent=2))
    return 0 if summary.get("broker_alive") and not summary.get("mixed", {}).get("error_count") else 1


if __name__ == "__main__":
    sys.exit(main())
