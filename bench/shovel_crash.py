#!/usr/bin/env python3
"""SIGKILL of either end of an on-confirm shovel, at the issue's size: by
default 100,000 persistent messages (tests/test_shovel_crash.py runs 10,000
in the suite). See tests/shovel_crash.py for the plan of the run.

    python bench/shovel_crash.py                    # 100,000 messages
    python bench/shovel_crash.py --count 20000 --size 1024

Prints the count, what arrived, the duplicates and the time; exit status 1 if
anything was lost.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import shovel_crash  # noqa: E402  (needs the paths above)
from conftest import launch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=0, help="body bytes (at least the 8 of the index)")
    parser.add_argument("--prefetch", type=int, default=200, help="the shovel's src-prefetch-count")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each phase may take")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="shovel-crash-"))
    started = []

    def start(*extra: str):
        broker = launch(workdir, *extra, expect=("AMQP", "HTTP"))
        started.append(broker)
        return broker

    try:
        outcome = shovel_crash.run(start, args.count, args.timeout, args.size, args.prefetch)
    finally:
        for broker in started:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("messages %d, received %d, lost %d, duplicates %d, B held %s at the kills, %.1f s"
          % (outcome.count, outcome.received, len(outcome.missing), outcome.duplicates,
             " and ".join(map(str, outcome.on_b_at_kills)), outcome.seconds))
    return 1 if outcome.missing else 0


if __name__ == "__main__":
    sys.exit(main())
