#!/usr/bin/env python3
"""Fuzz soak: the mutated sessions of tests/test_fuzz_live.py, a million times.

Starts hutch on a free port with a fresh data directory,
then sends mutated valid AMQP sessions (tests/fuzz_session.py: bit flips, byte
overwrites, truncation, splices, duplicated/dropped frames, rewritten frame
type, channel or length, corrupted method arguments) from `--workers` threads.
Each case is checked: no hang (the broker closes within `--timeout` after our
EOF), only legitimate close codes; every `--every` cases the broker must serve
a new client, and its fd count and RSS are sampled from /proc. At the end the
broker log is searched for tracebacks. A summary (inputs/s, close codes seen,
fd/RSS first/max/last, failures) is printed as JSON.

    python bench/fuzz_soak.py                          # 1,000,000 cases
    python bench/fuzz_soak.py --cases 20000 --seed 3   # a short run

Exit status 0 when every check held, 1 otherwise (a failing case is printed
with its operator and bytes; --seed reproduces the sequence per worker).
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from conftest import launch  # noqa: E402  (needs the paths above)
from fuzz_session import Hang, broker_resources, check_closes, closes, mutate, run_case  # noqa: E402
from helpers import assert_serves  # noqa: E402


class LogTail(collections.deque):
    """The broker's last log lines, and how many tracebacks it logged."""

    def __init__(self) -> None:
        super().__init__(maxlen=200)
        self.tracebacks = 0

    def append(self, line: str) -> None:
        if line.startswith("Traceback"):
            self.tracebacks += 1
        super().append(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a case may take after our EOF")
    parser.add_argument("--every", type=int, default=10_000, help="cases between liveness/resource samples")
    args = parser.parse_args(argv)

    broker = launch(Path(tempfile.mkdtemp(prefix="hutch-fuzz-")))
    broker.log_lines = LogTail()  # a million cases log a million lines: count, keep a tail
    pid = broker.process.pid
    codes: collections.Counter = collections.Counter()
    ops: collections.Counter = collections.Counter()
    failures: list[str] = []
    samples: list[tuple[int, int, int]] = []
    done = [0]
    lock = threading.Lock()
    per_worker = args.cases // args.workers

    def work(index: int) -> None:
        rnd = random.Random(args.seed * 1000 + index)
        for _ in range(per_worker):
            if failures:
                return
            op, data = mutate(rnd)
            try:
                found = closes(run_case(broker.port, data, args.timeout))
                check_closes(found)
            except (Hang, AssertionError, OSError) as exc:
                with lock:
                    failures.append("%s: %s: %r" % (op, exc, data))
                return
            with lock:
                ops[op] += 1
                for _channel, class_id, code, _text in found:
                    codes["%s %d" % ("connection" if class_id == 10 else "channel", code)] += 1
                done[0] += 1
                sample = done[0] % args.every == 0
            if sample:
                sample_broker(done[0])

    def sample_broker(count: int) -> None:
        if broker.process.poll() is not None:
            failures.append("broker exited with %s" % broker.process.returncode)
            return
        try:
            assert_serves(broker.port)
        except Exception as exc:  # noqa: BLE001 - any failure to serve is the finding
            failures.append("broker does not serve a new client after %d cases: %r" % (count, exc))
        fds, rss = broker_resources(pid)
        samples.append((count, fds, rss))
        print("%9d cases  %6.0f/s  fds %4d  rss %7d KiB" % (count, count / (time.monotonic() - started), fds, rss),
              file=sys.stderr, flush=True)

    started = time.monotonic()
    sample_broker(0)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    sample_broker(done[0])
    if broker.log_lines.tracebacks:
        failures.append("%d tracebacks in the broker log; its end:\n%s"
                        % (broker.log_lines.tracebacks, "".join(broker.log_lines)))
    broker.stop()
    rss = [s[2] for s in samples]
    fds = [s[1] for s in samples]
    print(json.dumps({
        "cases": done[0],
        "seconds": round(elapsed, 1),
        "cases_per_second": round(done[0] / elapsed, 1),
        "operators": dict(ops),
        "closes": dict(codes),
        "fds_first_max_last": [fds[0], max(fds), fds[-1]],
        "rss_kib_first_max_last": [rss[0], max(rss), rss[-1]],
        "failures": failures[:10],
    }, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
