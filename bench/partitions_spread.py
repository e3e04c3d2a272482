#!/usr/bin/env python3
"""Partitions of a cluster whose shard leaders are spread (issue 32; docs/scaling.md, "Shards in
a cluster"): three etcd members and three hutch nodes of three shards each (n1, n2, n3 lead shards
0, 1, 2), each in its own network namespace, under confirmed persistent load on a queue of every
shard through every node; the faults of tests/spread_faults.py in turn (an isolated leader, a
leader cut from the other nodes only, a leader on etcd's minority side), each healed before the
next. Prints each run's report as JSON (stderr: progress); exit status 1 when a confirmed message
was lost or a fault did not heal.

    python bench/partitions_spread.py --runs 3          # root: network namespaces
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import spread_faults  # noqa: E402


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--faults", default=",".join(spread_faults.FAULTS))
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(spread_faults.FAULTS))
    if unknown:
        p.error("unknown faults: %s (known: %s)" % (", ".join(unknown), ", ".join(spread_faults.FAULTS)))
    why = spread_faults.missing()
    if why is not None:
        sys.exit("partitions_spread.py: %s" % why)
    broken = 0
    for run in range(args.runs):
        log("run %d/%d: %s" % (run + 1, args.runs, ", ".join(faults)))
        try:
            report = spread_faults.run(Path(tempfile.mkdtemp(prefix="hutch-spread-")), faults, log)
        except AssertionError as exc:  # a fault that did not heal, a load that did not go on
            report = {"problems": [str(exc)], "faults": []}
        report.pop("logs", None)
        print(json.dumps(report), flush=True)
        broken += bool(report["problems"])
        log("run %d: %s" % (run + 1, "; ".join(report["problems"]) or "nothing lost, every fault healed"))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
