#!/usr/bin/env python3
"""Scenarios S1-S8 on hutch and RabbitMQ, driven by amqpbench, in one table (the performance issue).

    python bench/scenarios.py --generator /tmp/amqpbench/amqpbench                  # S1-S8, one run each
    python bench/scenarios.py --generator /tmp/amqpbench/amqpbench --repeat 3       # median of 3
    python bench/scenarios.py --scenarios S1,S8 --duration 10 --no-rabbitmq
    python bench/scenarios.py --scale --generator /tmp/amqpbench/amqpbench          # scale characteristics
    python bench/scenarios.py --garagemq --scenarios S1,S2,S3,S4,S5 --repeat 3      # garagemq beside them

Each run of a scenario on hutch starts a fresh hutch from this checkout (free port, empty data
directory, removed after); RabbitMQ is the node at --rabbitmq-url, shared and never restarted
(its RSS is that of the beam.smp holding the port, so it includes whatever else the node holds).
With --garagemq, Debian's garagemq (Go) is a third broker, started fresh for each run of S1, S2,
S4 and S5 (its own config file and database in a temporary directory, free ports).
Every rate comes with the broker's CPU microseconds per message (/proc, see measures.py).
Without --generator, amqpbench is built from ../shared/amqpbench in a temporary directory.
The table goes to stdout (Markdown), progress to stderr; --json-out keeps every run's figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The bench scripts import each other as top-level modules; this makes
# `python -m bench.scenarios` work as well as `python bench/scenarios.py`.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import AMQPBENCH_SRC, answers_amqp_uri, build_amqpbench, machine, revision
from measures import (GARAGEMQ_SCENARIOS, GaragemqBroker, HutchBroker, RabbitMQBroker, Scenario, Settings, backlog,
                      empty_queues, idle_connections, notes, route_cost_rows, rows, run_all, timed)
from results_table import Metric, table

# The performance issue's targets: hutch / RabbitMQ >= 2 on S1-S5, hutch / garagemq >= 1 on S1 and
# S4, S8's p99 no worse than RabbitMQ's.
CONSUMED = Metric("consumed", "consumed msg/s", ">= 2")
CPU = Metric("cpu_us", "broker CPU µs per message")
S2_SHAPE = "--size 1024 --prefetch 100 --multi-ack-every 10"
PER_CONNECTION = (Metric("per_connection_kib", "RSS KiB per idle connection"),
                  Metric("node_kib", "KiB per idle connection in RabbitMQ's memory_breakdown (connection_*)"))

SCENARIOS = [
    Scenario("S1", "transient, 1 producer -> 1 queue -> 1 consumer, 16 B, autoack",
             (Metric("consumed", "consumed msg/s", ">= 2", ">= 1"), CPU), timed("--size 16 --autoack")),
    Scenario("S2", "transient, 1 KiB, manual ack, prefetch 100, multi-ack every 10", (CONSUMED, CPU),
             timed(S2_SHAPE)),
    Scenario("S3", "persistent, durable queue, 1 KiB, confirms window 100, prefetch 100, multi-ack every 10",
             (CONSUMED, CPU), timed(S2_SHAPE + " --persistent --confirm 100")),
    Scenario("S4", "fanout to 10 queues, 10 consumers, 256 B, autoack",
             (Metric("consumed", "deliveries/s", ">= 2", ">= 1"), Metric("cpu_us", "broker CPU µs per delivery")),
             timed("--size 256 --autoack --exchange {name} --type fanout --queues 10 --consumers 10")),
    Scenario("S5", "topic exchange with 1,000 bindings, 1 producer -> 1 consumer, 16 B, autoack", (CONSUMED, CPU),
             timed("--size 16 --autoack --exchange {name} --type topic --topic-bindings 1000 --routing-key a.500.x")),
    Scenario("S6", "--backlog persistent 1 KiB messages, confirms window 100, into one durable queue, then drained",
             (Metric("fill", "fill, confirmed msg/s", ">= 1"), Metric("fill_cpu_us", "fill, broker CPU µs per message"),
              Metric("drain", "drain msg/s", ">= 1"), Metric("drain_cpu_us", "drain, broker CPU µs per message"),
              Metric("rss_mib", "peak RSS MiB (fill and drain)", "< 150")), backlog),
    Scenario("S7", "--idle-connections idle connections, 1 channel each", PER_CONNECTION, idle_connections),
    Scenario("S8", "1 KiB at a fixed 1,000 msg/s, prefetch 100, multi-ack every 10: end-to-end latency",
             (Metric("p50", "latency p50 ms"), Metric("p99", "latency p99 ms", "<= 1"), CPU),
             timed(S2_SHAPE + " --rate 1000")),
]

SCALE_RATE = (Metric("consumed", "consumed msg/s"), Metric("cpu_us", "broker CPU µs per message"))
TOPIC_BINDINGS = (10, 100, 1000, 10_000, 100_000)
TOPIC_KEY = "a.0.x"  # matches a.0.* whatever the number of bindings, and nothing else


def scale_scenarios() -> list[Scenario]:
    """Throughput with 1/10/100 queues (as many producers and consumers), with 10/100 producers
    into one queue (PerfTest's defaults: 12 B, manual ack of every message, no prefetch limit),
    end-to-end topic routing as bindings grow (S5's shape), memory per
    idle connection and per empty queue."""
    queues = [Scenario("%d queue%s" % (k, "s" if k > 1 else ""), "%d producers -> %d queues -> %d consumers, "
                       "PerfTest's defaults" % (k, k, k), SCALE_RATE,
                       timed("--queues %d --producers %d --consumers %d" % (k, k, k))) for k in (1, 10, 100)]
    producers = [Scenario("%d producers" % p, "%d producers -> 1 queue -> 1 consumer, PerfTest's defaults" % p,
                          SCALE_RATE, timed("--producers %d" % p)) for p in (10, 100)]
    topic = [Scenario("topic, {:,} bindings".format(n), "S5's shape with %d bindings, routing key %s" % (n, TOPIC_KEY),
                      SCALE_RATE, timed("--size 16 --autoack --exchange {name} --type topic --topic-bindings %d "
                                        "--routing-key %s" % (n, TOPIC_KEY))) for n in TOPIC_BINDINGS]
    memory = [Scenario("idle connections", "as S7", PER_CONNECTION, idle_connections),
              Scenario("empty queues", "--empty-queues non-durable queues declared on one channel",
                       (Metric("per_queue_kib", "RSS KiB per empty queue"),
                        Metric("node_kib", "KiB per empty queue in RabbitMQ's memory_breakdown (queue_procs)")),
                       empty_queues)]
    return queues + producers + topic + memory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", metavar="PATH", help="amqpbench binary (default: build it from %s)" % AMQPBENCH_SRC)
    p.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS), help="comma-separated (default: all)")
    p.add_argument("--scale", action="store_true", help="measure the scale characteristics instead of S1-S8")
    p.add_argument("--duration", type=float, default=20, help="measured seconds of a timed run (default 20)")
    p.add_argument("--warmup", type=float, default=5, help="seconds before the measured window (default 5)")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario and broker; the table shows the median")
    p.add_argument("--backlog", type=int, default=1_000_000, help="S6 messages (default 1,000,000)")
    p.add_argument("--idle-connections", type=int, default=1000, help="S7 connections (default 1,000)")
    p.add_argument("--empty-queues", type=int, default=10_000, help="queues declared for memory per queue (--scale)")
    p.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    p.add_argument("--no-rabbitmq", action="store_true", help="measure hutch only")
    p.add_argument("--garagemq", nargs="?", const="garagemq", metavar="BINARY",
                   help="also measure Debian's garagemq (default binary: garagemq on PATH) on %s"
                   % ", ".join(GARAGEMQ_SCENARIOS))
    p.add_argument("--hutch-arg", action="append", default=[], help="extra hutch flag (repeatable), e.g. "
                   "--hutch-arg=--storage-durability=flush")
    p.add_argument("--profile", metavar="DIR", help="py-spy record 10 s of each hutch run into DIR (slows hutch)")
    p.add_argument("--json-out", metavar="FILE", help="write every run's figures as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        scenarios = scale_scenarios()
    else:
        by_name = {s.name: s for s in SCENARIOS}
        wanted = [n.strip().upper() for n in args.scenarios.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            sys.exit("unknown scenario(s) %s; known: %s" % (", ".join(unknown), ", ".join(by_name)))
        scenarios = [by_name[n] for n in wanted]
    brokers = [HutchBroker(args.hutch_arg)]
    if not args.no_rabbitmq:
        if not answers_amqp_uri(args.rabbitmq_url):
            sys.exit("RabbitMQ does not answer at %s (use --no-rabbitmq)" % args.rabbitmq_url)
        brokers.append(RabbitMQBroker(args.rabbitmq_url))
    if args.garagemq:
        brokers.append(GaragemqBroker(args.garagemq))
    settings = Settings(generator=args.generator or build_amqpbench(AMQPBENCH_SRC), duration=args.duration,
                        warmup=args.warmup, repeat=args.repeat, backlog=args.backlog,
                        idle_connections=args.idle_connections, empty_queues=args.empty_queues, profile=args.profile)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = run_all(settings, scenarios, brokers)
    table_rows = rows(scenarios, results)
    if args.scale:
        table_rows += route_cost_rows(TOPIC_BINDINGS, TOPIC_KEY)
    command = " ".join(["python"] + sys.argv)
    print("%s; %s; hutch %s; %d run(s) per figure, median shown\n" % (started, machine(), revision(), args.repeat))
    print("`%s`\n" % command)
    print(table(table_rows, garagemq=bool(args.garagemq)))
    if args.garagemq:
        print("\n- garagemq measured on %s only (S3 and S6: it never confirms a persistent message to a "
              "durable queue)." % ", ".join(GARAGEMQ_SCENARIOS))
    for note in notes(results):
        print("\n- " + note)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": command, "started": started, "machine": machine(), "revision": revision(),
                       "scenarios": {s.name: s.title for s in scenarios}, "results": results}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
