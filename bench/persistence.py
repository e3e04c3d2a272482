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
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMQPBENCH_SRC = os.path.join(os.path.dirname(ROOT), "shared", "amqpbench")
MB = 1024 * 1024


def log(msg: str) -> None:
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# --- amqpbench ------------------------------------------------------------------------------

def build_amqpbench(src: str) -> str:
    if not os.path.isfile(os.path.join(src, "amqpbench.c")):
        sys.exit("amqpbench source not found in %s (use --amqpbench PATH)" % src)
    build = tempfile.mkdtemp(prefix="amqpbench-build-")
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if os.path.isfile(path) and name != "amqpbench":
            shutil.copy(path, build)
    log("building amqpbench in %s" % build)
    result = subprocess.run(["make", "-C", build], capture_output=True, text=True)
    binary = os.path.join(build, "amqpbench")
    if result.returncode != 0 or not os.path.isfile(binary):
        sys.exit("building amqpbench failed (apt-get install -y librabbitmq-dev make gcc):\n"
                 + result.stdout + result.stderr)
    return binary


def amqpbench(binary: str, uri: str, args: list[str], broker_pid: int | None) -> dict:
    cmd = [binary, "--uri", uri, "--json", "--quiet", *args]
    if broker_pid:
        cmd += ["--broker-pid", str(broker_pid)]
    log("$ " + " ".join(cmd[:1] + cmd[3:]))
    result = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError("amqpbench failed (exit %d): %s %s" % (result.returncode, result.stdout[-2000:], result.stderr[-2000:]))
    return json.loads(lines[-1])


# --- RSS sampling ---------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (load-independent, unlike wall time)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_bytes(pid: int) -> int | None:
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Samples VmRSS of one pid every `interval` seconds in a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_bytes(self.pid)
            if rss is not None:
                self.peak = max(self.peak, rss)
                self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        rss = rss_bytes(self.pid)
        if rss is not None:
            self.peak = max(self.peak, rss)


@contextmanager
def profiled(pid: int, out_dir: str | None, name: str, delay: float = 5.0, duration: int = 10):
    """With --profile DIR: py-spy record (raw folded stacks) of the broker for `duration` s,
    starting `delay` s into the phase."""
    if not out_dir:
        yield
        return
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "%s.txt" % name)
    proc: list[subprocess.Popen] = []

    def start() -> None:
        proc.append(subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(duration), "-r", "100",
                                      "-f", "raw", "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    timer = threading.Timer(delay, start)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        for p in proc:
            try:
                p.wait(timeout=duration + 15)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.path.exists(out):
            log("profile written to %s" % out)


# --- hutch process --------------------------------------------------------------------------

def dir_size(path: str) -> int:
    """Bytes in every file under `path` (the broker's data directory)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hutch:
    def __init__(self, data_dir: str, port: int, extra: list[str]) -> None:
        self.data_dir, self.port, self.extra = data_dir, port, extra
        self.proc: subprocess.Popen | None = None
        self.uri = "amqp://guest:guest@127.0.0.1:%d/%%2f" % port

    def start(self) -> None:
        logf = open(os.path.join(self.data_dir, "broker.log"), "ab")
        cmd = [sys.executable, "-m", "cli.server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--data-dir", self.data_dir, "--log-level", "warning",
               "--management-enabled", "false", "--prometheus-enabled", "false", "--mqtt-enabled", "false",
               *self.extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> float:
        """Sends `sig` and waits for the exit; returns the seconds it took."""
        t0 = time.monotonic()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        return time.monotonic() - t0


def answers_amqp(port: int) -> bool:
    """True when the broker answers the protocol header with a method frame (connection.start)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = s.recv(7)
            return len(data) >= 1 and data[0] == 1
    except OSError:
        return False


def wait_serving(port: int, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("broker exited with %s during start" % proc.returncode)
        if answers_amqp(port):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError("broker not serving after %.0f s" % timeout)


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


# --- phases ---------------------------------------------------------------------------------

def fill_drain(binary: str, uri: str, pid_of, queue: str, n: int, label: str, profile: str | None,
               between=None) -> dict:
    """1 KiB persistent fill with confirms, optional `between(result)` step, then drain."""
    res: dict = {"target": label, "messages": n}
    pid = pid_of()
    with RssSampler(pid) as s, profiled(pid, profile, "%s-fill" % label):
        t0 = time.monotonic()
        out = amqpbench(binary, uri, ["--consumers", "0", "--pmessages", str(n), "--size", "1024",
                                      "--persistent", "--confirm", "100", "--keep", "--queue", queue], pid)
        res["fill_s"] = time.monotonic() - t0
    res.update(fill_rate=out.get("confirm_rate") or out.get("publish_rate"), fill_publish_rate=out.get("publish_rate"),
               fill_sent=out.get("total_sent"), fill_rss_peak=s.peak, fill_other_cpu=out.get("other_cpu_pct"),
               fill_broker_cpu=out.get("broker_cpu_pct"), fill_raw=out)
    log("%s fill: %.0f msg/s confirmed, peak RSS %.1f MiB" % (label, res["fill_rate"] or 0, s.peak / MB))
    if between:
        between(res)
    pid = pid_of()
    with RssSampler(pid) as s, profiled(pid, profile, "%s-drain" % label):
        t0 = time.monotonic()
        out = amqpbench(binary, uri, ["--producers", "0", "--cmessages", str(n), "--persistent",
                                      "--prefetch", "100", "--multi-ack-every", "10", "--queue", queue], pid)
        res["drain_s"] = time.monotonic() - t0
    res.update(drain_rate=out.get("consume_rate"), drain_received=out.get("total_received"), drain_rss_peak=s.peak,
               drain_other_cpu=out.get("other_cpu_pct"), drain_broker_cpu=out.get("broker_cpu_pct"), drain_raw=out)
    log("%s drain: %.0f msg/s, peak RSS %.1f MiB" % (label, res["drain_rate"] or 0, s.peak / MB))
    return res


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


def listening_pid(port: int) -> int | None:
    """The pid of the process holding the listening TCP socket on `port` (via /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in list(f)[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return int(pid)
    return None


def rabbitmq_pid(uri: str) -> int:
    """The beam.smp listening on the URI's port (rabbitmqctl and other Erlang tools run a
    beam.smp too, so `pgrep -f beam.smp` alone can pick the wrong one)."""
    pid = listening_pid(urllib.parse.urlparse(uri).port or 5672)
    if pid is None:
        out = subprocess.run(["pgrep", "-o", "-f", "beam.smp"], capture_output=True, text=True).stdout.split()
        if not out:
            raise RuntimeError("no beam.smp process (is RabbitMQ running?)")
        pid = int(out[0])
    return pid


def delete_queue(uri: str, queue: str) -> None:
    import pika
    try:
        conn = pika.BlockingConnection(pika.URLParameters(uri))
        conn.channel().queue_delete(queue)
        conn.close()
    except Exception as exc:  # the drain normally deleted it already
        log("delete %s: %s" % (queue, exc))


# --- report ---------------------------------------------------------------------------------

def revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "?"


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return "%s, %d cores, %.0f GiB RAM, Linux %s, Python %s" % (cpu, os.cpu_count(), mem, platform.release(),
                                                              platform.python_version())


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
