#!/usr/bin/env python3
"""What a hop between shards costs, A/B: `--base` (exported with `git archive`, as bench/ab.py
does) against this checkout, in two measures (docs/scaling.md, "Records between shards").

    python bench/hop_ab.py --base b3e1dd3 --repeat 5
    python bench/hop_ab.py --base b3e1dd3 --records-only

Records: in a process of each side's own, two of its Links (amqp_server.shards.link) over a
socketpair, its Mesh.received their reader's handler (the kind's check and the dispatch, to
handlers that do nothing): the CPU per record from `send` to its handler, publishes and
deliveries of 16 B, 10 or 100 sent per loop turn, the least of 5 runs of 20,000.

End to end: a fresh node of 2 shards per run (moves off), a durable queue on shard 1, a raw
producer at a fixed rate and a raw consumer both on shard 0, so that every message crosses
twice (its publish to the owner, its delivery back; credits or settles follow): the broker's CPU
(the supervisor's and the shards') over the window, per message consumed. Both sides do the
same work at the same rate, so CPU per message is the figure; the sides alternate (A then B,
then B then A).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ab import build_extension, export  # noqa: E402
from harness import ROOT, fresh_hutch, tree_cpu_seconds  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests"))
from amqp_raw import RawClient, raw_frame_bytes  # noqa: E402
from pamqp import commands, constants, frame  # noqa: E402

# Run inside a tree (its directory first on sys.path): prints CPU µs per record.
RECORDS_PROBE = r"""
import asyncio, os, socket, time
from amqp_server.shards.link import Link
from amqp_server.shards.mesh import Mesh

class Receiver:
    here = 0
    _handlers = {kind: (lambda link, *fields: None) for kind in ("pub", "deliver")}

def per_record(kind, per_turn, total=20000):
    async def main():
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        got = [0]
        receiver = Receiver()
        def handler(link, record):
            Mesh.received(receiver, link, record)
            got[0] += 1
        nothing = lambda *args: None
        _, sender = await loop.create_connection(lambda: Link(nothing, nothing, nothing), sock=a)
        await loop.create_connection(lambda: Link(handler, nothing, nothing), sock=b)
        # Each its own objects, as each message's are (pickle writes an object it saw once as a reference).
        made = iter([("pub", "/", ["q"], "", "key", os.urandom(14), os.urandom(16), 0) if kind == "pub" else
                     ("deliver", 1, i, False, 0, "", "key", os.urandom(14), os.urandom(16), None)
                     for i in range(total)])
        started = time.process_time()
        for _ in range(total // per_turn):
            for _ in range(per_turn):
                sender.send(next(made))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        while got[0] < total:
            await asyncio.sleep(0)
        return (time.process_time() - started) / total * 1e6
    try:
        import uvloop  # the broker's loop when installed
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    return min(run(main()) for _ in range(5))

for kind in ("pub", "deliver"):
    for per_turn in (10, 100):
        print(kind, per_turn, "%.3f" % per_record(kind, per_turn), flush=True)
"""


def records(tree: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RECORDS_PROBE], cwd=tree, capture_output=True, text=True,
                         check=True).stdout
    return {(kind, int(per)): float(us) for kind, per, us in (line.split() for line in out.splitlines())}


def on_shard_0(port: int) -> RawClient:
    for _ in range(200):
        raw = RawClient.connected(port, channels=(1,))
        if raw.start.server_properties["shard"] == 0:
            return raw
        raw.close()
    raise RuntimeError("no connection landed on shard 0")


def produce(port: int, queue: str, size: int, rate: int, stop) -> None:
    """Publishes in writes of 10, `rate` a second."""
    raw = on_shard_0(port)
    batch = raw.publish_bytes(queue, b"x" * size) * 10
    raw.sock.settimeout(None)
    step, due = 10 / rate, time.monotonic()
    while not stop.is_set():
        raw.sock.sendall(batch)
        due += step
        time.sleep(max(0.0, due - time.monotonic()))


def consume(port: int, queue: str, size: int, acks: bool, count, ready, stop) -> None:
    """Counts deliveries by their bytes (each the same size); with `acks`, prefetch 100 and a
    multiple ack every 10."""
    raw = on_shard_0(port)
    if acks:
        raw.send_frame(commands.Basic.Qos(prefetch_count=100), 1)
        raw.expect(commands.Basic.QosOk, 1)
    raw.send_frame(commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=not acks), 1)
    raw.expect(commands.Basic.ConsumeOk, 1)
    each = (len(frame.marshal(commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key=queue), 1))
            + len(raw_frame_bytes(constants.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, size, 0)))
            + len(raw_frame_bytes(constants.FRAME_BODY, 1, b"x" * size)))
    received, acked = len(raw.buf), 0
    raw.sock.settimeout(None)
    ready.set()
    while not stop.is_set():
        data = raw.sock.recv(1 << 20)
        if not data:
            return
        received += len(data)
        count.value = received // each
        if acks and count.value - acked >= 10:
            acked = count.value - count.value % 10
            raw.send_frame(commands.Basic.Ack(delivery_tag=acked, multiple=True), 1)


def end_to_end(tree: str, size: int, acks: bool, rate: int, warmup: float, duration: float) -> tuple:
    """(broker CPU µs per message, msg/s consumed) of one run."""
    with fresh_hutch(["--shards", "2", "--shard-moves", "false"], tree) as hutch:
        setup = on_shard_0(hutch.port)
        names = []
        for i in range(2):  # the first goes to shard 0 (ties go to the declaring shard), the second to 1
            setup.send_frame(commands.Queue.Declare(queue="hop-%d" % i, durable=True), 1)
            names.append(setup.expect(commands.Queue.DeclareOk, 1).queue)
        db = sqlite3.connect(os.path.join(hutch.data_dir, "definitions.db"))
        shard_of = dict(db.execute("SELECT name, shard FROM queues").fetchall())
        db.close()
        queue = next(name for name in names if shard_of.get(name) == 1)
        stop, ready, count = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Value("q", 0)
        consumer = multiprocessing.Process(target=consume, args=(hutch.port, queue, size, acks, count, ready, stop))
        producer = multiprocessing.Process(target=produce, args=(hutch.port, queue, size, rate, stop))
        consumer.start()
        ready.wait(10)
        producer.start()
        try:
            time.sleep(warmup)
            cpu0, n0, t0 = tree_cpu_seconds(hutch.pid), count.value, time.monotonic()
            time.sleep(duration)
            cpu1, n1, t1 = tree_cpu_seconds(hutch.pid), count.value, time.monotonic()
        finally:
            stop.set()
            for process in (producer, consumer):
                process.terminate()
                process.join()
            setup.close()
        return (cpu1 - cpu0) * 1e6 / (n1 - n0), (n1 - n0) / (t1 - t0)


WORKLOADS = [("16 B, autoack, 20,000 msg/s", 16, False, 20000),
             ("1 KiB, acks (prefetch 100, multi-ack 10), 10,000 msg/s", 1024, True, 10000)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision of side A")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--duration", type=float, default=6)
    p.add_argument("--warmup", type=float, default=2)
    p.add_argument("--records-only", action="store_true", help="the in-process measure only")
    args = p.parse_args(argv)
    tree = export(args.base)
    try:
        built = build_extension(tree)
        sides = {"A": tree, "B": ROOT}
        found = {side: records(root) for side, root in sides.items()}
        print("A = %s%s, B = this checkout\n" % (args.base, "" if built else " (C extension not built)"))
        print("| record, per loop turn | A CPU µs per record | B | B / A |")
        print("|---|---|---|---|")
        for key in found["A"]:
            print("| %s, %d | %.2f | %.2f | %.2f |" % (*key, found["A"][key], found["B"][key],
                                                      found["B"][key] / found["A"][key]))
        if args.records_only:
            return 0
        runs: dict = {}
        for repeat in range(args.repeat):
            for name, size, acks, rate in WORKLOADS:
                for side in ("AB" if repeat % 2 == 0 else "BA"):
                    cpu, consumed = end_to_end(sides[side], size, acks, rate, args.warmup, args.duration)
                    print("%s %s: %.2f µs/msg, %.0f msg/s" % (name, side, cpu, consumed), file=sys.stderr, flush=True)
                    runs.setdefault((name, side), []).append((cpu, consumed))
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print("\n| workload | A CPU µs/msg | B CPU µs/msg | B / A | A msg/s | B msg/s | runs A; B (µs/msg) |")
    print("|---|---|---|---|---|---|---|")
    for name, _size, _acks, _rate in WORKLOADS:
        a, b = runs[(name, "A")], runs[(name, "B")]
        ca, cb = statistics.median(r[0] for r in a), statistics.median(r[0] for r in b)
        print("| %s | %.2f | %.2f | %.3f | %.0f | %.0f | %s; %s |" % (
            name, ca, cb, cb / ca, statistics.median(r[1] for r in a), statistics.median(r[1] for r in b),
            " ".join("%.2f" % r[0] for r in a), " ".join("%.2f" % r[0] for r in b)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
