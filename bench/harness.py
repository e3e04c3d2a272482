"""What the benchmark scripts share: amqpbench, the brokers' processes, RSS and CPU sampling.

- `amqpbench`: the C load generator (`../shared/amqpbench`, PerfTest's options), built on demand
  and run once per phase; its one JSON line of results is returned as a dict.
- `Hutch` / `fresh_hutch`: a hutch server started from this checkout on a free port;
  `fresh_garagemq`: Debian's garagemq (Go) the same way, with its own config file;
  `rabbitmq_pid`: the `beam.smp` holding a RabbitMQ listener (found through /proc).
- `RssSampler`: a thread sampling a pid's VmRSS, keeping the peak; `profiled`: py-spy on demand.
- `fill_drain`: the backlog phase (persistent 1 KiB with confirms into one queue, then drained).
"""
from __future__ import annotations

import json
import os
import platform
import re
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
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _shared_amqpbench() -> str:
    """../shared/amqpbench next to this checkout, or next to one of its parents (a git worktree)."""
    here = ROOT
    while os.path.dirname(here) != here:
        here = os.path.dirname(here)
        candidate = os.path.join(here, "shared", "amqpbench")
        if os.path.isdir(candidate):
            return candidate
    return os.path.join(os.path.dirname(ROOT), "shared", "amqpbench")


AMQPBENCH_SRC = _shared_amqpbench()
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


def amqpbench(binary: str, uri: str, args: list[str], broker_pid: int | None, timeout: float | None = None,
              when: tuple[str, Callable[[], None]] | None = None) -> dict:
    """Runs one amqpbench phase and returns its JSON results. Raises when it fails, unless only its
    clean-up failed (no errors during the run): then the results carry "cleanup_error".
    `when=(prefix, call)`: call `call()` once amqpbench prints a progress line starting with
    `prefix` (e.g. "opened " once the idle connections are all open)."""
    cmd = [binary, "--uri", uri, "--json", *args]
    if when is None:
        cmd.append("--quiet")
    if broker_pid:
        cmd += ["--broker-pid", str(broker_pid)]
    log("$ " + " ".join(cmd[:1] + cmd[3:]))
    seen = []  # stderr read while waiting for `when`'s line: an early failure's message is in it
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        if when is not None:
            for line in proc.stderr:
                if line.startswith(when[0]):
                    when[1]()
                    break
                seen.append(line)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            stderr = "".join(seen[-20:]) + stderr
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    results = json.loads(lines[-1]) if lines else None
    if proc.returncode != 0 and results is not None and not results.get("errors"):
        log("amqpbench: the run went through, its clean-up failed: %s" % stderr.strip()[-300:])
        results["cleanup_error"] = stderr.strip()[-2000:]
    elif proc.returncode != 0 or results is None:
        raise RuntimeError("amqpbench failed (exit %d): %s %s" % (proc.returncode, stdout[-2000:], stderr[-2000:]))
    return results


# --- RSS and CPU sampling -------------------------------------------------------------------

def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (load-independent, unlike wall time)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of `pid` (hutch's shard processes under its supervisor)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def tree_cpu_seconds(pid: int) -> float | None:
    """cpu_seconds of `pid` and its direct children (a hutch of several shards: the supervisor and
    its shard processes; children that ended are not counted)."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(cpu_seconds(child) or 0 for child in children(pid))


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the threads of `pid` have spent runnable but waiting for a CPU (the second field of
    /proc/PID/task/TID/schedstat): time lost to other work on the machine, not to the broker's code."""
    total = 0
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                pass  # the thread ended meanwhile
    except OSError:
        return None
    return total / 1e9


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


# --- brokers --------------------------------------------------------------------------------

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
    def __init__(self, data_dir: str, port: int, extra: list[str], root: str = ROOT,
                 preexec: Callable[[], None] | None = None) -> None:
        self.data_dir, self.port, self.extra, self.root, self.preexec = data_dir, port, extra, root, preexec
        self.proc: subprocess.Popen | None = None
        self.uri = "amqp://guest:guest@127.0.0.1:%d/%%2f" % port

    def start(self) -> None:
        logf = open(os.path.join(self.data_dir, "broker.log"), "ab")
        # AMQP only: the RabbitMQ compared with holds the management and
        # metrics ports, and the scenarios drive AMQP.
        cmd = [sys.executable, "-m", "cli.server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--data-dir", self.data_dir, "--log-level", "warning",
               "--management-enabled", "false", "--prometheus-enabled", "false", "--mqtt-enabled", "false", "--stream-enabled", "false",
               *self.extra]
        self.proc = subprocess.Popen(cmd, cwd=self.root, stdout=logf, stderr=subprocess.STDOUT,
                                     preexec_fn=self.preexec)
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


def answers_amqp(port: int, host: str = "127.0.0.1") -> bool:
    """True when the broker answers the protocol header with a method frame (connection.start)."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            data = s.recv(7)
            return len(data) >= 1 and data[0] == 1
    except OSError:
        return False


def answers_amqp_uri(uri: str) -> bool:
    parsed = urllib.parse.urlparse(uri)
    return answers_amqp(parsed.port or 5672, parsed.hostname or "127.0.0.1")


def wait_serving(port: int, proc: subprocess.Popen, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("broker exited with %s during start" % proc.returncode)
        if answers_amqp(port):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError("broker not serving after %.0f s" % timeout)


@contextmanager
def fresh_hutch(extra: list[str] = (), root: str = ROOT, preexec: Callable[[], None] | None = None):
    """A hutch (the source tree at `root`, default this checkout) on a free port with an empty
    temporary data directory; stopped and removed after. `preexec` runs in the child before the
    exec (scale.py: enter a CPU-quota cgroup)."""
    data_dir = tempfile.mkdtemp(prefix="hutch-bench-")
    hutch = Hutch(data_dir, free_port(), list(extra), root, preexec)
    try:
        hutch.start()
        wait_serving(hutch.port, hutch.proc, 60)
        yield hutch
    finally:
        hutch.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


# garagemq's config (the package's /etc/garagemq/config.yaml with our ports and data directory):
# its `proto: amqp-rabbit` speaks RabbitMQ's dialect; guest/guest with the md5 of "guest".
GARAGEMQ_CONFIG = """proto: amqp-rabbit
users:
  - username: guest
    password: 084e0343a0486ff05530df6c705c8bb4
tcp:
  ip: 127.0.0.1
  port: {port}
  nodelay: false
  readBufSize: 196608
  writeBufSize: 196608
admin:
  ip: 127.0.0.1
  port: {admin_port}
queue:
  shardSize: 8192
  maxMessagesInRam: 131072
db:
  defaultPath: {data_dir}/db
  engine: badger
vhost:
  defaultPath: /
security:
  passwordCheck: md5
connection:
  channelsMax: 4096
  frameMaxSize: 65536
"""


@dataclass(frozen=True)
class Started:
    """A broker process started for one run: where it listens and its pid."""
    uri: str
    pid: int


@contextmanager
def fresh_garagemq(binary: str = "garagemq"):
    """Debian's garagemq on a free port (and a free admin port), its config file and badger
    database in a temporary directory; stopped and removed after."""
    data_dir = tempfile.mkdtemp(prefix="garagemq-bench-")
    port = free_port()
    config = os.path.join(data_dir, "config.yaml")
    with open(config, "w") as f:
        f.write(GARAGEMQ_CONFIG.format(port=port, admin_port=free_port(), data_dir=data_dir))
    with open(os.path.join(data_dir, "broker.log"), "ab") as logf:
        proc = subprocess.Popen([binary, "--config", config, "--log-level", "error"], cwd=data_dir,
                                stdout=logf, stderr=subprocess.STDOUT)
    try:
        wait_serving(port, proc, 60)
        yield Started("amqp://guest:guest@127.0.0.1:%d/%%2f" % port, proc.pid)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def files_left(pid: int) -> int | None:
    """How many more files (sockets) `pid` may open: its soft RLIMIT_NOFILE minus its open fds.
    The shared RabbitMQ runs with 1024, too few for 1,000 more connections."""
    try:
        with open("/proc/%d/limits" % pid) as f:
            soft = next(int(line.split()[3]) for line in f if line.startswith("Max open files"))
        return soft - len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, StopIteration, ValueError):
        return None


def rabbitmq_sockets_left() -> int | None:
    """Connections the local RabbitMQ node (rabbitmqctl's default) still accepts: its socket
    limit minus the sockets in use ("Sockets: 3, limit: 832" in `rabbitmqctl status`). The limit is
    below the open-files limit (file_handle_cache keeps some for files), and at the limit the
    node stalls new logins for everyone."""
    try:
        out = subprocess.run(["rabbitmqctl", "status"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"Sockets: (\d+), limit: (\d+)", out)
    return int(found.group(2)) - int(found.group(1)) if found else None


def rabbitmq_memory(prefix: str) -> float | None:
    """KiB that the local RabbitMQ node attributes to the categories starting with `prefix` in
    `rabbitmq-diagnostics memory_breakdown` (e.g. "connection_": readers, writers, channels, other;
    "queue_procs"). Unlike the node's RSS, this does not drift with what else the node does."""
    try:
        out = subprocess.run(["rabbitmq-diagnostics", "-q", "memory_breakdown", "--unit", "kb"],
                             capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.findall(r"^(%s\w*): ([\d.]+) kb" % re.escape(prefix), out, re.MULTILINE)
    return sum(float(kb) for _name, kb in found) if found else None


def tcp_socket_inodes(port: int, state: str) -> set[str]:
    """The inodes (as /proc/PID/fd links name them, "socket:[N]") of the local TCP sockets on
    `port` in `state` (/proc/net/tcp's hex state: "0A" listening, "01" established)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in list(f)[1:]:
                    fields = line.split()
                    if fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add("socket:[%s]" % fields[9])
        except OSError:
            pass
    return inodes


def listening_pid(port: int) -> int | None:
    """The pid of the process holding the listening TCP socket on `port` (via /proc)."""
    inodes = tcp_socket_inodes(port, "0A")
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
            if link in inodes:
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


# --- machine --------------------------------------------------------------------------------

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
