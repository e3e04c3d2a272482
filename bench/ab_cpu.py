"""Broker CPU per message of two checkouts side by side: an A/B that holds on a loaded machine.

    python bench/ab_cpu.py --a /tmp/base --b . --shape S3 --rate 5000 --runs 5

Wall-clock throughput on a shared machine is noise (it follows the other work), and so is CPU
per message at saturation (batch sizes follow the throughput). Here both brokers run *at the
same time*, each fresh (empty data directory, AMQP only) from its own checkout, each loaded by
its own amqpbench with the same shape at the same fixed publish rate (or both at full speed,
--rate 0), so both see the same machine; the figure is the broker's CPU time (user + system,
amqpbench's --broker-pid sampling of /proc/PID/stat) over the measured window divided by the
messages consumed in it. Each run prints A, B, B/A and both consumed rates; the last line is
the median ratio.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import amqpbench, build_amqpbench, free_port, wait_serving, AMQPBENCH_SRC  # noqa: E402
from scenarios import S2_SHAPE  # noqa: E402

SHAPES = {"S1": "--size 16 --autoack", "S2": S2_SHAPE, "S3": S2_SHAPE + " --persistent --confirm 100"}


def start(checkout: str, data_dir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.server", "--port", str(port), "--bind", "127.0.0.1", "--data-dir", data_dir,
         "--log-level", "warning", "--management-enabled", "false", "--prometheus-enabled", "false",
         "--mqtt-enabled", "false", "--stream-enabled", "false"],
        cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_serving(port, proc, 30)
    return proc, port


def one_run(args: argparse.Namespace, generator: str, number: int) -> tuple[tuple, tuple]:
    """((A's CPU µs per message, A's consumed msg/s), (B's ...))."""
    work = tempfile.mkdtemp(prefix="ab-cpu-")
    procs, results = [], {}
    try:
        for side, checkout in (("a", args.a), ("b", args.b)):
            procs.append((side, *start(os.path.abspath(checkout), os.path.join(work, side))))

        def load(side: str, proc: subprocess.Popen, port: int) -> None:
            argv = ["--time", "%g" % args.duration, "--warmup", "%g" % args.warmup, "--queue", "ab-%s" % side,
                    "--label", "ab-%s-%d" % (side, number), *SHAPES[args.shape].split()]
            if args.rate:
                argv += ["--rate", str(args.rate)]
            out = amqpbench(generator, "amqp://guest:guest@127.0.0.1:%d/%%2f" % port, argv, proc.pid,
                            timeout=args.duration + args.warmup + 300)
            results[side] = (out["broker_cpu_pct"] * 1e4 / out["consume_rate"], out["consume_rate"])

        threads = [threading.Thread(target=load, args=p) for p in procs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for _side, proc, _port in procs:
            proc.terminate()
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return results["a"], results["b"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="S3")
    parser.add_argument("--rate", type=int, default=5000,
                        help="publish rate of each amqpbench, msg/s (0: as fast as it goes)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=float, default=15)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--generator", help="amqpbench binary (default: build it)")
    args = parser.parse_args()
    generator = args.generator or build_amqpbench(AMQPBENCH_SRC)
    ratios = []
    print("%s at %s each: broker CPU µs per message"
          % (args.shape, "%d msg/s" % args.rate if args.rate else "full speed"))
    for number in range(args.runs):
        (a, a_rate), (b, b_rate) = one_run(args, generator, number)
        ratios.append(b / a)
        print("run %d: A %.2f  B %.2f  B/A %.3f   (consumed msg/s: A %.0f, B %.0f)"
              % (number + 1, a, b, b / a, a_rate, b_rate), flush=True)
    print("median B/A %.3f (min %.3f, max %.3f)" % (statistics.median(ratios), min(ratios), max(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
