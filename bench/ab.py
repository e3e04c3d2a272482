#!/usr/bin/env python3
"""Broker CPU per message of two hutch revisions, A/B, interleaved: the way to compare a change on
a machine whose load makes msg/s noise.

    python bench/ab.py --base HEAD~1 --scenarios S1,S4 --repeat 5 --generator /tmp/amqpbench/amqpbench
    python bench/ab.py --base HEAD~1 --hutch-arg=--event-loop=asyncio      # flags for both sides

B is this checkout (uncommitted changes included); A is `--base` exported with `git archive` into a
temporary directory, with its C extension built there when a compiler is at hand (else A runs the
pure-Python twins; the table says which). For each repeat and scenario, A then B (then B then A on
odd repeats, so neither always goes first), each a fresh hutch; the table shows the median CPU
µs per message (measures.timed: the broker's /proc user + system time over the measured window,
over the messages consumed) and msg/s of each side, and B / A.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import AMQPBENCH_SRC, ROOT, build_amqpbench, fresh_hutch, log  # noqa: E402
from measures import Settings, Target  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402


class TreeHutch:
    """A hutch started from the source tree at `root`."""

    def __init__(self, name: str, root: str, extra: list[str]) -> None:
        self.name, self.root, self.extra = name, root, extra

    @contextmanager
    def running(self):
        with fresh_hutch(self.extra, self.root) as h:
            yield Target(self.name, h.uri, h.pid, True)


def build_extension(root: str) -> bool:
    """The C twin compiled in place under `root` (as `pip install` would): amqp_server/amqp/_framing.c,
    or amqp_server/_framing.c in a tree from before the layout of docs/architecture.md."""
    for package in (("amqp_server", "amqp"), ("amqp_server",)):
        source = os.path.join(root, *package, "_framing.c")
        if os.path.exists(source):
            break
    else:
        return False
    target = os.path.join(root, *package, "_framing" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = ["cc", "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"], source, "-o", target]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def export(revision: str) -> str:
    tree = tempfile.mkdtemp(prefix="hutch-ab-")
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision of side A")
    p.add_argument("--scenarios", default="S1,S4")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--duration", type=float, default=6)
    p.add_argument("--warmup", type=float, default=2)
    p.add_argument("--generator", metavar="PATH")
    p.add_argument("--hutch-arg", action="append", default=[])
    args = p.parse_args(argv)
    by_name = {s.name: s for s in SCENARIOS}
    scenarios = [by_name[n.strip().upper()] for n in args.scenarios.split(",")]
    tree = export(args.base)
    try:
        built = build_extension(tree)
        a, b = TreeHutch("A", tree, args.hutch_arg), TreeHutch("B", ROOT, args.hutch_arg)
        settings = Settings(generator=args.generator or build_amqpbench(AMQPBENCH_SRC), duration=args.duration,
                            warmup=args.warmup)
        runs = {(s.name, side.name): [] for s in scenarios for side in (a, b)}
        for repeat in range(args.repeat):
            for s in scenarios:
                for side in ((a, b) if repeat % 2 == 0 else (b, a)):
                    with side.running() as target:
                        out = s.run(settings, target, "ab-%s-%d" % (s.name.lower(), os.getpid()))
                    log("%s %s: %.3f µs/msg, %.0f msg/s" % (s.name, side.name, out["cpu_us"] or -1, out["consumed"]))
                    runs[(s.name, side.name)].append(out)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print("A = %s%s, B = this checkout; median of %d interleaved runs of %g s\n"
          % (args.base, "" if built else " (C extension not built: pure Python)", args.repeat, args.duration))
    print("| scenario | A CPU µs/msg | B CPU µs/msg | B / A | A msg/s | B msg/s | runs (A; B, µs/msg) |")
    print("|---|---|---|---|---|---|---|")
    for s in scenarios:
        cpu = {side: [r["cpu_us"] for r in runs[(s.name, side)] if r.get("cpu_us")] for side in "AB"}
        rate = {side: statistics.median(r["consumed"] for r in runs[(s.name, side)]) for side in "AB"}
        ca, cb = statistics.median(cpu["A"]), statistics.median(cpu["B"])
        print("| %s | %.3f | %.3f | %.3f | %.0f | %.0f | %s; %s |" % (
            s.name, ca, cb, cb / ca, rate["A"], rate["B"], " ".join("%.2f" % v for v in cpu["A"]),
            " ".join("%.2f" % v for v in cpu["B"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
