#!/usr/bin/env python3
"""The cost of growth: throughput and broker CPU per message against the number of queues,
connections, consumers per queue, the message size and the backlog depth, hutch beside RabbitMQ.

    python bench/growth.py --generator /tmp/amqpbench/amqpbench --json-out growth.json --svg-dir docs/growth
    python bench/growth.py --quick --generator /tmp/amqpbench/amqpbench            # small sizes: does it work
    python bench/growth.py --render growth.json --svg-dir docs/growth                # charts from a saved run

One amqpbench run per point and broker (a fresh hutch each; RabbitMQ is the shared node at
--rabbitmq-url), --duration s after --warmup s, interleaved (each point: hutch, then RabbitMQ).
What varies, the rest held at PerfTest-like defaults (16 B bodies, autoack, except where said):

- queues N (1 to 10,000): N queues declared; min(N, 100) of them carry traffic, one producer and
  one consumer each (so 1..100 active, the rest idle: does the broker's cost grow with queues it
  holds but does not use?);
- connections N (2 to 5,000): min(N, 100) of them carry traffic (half producers, half consumers,
  a queue per pair), the rest are idle connections with a channel each, opened first by a second
  amqpbench and held through the run (does the broker's cost grow with connections it holds? A
  thread per active connection in the generator: 5,000 active ones on two cores time out in their
  own handshakes, for either broker);
- consumers per queue C (1 to 1,000): one producer, one queue, C consumers (prefetch 100, ack
  every 10th multiple: round-robin has work to do);
- message size S (16 B to 4 MiB): one producer, one consumer, prefetch 100, multi-ack every 10;
- backlog depth D (0 to 10,000,000): D messages of 16 B queued first, then one producer and one
  consumer (prefetch 100, multi-ack every 10) through the deep queue.

Broker CPU per message is as in scenarios.py (the broker's /proc user + system time over the
measured window, over the messages consumed). A point RabbitMQ cannot take (the shared node's
socket limit, SPARE_SOCKETS left to others) is skipped and noted. The results go to --json-out;
`render` draws one SVG per dimension (msg/s and CPU µs per message, log-scaled x) by hand, so
the bench needs no plotting library.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (AMQPBENCH_SRC, amqpbench, answers_amqp_uri, build_amqpbench, log, machine,  # noqa: E402
                     rabbitmq_sockets_left, revision)
from measures import SPARE_SOCKETS, HutchBroker, RabbitMQBroker, cpu_us  # noqa: E402

ACKED = "--prefetch 100 --multi-ack-every 10"
ACTIVE_CONNECTIONS = 100  # the connections dimension's busy ones; the rest are held idle


@dataclass(frozen=True)
class Dimension:
    key: str
    title: str  # what the x axis counts
    full: tuple[int, ...]
    quick: tuple[int, ...]

    def args(self, x: int) -> tuple[str, int]:
        """amqpbench arguments for point `x`, and the connections they open."""
        if self.key == "queues":
            active = min(x, 100)
            return "--size 16 --autoack --queues %d --producers %d --consumers %d" % (x, active, active), 2 * active
        if self.key == "connections":
            half = max(1, min(x, ACTIVE_CONNECTIONS) // 2)
            return "--size 16 --autoack --queues %d --producers %d --consumers %d" % (half, half, half), x
        if self.key == "consumers":
            return "--size 16 %s --queues 1 --producers 1 --consumers %d" % (ACKED, x), 1 + x
        if self.key == "size":
            return "--size %d %s" % (x, ACKED), 2
        return "--size 16 %s" % ACKED, 2  # backlog: filled first (run_point)


DIMENSIONS = (
    Dimension("queues", "queues", (1, 10, 100, 1000, 10_000), (1, 10)),
    Dimension("connections", "connections", (2, 20, 200, 2000, 5000), (2, 20)),
    Dimension("consumers", "consumers per queue", (1, 10, 100, 1000), (1, 10)),
    Dimension("size", "message size, bytes", (16, 1024, 65536, 1 << 20, 4 << 20), (16, 65536)),
    Dimension("backlog", "backlog depth, messages", (0, 10_000, 100_000, 1_000_000, 10_000_000), (0, 10_000)),
)


def run_point(settings: argparse.Namespace, dim: Dimension, x: int, broker) -> dict:
    args, connections = dim.args(x)
    name = "growth-%s-%d-%d" % (dim.key, x, os.getpid())
    if broker.name == RabbitMQBroker.name:
        left = rabbitmq_sockets_left()
        if left is not None and connections > left - SPARE_SOCKETS:
            return {"skipped": "RabbitMQ: %d connections needed, %d left (its socket limit, %d spare)"
                               % (connections, left, SPARE_SOCKETS)}
    with broker.running() as target, idle_held(settings, target, x - 2 * (min(x, ACTIVE_CONNECTIONS) // 2)
                                               if dim.key == "connections" else 0):
        if dim.key == "backlog" and x:
            t0 = time.monotonic()
            amqpbench(settings.generator, target.uri, ["--consumers", "0", "--pmessages", str(x), "--size", "16",
                                                       "--confirm", "1000", "--keep", "--queue", name], target.pid,
                      timeout=7200)
            log("backlog of %d queued in %.0f s" % (x, time.monotonic() - t0))
        out = amqpbench(settings.generator, target.uri,
                        ["--time", "%g" % settings.duration, "--warmup", "%g" % settings.warmup, "--queue", name,
                         "--label", name, *args.split()], target.pid,
                        timeout=settings.duration + settings.warmup + 1800)
    if target.shared:  # RabbitMQ outlives the point: a clean-up that timed out leaves queues (and their messages)
        delete_queues(target.uri, name)
    rate = out["consume_rate"]
    return {"x": x, "consumed": rate, "cpu_us": cpu_us(out["broker_cpu_pct"], rate),
            "mib_s": rate * (x if dim.key == "size" else 16) / 2**20, "amqpbench": out}


@contextmanager
def idle_held(settings: argparse.Namespace, target, n: int) -> Iterator[None]:
    """`n` idle connections (a channel each) held open by a second amqpbench while the body runs."""
    if n <= 0:
        yield
        return
    cmd = [settings.generator, "--uri", target.uri, "--idle-connections", str(n), "--idle-threads", "8",
           "--time", "3600"]
    log("$ " + " ".join(cmd[:1] + cmd[3:]))
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as holder:
        try:
            for line in holder.stderr:
                if line.startswith("opened "):
                    break
            else:
                raise RuntimeError("amqpbench could not open %d idle connections (exit %s)" % (n, holder.wait()))
            log("%d idle connections open" % n)
            yield
        finally:
            holder.terminate()


def delete_queues(url: str, prefix: str) -> None:
    """Delete every queue of the shared RabbitMQ whose name starts with `prefix`: amqpbench's own
    clean-up times out on a busy node and would leave them (with their messages) to the next points."""
    parts = urllib.parse.urlsplit(url)
    api = "http://%s:15672/api/queues/%s" % (parts.hostname, urllib.parse.quote(urllib.parse.unquote(parts.path[1:]) or "/", safe=""))
    auth = "Basic " + base64.b64encode(("%s:%s" % (parts.username or "guest", parts.password or "guest")).encode()).decode()

    def call(method: str, where: str):
        request = urllib.request.Request(where, method=method, headers={"Authorization": auth})
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read() or b"null")

    try:
        names = [q["name"] for q in call("GET", api + "?columns=name") if q["name"].startswith(prefix)]
        for queue in names:
            try:
                call("DELETE", api + "/" + urllib.parse.quote(queue, safe=""))
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # 404: amqpbench's own clean-up got there first
                    raise
    except OSError as exc:
        log("could not delete RabbitMQ's %s* queues: %s" % (prefix, exc))
        return
    if names:
        log("deleted %d queues left by amqpbench on RabbitMQ" % len(names))


# --- charts -------------------------------------------------------------------------------

COLOURS = {"hutch": "#d9480f", "RabbitMQ": "#1864ab"}
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 360, 240, 64, 28, 28, 44
LEGEND = 18  # a row under both charts


def _ticks(lo: float, hi: float) -> list[float]:
    """Round values spanning [lo, hi] for a linear axis."""
    if hi <= lo:
        hi = lo + 1
    step = 10 ** math.floor(math.log10((hi - lo) / 4))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= 5:
            step *= mult
            break
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2) if first + i * step <= hi * 1.0001]


def _label(v: float, binary: bool = False) -> str:
    units = (("Mi", 2**20), ("Ki", 2**10)) if binary else (("M", 1e6), ("k", 1e3))
    for unit, size in units:
        if abs(v) >= size:
            return ("%g" % (v / size)) + unit
    return "%g" % v


def panel(series: dict[str, list[tuple[float, float]]], x_title: str, y_title: str, ox: int,
          binary: bool = False, log_y: bool = False) -> list[str]:
    """One chart at x offset `ox`: a line per broker, log x (0 drawn at the left edge), linear y from
    0, or log y (`log_y`, for values spanning decades); `binary`: x labels in KiB/MiB."""
    points = [p for s in series.values() for p in s]
    if not points:
        return []
    xs = sorted({p[0] for p in points})
    lx = [math.log10(max(x, 1)) for x in xs]
    x_lo, x_hi = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1
    if log_y:
        y_lo = 10 ** math.floor(math.log10(min(p[1] for p in points)))
        y_hi = 10 ** math.ceil(math.log10(max(p[1] for p in points)))
        ticks = [10 ** e for e in range(round(math.log10(y_lo)), round(math.log10(y_hi)) + 1)]
    else:
        y_hi = max(p[1] for p in points) * 1.1 or 1
        ticks = _ticks(0, y_hi)
        y_hi = max(ticks[-1], y_hi)

    def px(x: float) -> float:
        return ox + PAD_L + (math.log10(max(x, 1)) - x_lo) / (x_hi - x_lo) * (W - PAD_L - PAD_R)

    def py(y: float) -> float:
        if log_y:
            return PAD_T + (1 - math.log10(y / y_lo) / math.log10(y_hi / y_lo)) * (H - PAD_T - PAD_B)
        return PAD_T + (1 - y / y_hi) * (H - PAD_T - PAD_B)

    out = ['<text x="%d" y="16" font-size="12" font-weight="bold">%s</text>' % (ox + PAD_L, y_title)]
    for t in ticks:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>'
                   % (ox + PAD_L, ox + W - PAD_R, py(t), py(t)))
        out.append('<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>' % (ox + PAD_L - 4, py(t) + 3,
                                                                                          _label(t)))
    for x in xs:
        out.append('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>' % (px(x), H - PAD_B + 14,
                                                                                         _label(x, binary)))
    out.append('<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>' % (
        ox + (PAD_L + W - PAD_R) // 2, H - 8, x_title))
    for broker, pts in series.items():
        pts = sorted(pts)
        if not pts:
            continue
        path = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in pts)
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>' % (path, COLOURS[broker]))
        out += ['<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (px(x), py(y), COLOURS[broker]) for x, y in pts]
    return out


def figure(body: list[str], panels: int) -> str:
    """An SVG of `panels` charts side by side (their elements in `body`) with the brokers' legend
    centred under them."""
    legend = []
    for i, b in enumerate(COLOURS):
        x, y = panels * W // 2 - 80 + 90 * i, H + LEGEND - 4
        legend.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>'
                      % (x, x + 14, y - 4, y - 4, COLOURS[b]))
        legend.append('<text x="%d" y="%d" font-size="11" fill="%s">%s</text>' % (x + 18, y, COLOURS[b], b))
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
            '<rect width="100%%" height="100%%" fill="white"/>%s</svg>\n' % (panels * W, H + LEGEND,
                                                                            "".join(body + legend)))


def render(results: dict, svg_dir: str) -> list[str]:
    """One SVG per dimension: throughput (left) and broker CPU µs per message (right)."""
    os.makedirs(svg_dir, exist_ok=True)
    written = []
    for dim in DIMENSIONS:
        runs = results.get("dimensions", {}).get(dim.key)
        if not runs:
            continue
        rate = {b: [(r["x"], r["consumed"]) for r in rs if r.get("consumed")] for b, rs in runs.items()}
        cpu = {b: [(r["x"], r["cpu_us"]) for r in rs if r.get("cpu_us")] for b, rs in runs.items()}
        binary = dim.key == "size"  # bodies span five decades: so do the rates and costs (log y)
        body = (panel(rate, dim.title, "msg/s" + (" (log)" if binary else ""), 0, binary, binary)
                + panel(cpu, dim.title, "broker CPU µs per message" + (" (log)" if binary else ""), W, binary,
                        binary))
        path = os.path.join(svg_dir, "%s.svg" % dim.key)
        with open(path, "w") as f:
            f.write(figure(body, 2))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", metavar="PATH")
    p.add_argument("--dimensions", default=",".join(d.key for d in DIMENSIONS))
    p.add_argument("--quick", action="store_true", help="two small points per dimension (checks the harness)")
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/%2f")
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument("--hutch-arg", action="append", default=[])
    p.add_argument("--json-out", metavar="FILE")
    p.add_argument("--svg-dir", metavar="DIR", help="write one SVG chart per dimension here")
    p.add_argument("--render", metavar="JSON", help="only draw the charts of a saved --json-out")
    args = p.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
        for path in render(results, args.svg_dir or "."):
            print(path)
        return 0
    wanted = [k.strip() for k in args.dimensions.split(",") if k.strip()]
    dims = [d for d in DIMENSIONS if d.key in wanted]
    brokers = [HutchBroker(args.hutch_arg)]
    if not args.no_rabbitmq:
        if not answers_amqp_uri(args.rabbitmq_url):
            sys.exit("RabbitMQ does not answer at %s (use --no-rabbitmq)" % args.rabbitmq_url)
        brokers.append(RabbitMQBroker(args.rabbitmq_url))
    args.generator = args.generator or build_amqpbench(AMQPBENCH_SRC)
    results = {"command": " ".join(["python"] + sys.argv),
               "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": machine(), "revision": revision(), "dimensions": {}}
    for dim in dims:
        runs = results["dimensions"][dim.key] = {b.name: [] for b in brokers}
        for x in (dim.quick if args.quick else dim.full):
            for broker in brokers:
                try:
                    point = run_point(args, dim, x, broker)
                except (RuntimeError, OSError) as exc:
                    point = {"x": x, "error": str(exc)[-500:]}
                point["x"] = x
                log("%s %s on %s: %s" % (dim.key, x, broker.name, point.get("skipped") or point.get("error") or
                                         "%.0f msg/s, %.3g µs/msg" % (point["consumed"], point["cpu_us"] or -1)))
                runs[broker.name].append(point)
                if args.json_out:  # after every point: a long run that fails later keeps what it measured
                    with open(args.json_out, "w") as f:
                        json.dump(results, f, indent=1, default=str)
    print("| dimension | x | broker | msg/s | broker CPU µs/msg |\n|---|---|---|---|---|")
    for key, runs in results["dimensions"].items():
        for broker, points in runs.items():
            for r in points:
                print("| %s | %s | %s | %s | %s |" % (key, r["x"], broker,
                                                    "%.0f" % r["consumed"] if r.get("consumed") else "-",
                                                    "%.3g" % r["cpu_us"] if r.get("cpu_us") else
                                                    (r.get("skipped") or r.get("error") or "-")))
    if args.svg_dir:
        for path in render(results, args.svg_dir):
            log("chart written to %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
