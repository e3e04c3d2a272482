#!/usr/bin/env python3
"""Shovel throughput: 1 KiB persistent messages moved by an on-confirm
dynamic shovel, hutch -> hutch against RabbitMQ -> RabbitMQ in the same run.

hutch: two hutch processes from this checkout (fresh data directories); the
shovel runs on the source node ("amqp://" source, the other node's URI as
destination). RabbitMQ: the node at --rabbitmq-url (the shared one on 5672
by default) with its shovel plugin, between two fresh vhosts of it (one
node is all this machine has). Each run preloads --count messages into the
source queue (confirmed), then sets the shovel and times until the
destination queue holds them all. Reported per run: messages per second of
wall time, and CPU seconds per 1000 messages of the broker processes (the
two hutch processes; RabbitMQ's beam.smp, which also serves whatever else
the shared node does) read from /proc/<pid>/stat, which a loaded machine
disturbs less than wall time. Runs alternate hutch, RabbitMQ, --repeat times.

    python bench/shovel_throughput.py                       # 20,000 messages, once
    python bench/shovel_throughput.py --count 200000 --repeat 3
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench"), str(ROOT)]

import shovel_crash  # noqa: E402  (publish and ready over aiormq)
from conftest import launch  # noqa: E402
from harness import cpu_seconds, rabbitmq_pid  # noqa: E402
from http_api import Api, segment  # noqa: E402


def wait_landed(url: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if asyncio.run(shovel_crash.ready(url, "dst")) >= count:
                return
        except Exception:  # noqa: BLE001 - the shovel declares the queue when it starts
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the destination did not reach %d messages in %.0f s" % (count, timeout))
        time.sleep(0.05)


def shovel_value(src: str, dest: str, prefetch: int) -> dict:
    return {"src-uri": src, "src-queue": "src", "dest-uri": dest, "dest-queue": "dst", "ack-mode": "on-confirm",
            "src-prefetch-count": prefetch}


def run_hutch(args, workdir: Path) -> tuple[float, float]:
    a = launch(workdir, expect=("AMQP", "HTTP"))
    b = launch(workdir, expect=("AMQP", "HTTP"))
    try:
        asyncio.run(shovel_crash.publish(a.url, "src", args.count, size=args.size))
        pids = (a.process.pid, b.process.pid)
        cpu = sum(cpu_seconds(pid) for pid in pids)
        began = time.monotonic()
        reply = Api(a.ports["HTTP"]).put("/api/parameters/shovel/%2F/bench",
                                         {"value": shovel_value("amqp://", b.url, args.prefetch)})
        assert reply.status == 201, reply.body
        wait_landed(b.url, args.count, args.timeout)
        return time.monotonic() - began, sum(cpu_seconds(pid) for pid in pids) - cpu
    finally:
        a.stop()
        b.stop()


def run_rabbitmq(args) -> tuple[float, float]:
    parts = urllib.parse.urlsplit(args.rabbitmq_url)
    api = Api(args.rabbitmq_api_port, (parts.username or "guest", parts.password or "guest"))
    vhosts = ["shovel-bench-src-%d" % time.monotonic_ns(), "shovel-bench-dst-%d" % time.monotonic_ns()]
    uris = []
    for vhost in vhosts:
        assert api.put("/api/vhosts/" + segment(vhost)).status in (201, 204)
        api.put("/api/permissions/%s/%s" % (segment(vhost), api.auth[0]), {"configure": ".*", "write": ".*",
                                                                            "read": ".*"})
        uris.append(urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + segment(vhost), "", "")))
    try:
        asyncio.run(shovel_crash.publish(uris[0], "src", args.count, size=args.size))
        pid = rabbitmq_pid(args.rabbitmq_url)
        cpu = cpu_seconds(pid)
        began = time.monotonic()
        reply = api.put("/api/parameters/shovel/%s/bench" % segment(vhosts[0]),
                        {"value": shovel_value(uris[0], uris[1], args.prefetch)})
        assert reply.status == 201, reply.body
        wait_landed(uris[1], args.count, args.timeout)
        return time.monotonic() - began, cpu_seconds(pid) - cpu
    finally:
        for vhost in vhosts:
            api.delete("/api/vhosts/" + segment(vhost))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--prefetch", type=int, default=1000, help="src-prefetch-count (RabbitMQ's default)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--rabbitmq-api-port", type=int, default=15672)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, list] = {"hutch": [], "rabbitmq": []}
    workdir = Path(tempfile.mkdtemp(prefix="shovel-bench-"))
    try:
        for _ in range(args.repeat):
            results["hutch"].append(run_hutch(args, workdir))
            if not args.no_rabbitmq:
                results["rabbitmq"].append(run_rabbitmq(args))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("shovel, on-confirm, %d x %d B persistent, prefetch %d, median of %d" % (
        args.count, args.size, args.prefetch, args.repeat))
    print("%-10s %10s %10s %16s" % ("broker", "seconds", "msg/s", "CPU s/1000 msg"))
    rates = {}
    for name, runs in results.items():
        if not runs:
            continue
        seconds = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        rates[name] = args.count / seconds
        print("%-10s %10.2f %10.0f %16.3f" % (name, seconds, rates[name], cpu * 1000 / args.count))
    if len(rates) == 2:
        print("ratio hutch / RabbitMQ (msg/s): %.2f" % (rates["hutch"] / rates["rabbitmq"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
