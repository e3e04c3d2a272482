#!/usr/bin/env python3
"""Crash soak: the crash cycles of tests/test_crash.py, for longer.

Each cycle starts hutch on one data directory, publishes (confirm mode,
persistent, ids in the bodies) and/or consumes (manual acks) against it, kills
it with SIGKILL at a random moment, and checks after the restart that nothing
confirmed was lost, durable acks stuck, nothing came twice except messages
unacked at a crash (marked redelivered), order held and bodies are intact
(the invariants are listed in tests/crash_cycle.py). The queue is drained and
checked at the end; a summary is printed.

    python bench/crash_soak.py                       # 200 cycles
    python bench/crash_soak.py --cycles 500 --seed 12345 --max-delay 3
    python bench/crash_soak.py --durability flush --keep

Exit status 0 when every invariant held, 1 otherwise (the failure names the
seed: --seed reuses the same kill delays; the cycle plan is fixed).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import crash_cycle  # noqa: E402  (needs the paths above)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="random seed of the kill moments")
    parser.add_argument("--min-delay", type=float, default=0.2, help="seconds of traffic before a kill, at least")
    parser.add_argument("--max-delay", type=float, default=1.5, help="seconds of traffic before a kill, at most")
    parser.add_argument("--durability", choices=("fsync", "flush"), default="fsync")
    parser.add_argument("--max-backlog", type=int, default=6000,
                        help="the publisher waits while about this many messages are in the queue")
    parser.add_argument("--fill-cap", type=int, default=2500, help="publishes per fill cycle at most")
    parser.add_argument("--mixed-cap", type=int, default=5000, help="publishes per mixed cycle at most")
    parser.add_argument("--start-limit", type=float, default=crash_cycle.Settings.start_limit,
                        help="seconds a restart may take until it listens")
    parser.add_argument("--workdir", type=Path, default=None, help="where the data directory goes (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    parser.add_argument("--quiet", action="store_true", help="no line per cycle")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hutch-crash-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    settings = crash_cycle.Settings(
        cycles=args.cycles,
        seed=args.seed,
        delay=(args.min_delay, args.max_delay),
        max_backlog=args.max_backlog,
        fill_cap=args.fill_cap,
        mixed_cap=args.mixed_cap,
        start_limit=args.start_limit,
        flags=crash_cycle.BROKER_FLAGS + ("--storage-durability", args.durability),
        log=(lambda _line: None) if args.quiet else (lambda line: print(line, flush=True)),
    )
    crasher = crash_cycle.Crasher(workdir, settings)
    began = time.monotonic()
    try:
        summary = asyncio.run(crasher.run())
    except AssertionError as exc:
        print("FAILED after %.0f s\n%s" % (time.monotonic() - began, exc), file=sys.stderr)
        print("data directory kept: %s" % crasher.data_dir, file=sys.stderr)
        return 1
    summary["durability"] = args.durability
    summary["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(summary, indent=2))
    print("OK: %d cycles, %d confirmed messages, every invariant held" % (args.cycles, summary["confirmed"]))
    if args.workdir is None and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
