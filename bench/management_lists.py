"""Cost of the management API's list pages with 10,000 queues and 1,000
connections (the web UI asks for one page at a time; docs/ui.md).

Starts a hutch from this checkout (the tests' launcher, free ports), declares
the queues (one definitions import) and opens the connections, then asks for
each page --repeat times and prints the broker's CPU time per request, read
from /proc/<pid>/stat (utime + stime), so the figure holds on a loaded
machine where wall-clock time does not.

    python bench/management_lists.py [--queues 10000] [--connections 1000] [--repeat 20]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import aiormq  # noqa: E402
from conftest import launch  # noqa: E402
from http_api import Api  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")

REQUESTS = [
    ("queues, page 50 of 100 by name", "/api/queues?page=50&page_size=100&sort=name"),
    ("queues, regex filter, page 1", "/api/queues?page=1&page_size=100&name=q-0%5B0-4%5D&use_regex=true"),
    ("queues, page 1 by messages (every queue shaped)", "/api/queues?page=1&page_size=100&sort=messages"),
    ("queues, the whole list (no paging)", "/api/queues"),
    ("connections, page 5 of 10 by name", "/api/connections?page=5&page_size=100&sort=name"),
    ("connections, page 1 by recv_oct (every one shaped)", "/api/connections?page=1&page_size=100&sort=recv_oct"),
    ("overview", "/api/overview"),
]


def cpu_seconds(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def main(args) -> None:
    broker = launch(Path(tempfile.mkdtemp(prefix="hutch-bench-")), expect=("AMQP", "HTTP"))
    connections = []
    try:
        api = Api(broker.ports["HTTP"])
        api.post("/api/definitions", {"queues": [
            {"name": "q-%05d" % i, "vhost": "/", "durable": False, "auto_delete": False, "arguments": {}}
            for i in range(args.queues)]})
        url = "amqp://guest:guest@127.0.0.1:%d/" % broker.port
        for start in range(0, args.connections, 100):
            connections += await asyncio.gather(*(aiormq.connect(url)
                                                  for _ in range(start, min(start + 100, args.connections))))
        pid = broker.process.pid
        print("%d queues, %d connections; broker CPU per request (mean of %d):" % (args.queues, args.connections,
                                                                                  args.repeat))
        for label, path in REQUESTS:
            before = cpu_seconds(pid)
            for _ in range(args.repeat):
                assert (await asyncio.to_thread(api.get, path)).status == 200
            print("  %-52s %8.1f ms" % (label, (cpu_seconds(pid) - before) * 1000 / args.repeat))
    finally:
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
