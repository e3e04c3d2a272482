#!/usr/bin/env python3
"""Persistence benchmark: backlog fill/drain, restart with a backlog, many small messages.

Measures the targets of the Persistence issue (results in docs/benchmarks.md):

1. N persistent 1 KiB messages published with confirms (window 100) into one durable queue,
   then drained (prefetch 100, multi-ack every 10): fill and drain rates, and the broker's
   peak RSS in each phase, sampled from /proc/PID/status every 0.2 s (target: < 150 MB).
   Run against hutch and, with --target both, the same amqpbench commands against the RabbitMQ
   on --rabbitmq-uri (its RSS is the beam.smp process's).
2. hutch only, between fill and drain: restart with the backlog after SIGTERM (clean) and after
   SIGKILL (unclean: every store and index file is scanned): time until the port answers the
   AMQP header with connection.start, and until a basic.get returns a message (target: < 10 s).
3. hutch: M transient 16-byte messages into a non-durable queue (several producers), then
   drained: peak RSS (target: < 200 MB for 10M). It first times 1M and runs the rest only if the
   extrapolated fill+drain fits --small-budget seconds; the report says what was run.

Load comes from amqpbench (C, /work/shared/amqpbench). Without --amqpbench the script copies its
source to a temporary directory and builds it there (needs librabbitmq-dev and make).

    python bench/persistence.py                      # hutch + RabbitMQ, 1M, restarts, 10M small
    python bench/persistence.py --target hutch --messages 100000 --small-messages 0
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

from harness import (AMQPBENCH_SRC, MB, Hutch, RssSampler, amqpbench, build_amqpbench, cpu_seconds, delete_queue,
                     dir_size, fill_drain, free_port, log, machine, profiled, rabbitmq_pid, revision, rss_bytes,
                     wait_serving)


def first_get(uri: str, queue: str, timeout: float) -> tuple[int, bool]:
    """basic.get of one message (then requeued by closing the channel unacked).
    Returns the queue's message count (passive declare) and whether a message came back."""
    import pika

    t0 = time.monotonic()
    while True:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(uri))
            try:
                ch = conn.channel()
                method, _props, body = ch.basic_get(queue, auto_ack=False)
                count = ch.queue_declare(queue, passive=True).method.message_count
                return count + (1 if method else 0), method is not None
            finally:
                conn.close()
        except Exception:
            if time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.05)


def restart_test(hutch: Hutch, queue: str, expected: int, how: int, profile: str | None = None) -> dict:
    name = "SIGTERM" if how == signal.SIGTERM else "SIGKILL"
    old_pid = hutch.pid
    rss_before = rss_bytes(old_pid)
    stop_s = hutch.stop(how)
    t0 = time.monotonic()
    hutch.start()
    with RssSampler(hutch.pid) as s, profiled(hutch.pid, profile, "restart-%s" % name, delay=0.5, duration=8):
        serving = wait_serving(hutch.port, hutch.proc, 300)
        serving_cpu = cpu_seconds(hutch.pid)
        count, got = first_get(hutch.uri, queue, 60)
        first = time.monotonic() - t0
    res = {"signal": name, "stop_s": stop_s, "serving_s": serving, "first_message_s": first, "serving_cpu_s": serving_cpu,
           "messages_after": count, "got_message": got, "expected": expected,
           "rss_before": rss_before, "recovery_rss_peak": s.peak, "rss_after": rss_bytes(hutch.pid)}
    log("restart after %s: stop %.2f s, serving after %.2f s (%.2f s of CPU), first message after %.2f s, %d messages (expected %d), "
        "recovery RSS peak %.1f MiB" % (name, stop_s, serving, serving_cpu or 0, first, count, expected, s.peak / MB))
    return res


def small_test(binary: str, hutch: Hutch, total: int, producers: int, budget: float, profile: str | None) -> dict:
    """Transient 16 B messages into a non-durable queue: first 1M (timed), then the rest if it fits."""
    queue = "bench-small-%d" % os.getpid()
    first = min(total, 1_000_000)
    res: dict = {"requested": total, "producers": producers, "size": 16}
    fill_args = ["--consumers", "0", "--size", "16", "--confirm", "1000", "--keep", "--queue", queue,
                 "--producers", str(producers)]

    def fill(n: int) -> tuple[dict, float]:
        per = n // producers
        t0 = time.monotonic()
        out = amqpbench(binary, hutch.uri, fill_args + ["--pmessages", str(per)], hutch.pid)
        return out, time.monotonic() - t0

    with RssSampler(hutch.pid) as s, profiled(hutch.pid, profile, "small-fill"):
        out1, t1 = fill(first)
        sent = out1.get("total_sent", 0)
        rates = [(sent, t1)]
        # fill + drain of the rest, drain assumed as slow as the fill
        rest = total - first
        est = 2 * t1 * rest / max(first, 1)
        res["first_million_fill_s"] = t1
        res["extrapolated_rest_s"] = est
        if rest > 0:
            if est + t1 > budget:
                millions = max(0, int((budget / (2 * t1)) - 1))
                rest = millions * first
                log("small: 1M filled in %.1f s; %d more would take ~%.0f s, over the %.0f s budget: adding %d"
                    % (t1, total - first, est, budget, rest))
            if rest > 0:
                out2, t2 = fill(rest)
                sent += out2.get("total_sent", 0)
                rates.append((out2.get("total_sent", 0), t2))
    res.update(queued=sent, fill_s=sum(t for _, t in rates), fill_rss_peak=s.peak,
               fill_rate=sent / sum(t for _, t in rates), fill_other_cpu=out1.get("other_cpu_pct"))
    log("small fill: %d queued, %.0f msg/s, peak RSS %.1f MiB" % (sent, res["fill_rate"], s.peak / MB))
    with RssSampler(hutch.pid) as s, profiled(hutch.pid, profile, "small-drain"):
        t0 = time.monotonic()
        out = amqpbench(binary, hutch.uri, ["--producers", "0", "--cmessages", str(sent), "--prefetch", "1000",
                                            "--multi-ack-every", "100", "--queue", queue], hutch.pid)
        res["drain_s"] = time.monotonic() - t0
    res.update(drain_rate=out.get("consume_rate"), drain_received=out.get("total_received"), drain_rss_peak=s.peak,
               drain_other_cpu=out.get("other_cpu_pct"))
    log("small drain: %s received, %.0f msg/s, peak RSS %.1f MiB" % (res["drain_received"], res["drain_rate"] or 0, s.peak / MB))
    return res



def mb(x) -> str:
    return "%.0f" % (x / MB) if x else "-"


def rate(x) -> str:
    return "{:,.0f}".format(x) if x else "-"


def report(results: dict) -> str:
    lines = ["machine: " + results["machine"], "hutch revision: " + results["revision"], ""]
    if results.get("fill_drain"):
        lines += ["| broker | messages | fill (confirmed msg/s) | fill peak RSS MiB | drain (msg/s) | drain peak RSS MiB |",
                  "|---|---|---|---|---|---|"]
        for r in results["fill_drain"]:
            lines.append("| %s | %s | %s | %s | %s | %s |" % (r["target"], "{:,}".format(r["messages"]), rate(r["fill_rate"]),
                                                         mb(r["fill_rss_peak"]), rate(r["drain_rate"]), mb(r["drain_rss_peak"])))
        lines.append("")
    if results.get("restarts"):
        lines += ["| restart with backlog | stop (s) | serving (s) | CPU until serving (s) | first message (s) | messages after | recovery peak RSS MiB |",
                  "|---|---|---|---|---|---|---|"]
        for r in results["restarts"]:
            lines.append("| %s | %.2f | %.2f | %.2f | %.2f | %s of %s | %s |" % (
                r["signal"], r["stop_s"], r["serving_s"], r["serving_cpu_s"] or 0, r["first_message_s"], "{:,}".format(r["messages_after"]),
                "{:,}".format(r["expected"]), mb(r["recovery_rss_peak"])))
        lines.append("")
    if results.get("small"):
        r = results["small"]
        lines += ["| small messages (16 B, transient, non-durable queue) | queued | fill (msg/s) | fill peak RSS MiB | drain (msg/s) | drain peak RSS MiB |",
                  "|---|---|---|---|---|---|",
                  "| hutch, %d producers | %s of %s requested | %s | %s | %s | %s |" % (
                      r["producers"], "{:,}".format(r["queued"]), "{:,}".format(r["requested"]), rate(r["fill_rate"]),
                      mb(r["fill_rss_peak"]), rate(r["drain_rate"]), mb(r["drain_rss_peak"])), ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000, help="persistent 1 KiB messages (default 1,000,000)")
    p.add_argument("--small-messages", type=int, default=10_000_000, help="transient 16 B messages (0 = skip)")
    p.add_argument("--small-producers", type=int, default=4)
    p.add_argument("--small-budget", type=float, default=600, help="seconds allowed for the small fill+drain")
    p.add_argument("--target", choices=["hutch", "both"], default="both", help="hutch only, or RabbitMQ too")
    p.add_argument("--amqpbench", help="amqpbench binary (default: build it from %s)" % AMQPBENCH_SRC)
    p.add_argument("--data-dir", help="hutch data directory (must be empty or absent; default: a temp dir, removed)")
    p.add_argument("--rabbitmq-uri", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    p.add_argument("--hutch-arg", action="append", default=[], help="extra broker flag (repeatable), e.g. "
                   "--hutch-arg=--storage-durability=flush")
    p.add_argument("--no-restart", action="store_true", help="skip the restart measurements")
    p.add_argument("--profile", metavar="DIR", help="py-spy record each hutch phase (10 s) into DIR")
    p.add_argument("--json-out", metavar="FILE", help="write all results as JSON")
    args = p.parse_args()

    binary = args.amqpbench or build_amqpbench(AMQPBENCH_SRC)
    temp_dir = None
    if args.data_dir:
        if os.path.exists(args.data_dir) and os.listdir(args.data_dir):
            sys.exit("--data-dir %s is not empty" % args.data_dir)
        os.makedirs(args.data_dir, exist_ok=True)
        data_dir = args.data_dir
    else:
        data_dir = temp_dir = tempfile.mkdtemp(prefix="hutch-bench-")
    results: dict = {"machine": machine(), "revision": revision(), "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                     "fill_drain": [], "restarts": []}
    hutch = Hutch(data_dir, free_port(), args.hutch_arg)
    try:
        hutch.start()
        wait_serving(hutch.port, hutch.proc, 60)
        log("hutch pid %d on port %d, data dir %s" % (hutch.pid, hutch.port, data_dir))
        queue = "bench-persist-%d" % os.getpid()
        if args.messages:
            def restarts(res: dict) -> None:
                res["disk_full"] = dir_size(data_dir)
                log("data dir after the fill: %.1f MiB" % (res["disk_full"] / MB))
                if args.no_restart:
                    return
                sent = res["fill_sent"]
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    results["restarts"].append(restart_test(hutch, queue, sent, sig, args.profile))

            results["fill_drain"].append(fill_drain(binary, hutch.uri, lambda: hutch.pid, queue, args.messages,
                                                    "hutch", args.profile, between=restarts))
            # Reclaim: compaction and segment deletion run on the writer thread
            # after the last acks; give them a moment, then measure.
            deadline = time.monotonic() + 30
            while dir_size(data_dir) > 8 * MB and time.monotonic() < deadline:
                time.sleep(0.5)
            results["fill_drain"][-1]["disk_drained"] = dir_size(data_dir)
            log("data dir after the drain: %.1f MiB" % (results["fill_drain"][-1]["disk_drained"] / MB))
        if args.messages and args.target == "both":
            rq = "bench-persist-%d" % os.getpid()
            try:
                results["fill_drain"].append(fill_drain(binary, args.rabbitmq_uri, lambda: rabbitmq_pid(args.rabbitmq_uri), rq, args.messages,
                                                        "RabbitMQ", None))
            finally:
                delete_queue(args.rabbitmq_uri, rq)
        if args.small_messages:
            results["small"] = small_test(binary, hutch, args.small_messages, args.small_producers,
                                          args.small_budget, args.profile)
    finally:
        hutch.stop()
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
    text = report(results)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
