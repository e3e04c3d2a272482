#!/usr/bin/env python3
"""The shard fault soak (issue 39; docs/scaling.md, "When a shard ends"): a node of N shards
under confirmed persistent load on a queue of every shard (clients on other shards than their
queues), random shards SIGKILLed or stopped (SIGSTOP: the others fence it) for minutes, then
tests/shard_soak.py's checker: nothing confirmed lost, nothing acked back without a restart of
its shard or its consumer's (and then flagged redelivered), each queue's order kept. Prints
each run's report as JSON; exit status 1 when a run broke a rule.

    python bench/shard_soak.py --shards 3 --minutes 5 --every 5 --runs 2 [--shard-0]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import shard_soak  # noqa: E402
from conftest import launch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--every", type=float, default=5.0, help="seconds between faults")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--shard-timeout", type=float, default=2.0)
    p.add_argument("--shard-0", action="store_true", help="shard 0 is a target too (the node restarts whole)")
    args = p.parse_args(argv)
    if args.shards < 2:
        p.error("--shards must be 2 or more")
    failed = False
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="shard-soak-") as tmp:
            node = launch(Path(tmp), "--shards", str(args.shards), "--shard-moves", "false",
                          "--shard-timeout", str(args.shard_timeout))
            try:
                history, owners = shard_soak.run(node, args.shards, args.minutes * 60, args.every, seed=run,
                                                 shard_0=args.shard_0)
            finally:
                node.stop()
        problems = shard_soak.check(history, owners)
        failed = failed or bool(problems)
        print(json.dumps({"run": run, "shards": args.shards, "minutes": args.minutes, **shard_soak.summary(history),
                          "problems": problems}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
