#!/usr/bin/env python3
"""Streams on hutch and on RabbitMQ 3.10.8 in the same run, with C load generators:
the stream protocol (port 5552) with bench/streambench, and the AMQP 0-9-1 stream
scenarios S9-S11 with amqpbench (patched for stream arguments: bench/amqpbench-streams.patch).

    python bench/stream_protocol.py                          # everything, 10 s per scenario, 10M-record read
    python bench/stream_protocol.py --duration 3 --fill 1000000 --records 100000 --repeat 1   # a quick run
    python bench/stream_protocol.py --no-rabbitmq --only SP1,SP5

Stream protocol (streambench; PerfTest/stream-perf-test defaults: batches of 100 messages per
Publish frame, 10,000 unconfirmed per producer, credit 10 chunks):
- SP1: 1 producer, 1 consumer (offset next), one stream, 16 B messages, for --duration s;
- SP2: the same with 1 KiB messages;
- SP3: 4 streams, 4 producers, 4 consumers (one each), 16 B;
- SP4: the same with 1 KiB;
- SP5: one consumer reads a stream of --fill 16 B messages from `first` (the fill is not measured).
AMQP 0-9-1 (amqpbench, one connection per producer/consumer):
- S9: --records 1 KiB messages with confirms (window 100) into a new stream;
- S10: one consumer reads them from `first`, prefetch 1000, multi-ack every 100;
- S11: ten consumers read them from `first` at once (deliveries/s of all).

hutch runs twice per repeat, each time a fresh broker from this checkout (empty data directory,
stream listener on a free port): with its default `storage.durability` fsync (a confirm means
fsynced) and with `flush` (written to the OS, as RabbitMQ's stream log, osiris, confirms: it
writes with file:write and has no fsync on its write path). RabbitMQ is the node at
--rabbitmq-host (stream port 5552, AMQP 5672; never restarted). Each figure is the median of
--repeat runs; every run also gives the broker's CPU µs per message (/proc/PID/stat over the
measured window, all threads), the figure to compare on a loaded machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pika  # noqa: E402

from harness import (AMQPBENCH_SRC, amqpbench, answers_amqp, fresh_hutch, free_port, log, machine,  # noqa: E402
                     rabbitmq_pid, revision)

HERE = os.path.dirname(os.path.abspath(__file__))
STREAMBENCH_SRC = os.path.join(HERE, "streambench")
PATCH = os.path.join(HERE, "amqpbench-streams.patch")

# (name, title, streambench arguments); SP5 is the read of a filled stream
PROTOCOL = [
    ("SP1", "publish + consume, 16 B, 1 stream", ["--size", "16"]),
    ("SP2", "publish + consume, 1 KiB, 1 stream", ["--size", "1024"]),
    ("SP3", "publish + consume, 16 B, 4 streams (4 producers, 4 consumers)",
     ["--size", "16", "--streams", "4", "--producers", "4", "--consumers", "4"]),
    ("SP4", "publish + consume, 1 KiB, 4 streams (4 producers, 4 consumers)",
     ["--size", "1024", "--streams", "4", "--producers", "4", "--consumers", "4"]),
    ("SP5", "read one stream from first, 16 B", []),
]
AMQP = [("S9", "publish 1 KiB, confirms (window 100)"), ("S10", "read from first, prefetch 1000"),
        ("S11", "ten consumers, same stream (deliveries/s)")]


def build(src: str, binary: str, patch: str | None = None) -> str:
    """`make` in a temporary copy of `src` (after applying `patch`); the binary's path."""
    where = tempfile.mkdtemp(prefix=binary + "-build-")
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and name != binary:
            shutil.copy(path, where)
    if patch:
        done = subprocess.run(["patch", "-p1", "-i", patch], cwd=where, capture_output=True, text=True)
        if done.returncode:
            sys.exit("%s does not apply to %s (has amqpbench changed?):\n%s" % (patch, src, done.stdout + done.stderr))
    done = subprocess.run(["make", "-C", where], capture_output=True, text=True)
    if done.returncode or not os.path.isfile(os.path.join(where, binary)):
        sys.exit("building %s failed:\n%s" % (binary, done.stdout + done.stderr))
    return os.path.join(where, binary)


def streambench(binary: str, port: int, pid: int, args: list[str]) -> dict:
    cmd = [binary, "--port", str(port), "--json", "--quiet", "--broker-pid", str(pid), *args]
    log("$ streambench " + " ".join(cmd[1:]))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError("streambench failed (exit %d): %s %s" % (done.returncode, done.stdout, done.stderr[-2000:]))
    return json.loads(done.stdout)


def delete_queue(amqp_port: int, name: str) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port))
    connection.channel().queue_delete(name)
    connection.close()


def per_message(run: dict, key: str) -> dict:
    """rate (`key`) and broker CPU µs per message of one streambench/amqpbench result."""
    rate = run[key]
    seconds = run.get("seconds") or run.get("window_s")
    cpu = run.get("broker_cpu_pct")
    us = cpu / 100 * seconds * 1e6 / (rate * seconds) if cpu is not None and cpu >= 0 and rate else None
    return {"rate": rate, "cpu_us": us, "run": run}


def attempt(name: str, run, *arguments) -> dict | None:
    """One scenario's figures, or None (logged) when it failed: the shared RabbitMQ may refuse a
    connection for a moment, and one failure should not lose the other figures."""
    try:
        return run(*arguments)
    except Exception as exc:  # the generators' failures, the clean-up's connection errors
        log("%s failed: %s" % (name, exc))
        return None


def protocol_runs(binary: str, port: int, amqp_port: int, pid: int, args: argparse.Namespace) -> dict:
    out = {}
    for name, _title, extra in PROTOCOL:
        if name in args.only:
            found = attempt(name, protocol_run, binary, port, amqp_port, pid, args, name, extra)
            if found is not None:
                out[name] = found
    return out


def protocol_run(binary: str, port: int, amqp_port: int, pid: int, args: argparse.Namespace, name: str,
                 extra: list[str]) -> dict:
    if name == "SP5":
        stream = "sb-read-" + uuid.uuid4().hex[:8]
        streambench(binary, port, pid, ["--stream", stream, "--consumers", "0", "--size", "16",
                                        "--pmessages", str(args.fill), "--duration", "3600", "--keep"])
        try:
            run = streambench(binary, port, pid, ["--stream", stream, "--predeclared", "--producers", "0",
                                                  "--offset", "first", "--cmessages", str(args.fill),
                                                  "--duration", "3600"])
        finally:
            delete_queue(amqp_port, stream)
        return per_message(run, "consume_rate")
    run = streambench(binary, port, pid, ["--stream", "sb-" + uuid.uuid4().hex[:8],
                                          "--duration", str(args.duration), "--warmup", str(args.warmup), *extra])
    found = per_message(run, "consume_rate")
    found["published"] = per_message(run, "confirm_rate")
    return found


def amqp_runs(binary: str, amqp_port: int, pid: int, args: argparse.Namespace) -> dict:
    if not {"S9", "S10", "S11"} & set(args.only):
        return {}
    return attempt("S9-S11", amqp_scenarios, binary, amqp_port, pid, args) or {}


def amqp_scenarios(binary: str, amqp_port: int, pid: int, args: argparse.Namespace) -> dict:
    uri = "amqp://guest:guest@127.0.0.1:%d/%%2f" % amqp_port
    queue = "sb-amqp-" + uuid.uuid4().hex[:8]
    n = str(args.records)
    out = {}
    try:
        run = amqpbench(binary, uri, ["--queue", queue, "--queue-type", "stream", "--durable", "--consumers", "0",
                                      "--pmessages", n, "--size", "1024", "--confirm", "100", "--keep"], pid)
        out["S9"] = per_message(run, "confirm_rate")
        for name, consumers in (("S10", "1"), ("S11", "10")):
            run = amqpbench(binary, uri, ["--queue", queue, "--predeclared", "--producers", "0", "--consumers",
                                          consumers, "--cmessages", n, "--prefetch", "1000", "--multi-ack-every",
                                          "100", "--stream-offset", "first"], pid)
            out[name] = per_message(run, "consume_rate")
    finally:
        delete_queue(amqp_port, queue)
    return out


def hutch_runs(args: argparse.Namespace, durability: str, sb: str, ab: str) -> dict:
    stream_port = free_port()
    extra = ["--stream-enabled", "true", "--stream-port", str(stream_port), "--storage-durability", durability,
             *args.hutch_arg]
    with fresh_hutch(extra) as hutch:
        out = protocol_runs(sb, stream_port, hutch.port, hutch.pid, args)
        out.update(amqp_runs(ab, hutch.port, hutch.pid, args))
    return out


def median_of(runs: list[dict], name: str, key: str = "rate", sub: str | None = None) -> float | None:
    values = []
    for run in runs:
        item = run.get(name)
        if item is not None and sub:
            item = item.get(sub)
        if item is not None and item.get(key) is not None:
            values.append(item[key])
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return "{:,.{}f}".format(value, digits)


def ratio(a: float | None, b: float | None) -> str:
    return "**%.2f**" % (a / b) if a is not None and b else "-"


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    columns = [c for c in ("hutch fsync", "hutch flush", "RabbitMQ") if results.get(c)]
    head = ["scenario", "figure"] + ["%s msg/s" % c for c in columns]
    if "RabbitMQ" in columns:
        head += ["%s / RabbitMQ" % c for c in columns if c != "RabbitMQ"]
    head += ["%s CPU µs/msg" % c for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    titles = {name: title for name, title, _ in PROTOCOL}
    titles.update(AMQP)
    for name in [n for n, _t, _e in PROTOCOL] + [n for n, _t in AMQP]:
        if name not in args.only:
            continue
        figures = [("consumed/s", None)] if name in ("SP5", "S10", "S11") else (
            [("confirmed/s", None)] if name == "S9" else [("published and confirmed/s", "published"),
                                                          ("consumed/s", None)])
        for label, sub in figures:
            rates = {c: median_of(results[c], name, "rate", sub) for c in columns}
            cpus = {c: median_of(results[c], name, "cpu_us", sub) for c in columns}
            row = [name + " " + titles[name], label] + [fmt(rates[c]) for c in columns]
            if "RabbitMQ" in columns:
                row += [ratio(rates[c], rates["RabbitMQ"]) for c in columns if c != "RabbitMQ"]
            row += [fmt(cpus[c], 2) for c in columns]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


COLOURS = {"hutch fsync": "#1f77b4", "hutch flush": "#6baed6", "RabbitMQ": "#ff7f0e"}


def svg(results: dict[str, list[dict]], only: set[str]) -> str:
    """Horizontal bars, one group per scenario (consumed/s; S9 confirmed/s), one bar per broker,
    on a log scale (the figures span 10^4 to 10^7 msg/s); drawn by hand as bench/growth.py does."""
    names = [n for n, _t, _e in PROTOCOL] + [n for n, _t in AMQP]
    names = [n for n in names if n in only]
    brokers = [b for b in COLOURS if results.get(b)]
    bar, gap, left, width, top = 14, 12, 70, 560, 30
    lo, hi = 4, 8  # 10^4 .. 10^8 msg/s
    height = top + len(names) * (len(brokers) * bar + gap) + 40
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
           % (left + width + 90, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="16" font-size="12" font-weight="bold">msg/s (log scale): hutch (fsync, flush) and '
           'RabbitMQ 3.10.8, same run</text>' % left]
    y = top
    for e in range(lo, hi + 1):
        x = left + (e - lo) / (hi - lo) * width
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/>' % (x, x, top - 4, height - 30))
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>'
                   % (x, height - 18, {4: "10k", 5: "100k", 6: "1M", 7: "10M", 8: "100M"}[e]))
    for name in names:
        out.append('<text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>'
                   % (left - 6, y + len(brokers) * bar // 2 + 4, name))
        for broker in brokers:
            value = median_of(results[broker], name)
            if value:
                w = max(0.0, min(1.0, (math.log10(value) - lo) / (hi - lo))) * width
                out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>'
                           % (left, y, w, bar - 2, COLOURS[broker]))
                out.append('<text x="%.1f" y="%d" font-size="10">%s</text>'
                           % (left + w + 4, y + bar - 4, "{:,.0f}".format(value)))
            y += bar
        y += gap
    x = left
    for broker in brokers:
        out.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (x, height - 12, COLOURS[broker]))
        out.append('<text x="%d" y="%d" font-size="10">%s</text>' % (x + 14, height - 3, broker))
        x += 110
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10, help="measured seconds of SP1-SP4 (default 10)")
    p.add_argument("--warmup", type=float, default=2, help="seconds before the measured window (default 2)")
    p.add_argument("--fill", type=int, default=10_000_000, help="messages SP5 reads (default 10,000,000)")
    p.add_argument("--records", type=int, default=1_000_000, help="records of S9-S11 (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=3, help="runs per broker; figures are medians (default 3)")
    p.add_argument("--only", default="SP1,SP2,SP3,SP4,SP5,S9,S10,S11", help="scenarios (comma-separated)")
    p.add_argument("--durability", default="fsync,flush", help="hutch's storage.durability modes to run")
    p.add_argument("--rabbitmq-host", default="127.0.0.1")
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument("--hutch-arg", action="append", default=[], help="extra hutch flag (repeatable)")
    p.add_argument("--json-out", help="write every run's figures (the generators' JSON included) here")
    p.add_argument("--svg", help="draw the consumed/s figures as a bar chart (SVG) here")
    p.add_argument("--render", help="no run: the table (and --svg) from a --json-out file")
    args = p.parse_args(argv)
    args.only = set(args.only.split(","))
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        if args.svg:
            with open(args.svg, "w") as f:
                f.write(svg(results, args.only))
        print(report(results, args))
        return 0
    if not args.no_rabbitmq and not answers_amqp(5672, args.rabbitmq_host):
        sys.exit("RabbitMQ does not answer on %s:5672 (use --no-rabbitmq)" % args.rabbitmq_host)
    sb = build(STREAMBENCH_SRC, "streambench")
    ab = build(AMQPBENCH_SRC, "amqpbench", PATCH)
    results: dict[str, list[dict]] = {}
    for repeat in range(args.repeat):
        for mode in args.durability.split(","):
            log("repeat %d: hutch, storage.durability %s" % (repeat + 1, mode))
            results.setdefault("hutch " + mode, []).append(hutch_runs(args, mode, sb, ab))
        if not args.no_rabbitmq:
            log("repeat %d: RabbitMQ" % (repeat + 1))
            pid = rabbitmq_pid("amqp://%s:5672/" % args.rabbitmq_host)
            runs = protocol_runs(sb, 5552, 5672, pid, args)
            runs.update(amqp_runs(ab, 5672, pid, args))
            results.setdefault("RabbitMQ", []).append(runs)
        if args.json_out:  # after each repeat: a run cut short keeps what it measured
            with open(args.json_out, "w") as f:
                json.dump(results, f, indent=1)
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(svg(results, args.only))
    print("%s; %s; hutch %s; medians of %d run(s); SP1-SP4 %g s after %g s; SP5 %d messages; S9-S11 %d records\n"
          % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine(), revision(), args.repeat, args.duration,
             args.warmup, args.fill, args.records))
    print("`%s`\n" % " ".join(["python"] + sys.argv))
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
