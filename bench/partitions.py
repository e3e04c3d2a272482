#!/usr/bin/env python3
"""Partitions and other faults against a three-node cluster (docs/cluster.md, "Partitions").

    python bench/partitions.py --runs 5                       # every fault, 5 runs (root: network namespaces)
    python bench/partitions.py --runs 20 --faults leader-isolated,sigstop --lease-ttl 2
    python bench/partitions.py --runs 3 --keep /tmp/partition-logs --seed 7

Each run builds a fresh cluster with tests/partition_kit.py (three hutch nodes and three etcd
members, each in its own network namespace, a client namespace for the confirmed persistent
publisher and the consumer), goes through the selected faults once each in a shuffled order,
heals, drains, and checks the history (tests/partition_history.py: no confirmed message lost, no
acked message back beyond what docs/cluster.md allows, at most one node confirming per term,
every node in sync again after healing). Prints one JSON report per run (stderr: progress) and a
summary per kind of fault: how many, failover (fault to the first confirm of a publish sent
after it) p50/p99, election (fault to a new term in etcd) p50/p99, resyncs that did not happen,
and anything lost. Exit status 1 when a run broke a rule.

Faults: leader-isolated, leader-cut-from-followers, follower-cut-long, etcd-split, clock-skew,
sigstop, disk-full, snapshot-kill (tests/partition_kit.py's `inject` says what each does).
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from partition_kit import FAULTS, requirements_missing, run  # noqa: E402


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))], 2)


def summarise(reports: list[dict]) -> dict:
    kinds: dict[str, dict] = {}
    for report in reports:
        for fault in report["faults"]:
            entry = kinds.setdefault(fault["kind"], {"count": 0, "outage": [], "elected": [], "not_resynced": 0,
                                                     "leader_changed": 0})
            entry["count"] += 1
            if fault["outage"] is not None:
                entry["outage"].append(fault["outage"])
            if fault["elected_after"] is not None:
                entry["elected"].append(fault["elected_after"])
            entry["not_resynced"] += fault["in_sync_after"] is None
            entry["leader_changed"] += bool(fault.get("took_over", fault["leader_after"] != fault["leader_before"]))
    table = {kind: {"count": e["count"], "leader_changed": e["leader_changed"],
                    "failover_p50_s": percentile(e["outage"], 0.5), "failover_p99_s": percentile(e["outage"], 0.99),
                    "election_p50_s": percentile(e["elected"], 0.5), "election_p99_s": percentile(e["elected"], 0.99),
                    "not_resynced": e["not_resynced"]} for kind, e in sorted(kinds.items())}
    return {"runs": len(reports), "failed_runs": sum(not r["ok"] for r in reports),
            "confirmed": sum(r["confirmed"] for r in reports), "lost": sum(r["lost_count"] for r in reports),
            "ballast_lost": sum(r["ballast_confirmed"] - r["ballast_left"] for r in reports),
            "foreign_confirms_or_acked_back": [p for r in reports for p in r["problems"]
                                               if "confirms from a node" in p or "acked messages" in p],
            "faults": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--lease-ttl", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None, help="the order of the faults in each run")
    parser.add_argument("--keep", type=Path, default=None, help="a directory for each run's node and etcd logs")
    parser.add_argument("--minutes", type=float, default=None, help="stop starting runs after this long")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error("no such fault: %s (known: %s)" % (", ".join(unknown), ", ".join(FAULTS)))
    why = requirements_missing(faults)
    if why:
        print("bench/partitions.py: %s" % why, file=sys.stderr)
        return 2
    # SIGTERM ends the run as ^C does: through the harness's clean-up (namespaces, mounts, processes)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    shuffle = random.Random(args.seed)
    started, reports = time.monotonic(), []
    for number in range(1, args.runs + 1):
        if args.minutes is not None and time.monotonic() - started > args.minutes * 60:
            break
        order = faults[:]
        shuffle.shuffle(order)
        log("run %d: %s" % (number, ", ".join(order)))
        keep = args.keep / ("run-%d" % number) if args.keep else None
        try:
            report = run(order, args.lease_ttl, keep=keep, log=log)
        except Exception as exc:  # noqa: BLE001 - a run the harness could not finish is a result too
            report = {"faults": [], "ok": False, "confirmed": 0, "lost_count": 0, "ballast_confirmed": 0,
                      "ballast_left": 0, "problems": ["the run did not finish: %r" % exc], "order": order}
        report["run"] = number
        print(json.dumps(report), flush=True)
        log("run %d: %s" % (number, "ok" if report["ok"] else "; ".join(report["problems"])))
        reports.append(report)
    summary = summarise(reports)
    print(json.dumps(summary, indent=1))
    return 0 if summary["failed_runs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
