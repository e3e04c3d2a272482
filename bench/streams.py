#!/usr/bin/env python3
"""Stream scenarios S9-S11 on hutch and RabbitMQ 3.10 streams, in the table of bench/scenarios.py.

    python bench/streams.py                                  # S9-S11 with 1,000,000 records, RSS read of 2 GiB
    python bench/streams.py --records 20000 --rss-gib 0.05   # a quick sanity run
    python bench/streams.py --no-rabbitmq

- S9: publish --records 1 KiB messages with confirms (a window of 100 unconfirmed) into a new stream.
- S10: read them from `first` with prefetch 1000 (acked multiple every 100), one consumer.
- S11: ten consumers, each on its own connection, read the same records from `first` at once.
- RSS: one consumer reads a stream of --rss-gib GiB from `first`; the broker's peak RSS meanwhile
  (the fill is not measured). Target: under 100 MiB.

amqpbench has no stream arguments, so the clients here are aiormq (one asyncio loop per
scenario, in this process): the same client for both brokers; with a Python client the rates
are bounded by the client too. The broker CPU time per message (/proc/<pid>/stat) is
load-independent and is the figure to compare on a busy machine. hutch is a fresh process
from this checkout per run (empty data directory); RabbitMQ is the node at --rabbitmq-url.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aiormq  # noqa: E402

from harness import (RssSampler, answers_amqp_uri, cpu_seconds, fresh_hutch, log, machine,  # noqa: E402
                     rabbitmq_pid, revision)
from results_table import Metric, Row, table  # noqa: E402

STREAM = {"x-queue-type": "stream"}
RATE = Metric("rate", "msg/s", ">= 1")
CPU = Metric("cpu_us", "broker CPU µs per message")
RSS = Metric("rss_mib", "peak RSS MiB while one consumer reads the stream from first", "< 100")


async def publish(uri: str, queue: str, count: int, size: int, window: int = 100) -> None:
    """`count` messages of `size` bytes with confirms, at most `window` unconfirmed."""
    connection = await aiormq.connect(uri)
    channel = await connection.channel(publisher_confirms=True)
    body = b"x" * size
    pending: set = set()
    for _ in range(count):
        if len(pending) >= window:
            _done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(asyncio.ensure_future(channel.basic_publish(body, routing_key=queue)))
    if pending:
        await asyncio.wait(pending)
    await connection.close()


async def read(uri: str, queue: str, count: int, prefetch: int = 1000) -> None:
    """Read `count` records from `first`, acking multiple every 100."""
    connection = await aiormq.connect(uri)
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=prefetch)
    done = asyncio.get_running_loop().create_future()
    seen = [0]

    async def on_message(message) -> None:
        seen[0] += 1
        if seen[0] % 100 == 0 or seen[0] == count:
            await channel.basic_ack(message.delivery.delivery_tag, multiple=True)
        if seen[0] == count and not done.done():
            done.set_result(None)

    await channel.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
    await done
    await connection.close()


def measured(pid: int, messages: int, run) -> dict:
    """Run `run()` (a coroutine factory), timing it and the broker's CPU."""
    cpu = cpu_seconds(pid)
    with RssSampler(pid) as rss:
        started = time.monotonic()
        asyncio.run(run())
        seconds = time.monotonic() - started
    used = cpu_seconds(pid) - cpu if cpu is not None else None
    return {"rate": messages / seconds, "cpu_us": used * 1e6 / messages if used is not None else None,
            "rss": rss.peak, "rss_mib": rss.peak / 2**20}


async def declare(uri: str, queue: str, delete: bool = False) -> None:
    connection = await aiormq.connect(uri)
    channel = await connection.channel()
    if delete:
        await channel.queue_delete(queue)
    else:
        await channel.queue_declare(queue, durable=True, arguments=STREAM)
    await connection.close()


def scenarios(uri: str, pid: int, args: argparse.Namespace) -> dict[str, dict]:
    name = "bench-stream-" + uuid.uuid4().hex[:8]
    n, out = args.records, {}
    asyncio.run(declare(uri, name))
    try:
        log("S9: publishing %d records" % n)
        out["S9"] = measured(pid, n, lambda: publish(uri, name, n, args.size))
        log("S10: reading them")
        out["S10"] = measured(pid, n, lambda: read(uri, name, n))
        log("S11: ten consumers reading them")

        async def ten() -> None:
            await asyncio.gather(*(read(uri, name, n) for _ in range(10)))
        out["S11"] = measured(pid, 10 * n, ten)
    finally:
        asyncio.run(declare(uri, name, delete=True))
    if args.rss_gib:
        big = "bench-stream-rss-" + uuid.uuid4().hex[:8]
        records = int(args.rss_gib * 2**30 // args.size)
        asyncio.run(declare(uri, big))
        try:
            log("RSS: filling %d records (%.2f GiB)" % (records, args.rss_gib))
            asyncio.run(publish(uri, big, records, args.size, window=500))
            log("RSS: reading them from first")
            out["RSS"] = measured(pid, records, lambda: read(uri, big, records))
        finally:
            asyncio.run(declare(uri, big, delete=True))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="records of S9-S11 (default 1,000,000)")
    p.add_argument("--size", type=int, default=1024, help="message bytes (default 1024)")
    p.add_argument("--rss-gib", type=float, default=2.0, help="GiB of the RSS read (0: skip; default 2)")
    p.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument("--hutch-arg", action="append", default=[], help="extra hutch flag (repeatable)")
    args = p.parse_args(argv)
    results: dict[str, dict[str, dict]] = {}
    with fresh_hutch(args.hutch_arg) as hutch:
        results["hutch"] = scenarios(hutch.uri, hutch.pid, args)
    if not args.no_rabbitmq:
        if not answers_amqp_uri(args.rabbitmq_url):
            sys.exit("RabbitMQ does not answer at %s (use --no-rabbitmq)" % args.rabbitmq_url)
        results["RabbitMQ"] = scenarios(args.rabbitmq_url, rabbitmq_pid(args.rabbitmq_url), args)
    theirs = results.get("RabbitMQ", {})
    rows = []
    for key, title in (("S9", "S9 publish 1 KiB, confirms"), ("S10", "S10 read from first, prefetch 1000"),
                       ("S11", "S11 ten consumers, same stream"), ("RSS", "RSS read from first")):
        if key not in results["hutch"]:
            continue
        mine = results["hutch"][key]
        other = theirs.get(key, {})
        for metric in ((RSS,) if key == "RSS" else (RATE, CPU)):
            rows.append(Row(title, metric, [mine.get(metric.key)], [other.get(metric.key)],
                            [mine.get("rss")], [other.get("rss")]))
    print("%s; %s; hutch %s; %d records of %d B%s\n" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine(), revision(), args.records, args.size,
        "; RSS read of %.2f GiB" % args.rss_gib if args.rss_gib else ""))
    print("`%s`\n" % " ".join(["python"] + sys.argv))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
