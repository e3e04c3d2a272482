"""Cost of the management API's history (amqp_server/management/history.py)
with 10,000 queues, exchanges and channels: memory and CPU (docs/management.md,
"History").

Two parts:

1. The worst case, in this process: --queues tracks of a queue's fields at
   RabbitMQ's "basic" retention, every field changing at every 5 s sample
   for the whole retention (an hour and 605 s of samples, on a simulated
   clock), measured with tracemalloc; then the same tracks idle (values
   that never change). This is what the history can hold at most and at
   least per queue, whatever the traffic. The same for as many exchanges
   (publish_in, publish_out) and channels (their 12 message_stats), also
   kept at "basic" retention.
2. A real broker from this checkout (the tests' launcher, free ports) with
   --queues queues (one definitions import): its resident memory, the
   broker CPU time of one sample of every queue (the sampler's tick, read
   from /proc/<pid>/stat over --idle seconds of 5 s ticks), and of the
   requests that read the history (mean of --repeat).

    python bench/management_history.py [--queues 10000] [--idle 30] [--repeat 10] [--tracks-only]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from amqp_server.management.history import BASIC, Track  # noqa: E402
from amqp_server.management.rates import CHANNEL_STATS, EXCHANGE_STATS, QUEUE_FIELDS  # noqa: E402
from conftest import launch  # noqa: E402
from http_api import Api  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_MS = 5000
RANGES = "lengths_age=%d&lengths_incr=%d&msg_rates_age=%d&msg_rates_incr=%d"
REQUESTS = [
    ("overview, last 10 minutes", "/api/overview?" + RANGES % (600, 5, 600, 5)),
    ("overview, last day", "/api/overview?" + RANGES % (86400, 1800, 86400, 1800)),
    ("one queue, last 10 minutes", "/api/queues/%2F/q-00000?" + RANGES % (600, 5, 600, 5)),
    ("queues, page of 100 by name, last 10 minutes",
     "/api/queues?page=1&page_size=100&sort=name&" + RANGES % (600, 5, 600, 5)),
    ("queues, page of 100 by name, no range", "/api/queues?page=1&page_size=100&sort=name"),
]


def cpu_seconds(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def resident(pid: int) -> int:
    with open("/proc/%d/statm" % pid) as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


KINDS = (("queue", QUEUE_FIELDS), ("exchange", EXCHANGE_STATS), ("channel", CHANNEL_STATS))


def held(queues: int, busy: bool, fields: tuple = QUEUE_FIELDS) -> tuple[int, float]:
    """(bytes the tracks of `queues` objects with `fields` hold after a full
    retention of samples, CPU seconds per sample of all of them, timed over
    a minute of samples after that, without tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracks = [Track(fields, BASIC) for _ in range(queues)]
    width = len(fields)

    def sample(tick: int) -> None:
        for i, track in enumerate(tracks):
            values = tuple(range(tick + i, tick + i + width)) if busy else (i,) * width
            track.record(tick * SAMPLE_MS, values, SAMPLE_MS / 1000)

    # The state a full retention of 5 s samples leaves: the hour's tier keeps
    # one point a minute, so a sample a minute (12 ticks) until the last
    # 605 s, then every 5 s sample (the same points, a fifth of the work).
    hour, recent = BASIC[-1][0] * 1000 // SAMPLE_MS, BASIC[0][0] * 1000 // SAMPLE_MS
    for tick in [*range(0, hour, 12), *range(hour, hour + recent + 1)]:
        sample(tick)
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    started = time.process_time()
    last = hour + recent + 1
    for tick in range(last, last + 12):
        sample(tick)
    return size, (time.process_time() - started) / 12


def main(args) -> None:
    for kind, fields in KINDS:
        print("1. the history's own cost, %d %ss, a full retention (%s) of 5 s samples:" % (args.queues, kind, BASIC))
        for busy in (True, False):
            size, cpu = held(args.queues, busy, fields)
            print("  %-44s %8.1f MiB (%5.0f bytes per %s), %6.1f ms CPU a sample" % (
                "every field changing at every sample" if busy else "idle (no value changes)", size / 2**20,
                size / args.queues, kind, cpu * 1000))
    if args.tracks_only:
        return

    broker = launch(Path(tempfile.mkdtemp(prefix="hutch-bench-")), expect=("AMQP", "HTTP"))
    try:
        api = Api(broker.ports["HTTP"])
        pid = broker.process.pid
        before = resident(pid)
        api.post("/api/definitions", {"queues": [
            {"name": "q-%05d" % i, "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}}
            for i in range(args.queues)]})
        time.sleep(args.idle / 2)  # a few samples of every queue
        spent = cpu_seconds(pid)
        time.sleep(args.idle)
        tick = (cpu_seconds(pid) - spent) / (args.idle / 5)
        print("2. a broker with %d idle queues: resident %.0f MiB (%.0f MiB before the queues); "
              "%.1f ms CPU a 5 s sample; %s" % (args.queues, resident(pid) / 2**20, before / 2**20, tick * 1000,
                                                "broker CPU per request (mean of %d):" % args.repeat))
        for label, path in REQUESTS:
            spent = cpu_seconds(pid)
            for _ in range(args.repeat):
                assert api.get(path).status == 200
            print("  %-52s %8.1f ms" % (label, (cpu_seconds(pid) - spent) * 1000 / args.repeat))
    finally:
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of 5 s samples to measure")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--tracks-only", action="store_true", help="part 1 only")
    main(parser.parse_args())
