"""A node of several shards (docs/scaling.md): this process supervises one
child process per shard and serves nothing itself.

- Ports: every client listener port is resolved here first (a port 0 gets
  its number) by a socket bound with SO_REUSEPORT and never listening, held
  for the node's life so the port stays ours between shard restarts; each
  shard then listens on the same port with SO_REUSEPORT, and the kernel
  spreads new connections over the shards that listen.
- Data: shard 0 keeps the node's data directory itself (so a node that had
  one process keeps its queues where they are), shard K > 0 keeps
  DATA_DIR/shards/K. The directory's lock, claimed before this process
  starts, is inherited by every shard, so it lasts until the last of them
  ends. A node restarted with fewer shards than hold queues refuses to
  start (their queues would be out of reach); the default count grows to
  cover them instead.
- Links: the shards reach each other over Unix sockets in a directory only
  this user may enter (`LinkDirectory`), made here and removed at the stop.
- Lifetime: the shards are forked before this process starts any thread or
  event loop. A shard that exits unasked is forked again (its storage
  recovers as after a crash) while the others keep serving; SIGTERM or
  SIGINT is passed to every shard, and this process exits once they have.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import math
import os
import shutil
import signal
import socket
import sqlite3
import tempfile
import time

from amqp_server.shared.config import BrokerConfig
from amqp_server.shared.errors import ListenError

log = logging.getLogger("hutch.shards")

# A shard that dies within this many seconds of its start is not restarted
# at once again: a shard that cannot start (a full disk, a broken file)
# would otherwise be forked in a tight loop.
RESTART_BACKOFF = (0.1, 5.0)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A shard's exit status when it cannot start (a port taken, a data directory it cannot make,
# uvloop asked for but missing): the node stops with the shard's reason, as one process would.
CANNOT_START = 3


@dataclasses.dataclass(frozen=True)
class Shard:
    """Where one shard stands among its node's shards."""

    index: int
    count: int
    links: str  # the directory of the shards' link sockets
    # Shard 0's first start: the node's data directory as the supervisor found it (Supervisor.run).
    data_directory: object = None

    def socket(self, index: int) -> str:
        return os.path.join(self.links, "%d.sock" % index)

    def accepted(self) -> None:
        """This shard accepted its first client: tell the supervisor, which
        then keeps the node's data directory even if the start fails."""
        try:
            with open(os.path.join(self.links, ACCEPTED), "w"):
                pass
        except OSError:  # the supervisor has ended and removed the directory: nothing to tell
            pass


MAX_SHARDS = 64
ACCEPTED = "accepted"  # in the links directory, once any shard accepted a client (Shard.accepted)


def shard_count(config: BrokerConfig) -> int:
    """`shards` as set, or for 0 (the default) as many as the cores this
    process may use, up to MAX_SHARDS, and at least as many as hold queues
    or messages in the data directory (a node moved to fewer cores keeps
    every queue in reach; read under the directory's lock); one in a
    cluster unless set (docs/scaling.md: every node of a cluster must run
    as many)."""
    if config.shards:
        return config.shards
    if config.cluster.enabled:
        return 1
    cores = min(usable_cores(), MAX_SHARDS)
    held = _highest_held(config.data_dir, cores)
    if held is None:
        return cores
    index, what = held
    log.warning("%d shards, not the %d of the cores this process may use: shard %d holds queues (%s)",
                index + 1, cores, index, what)
    return index + 1


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by its
    cgroup's CPU quota (a container limited to 1.5 cores of 8 gets 2)."""
    cores = len(os.sched_getaffinity(0))
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def _cgroup_cpu_quota() -> float | None:
    """Cores' worth of CPU time this process's cgroup may use; None: no quota
    (cgroup v2's cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us)."""
    try:
        with open("/proc/self/cgroup") as entries:
            lines = entries.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _hierarchy, controllers, path = line.split(":", 2)
        try:
            if controllers == "":  # v2: "max 100000" or "150000 100000"
                with open(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "cpu.max")) as limit:
                    quota, period = limit.read().split()
                if quota != "max":
                    return int(quota) / int(period)
            elif "cpu" in controllers.split(","):
                directory = os.path.join("/sys/fs/cgroup", controllers, path.lstrip("/"))
                with open(os.path.join(directory, "cpu.cfs_quota_us")) as limit:
                    quota = int(limit.read())
                with open(os.path.join(directory, "cpu.cfs_period_us")) as limit:
                    period = int(limit.read())
                if quota > 0:
                    return quota / period
        except (OSError, ValueError):
            continue
    return None


def shard_data_dir(data_dir: str, index: int) -> str:
    return data_dir if index == 0 else os.path.join(data_dir, "shards", str(index))


def check_shard_dirs(data_dir: str, count: int) -> None:
    """Refuse a shard count that leaves a shard's queues or messages behind;
    a shard's directory that holds neither (it served only clients) is no
    reason to refuse, and is left as it is."""
    held = _highest_held(data_dir, count)
    if held is not None:
        index, what = held
        raise ListenError(
            "shard %d of this node holds queues (%s), but shards is %d: start with shards >= %d, "
            "or move the queues off that shard first" % (index, what, count, index + 1))


def _highest_held(data_dir: str, least: int) -> tuple[int, str] | None:
    """(index, what it holds) of the highest shard from `least` on whose
    directory holds queues or messages; None: none does."""
    root = os.path.join(data_dir, "shards")
    try:
        names = os.listdir(root)
    except OSError:  # no shard but 0 ever kept data here
        return None
    for index, name in sorted(((int(name), name) for name in names if name.isdigit()), reverse=True):
        if index < least:
            break
        held = _held_by(os.path.join(root, name), index)
        if held is not None:
            return index, held
    return None


def _held_by(directory: str, index: int) -> str | None:
    """What a node without shard `index` would lose of its `directory`: the
    durable queues its definitions store places on it, or message files
    (a message store's or a queue index's; delayed messages too). None: nothing.
    A store it cannot read counts as holding something: when in doubt, refuse."""
    store = os.path.join(directory, "definitions.db")
    if os.path.exists(store):
        try:
            with contextlib.closing(sqlite3.connect("file:%s?mode=ro" % store, uri=True)) as db:
                queues = db.execute("SELECT vhost, name FROM queues WHERE shard = ? ORDER BY vhost, name",
                                    (index,)).fetchall()
        except sqlite3.Error as exc:
            return "%s, which cannot be read: %s" % (store, exc)
        if queues:
            return ", ".join("'%s' in vhost '%s'" % (name, vhost) for vhost, name in queues[:5]) + \
                (" and %d more" % (len(queues) - 5) if len(queues) > 5 else "")
    for folder, _dirs, files in os.walk(os.path.join(directory, "vhosts")):
        if os.path.basename(folder) == "msg_store_transient":
            continue  # emptied at every start
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith((".rdq", ".idx")) and os.path.getsize(path) > 0:
                return "messages in %s" % path
    return None


def _client_ports(config: BrokerConfig) -> list[tuple[str, str, int]]:
    """(setting, listener, port) of every client listener the shards share
    (the listener named as amqp_server.process.listeners names it)."""
    ports = [("port", "AMQP", config.port)]
    if config.tls.enabled:
        ports.append(("tls.port", "AMQPS", config.tls.port))
    if config.mqtt.enabled:
        ports.append(("mqtt.port", "MQTT", config.mqtt.port))
        if config.tls.enabled:
            ports.append(("mqtt.tls_port", "MQTTS", config.mqtt.tls_port))
    if config.stream.enabled:
        ports.append(("stream.port", "STREAM", config.stream.port))
        if config.tls.enabled:
            ports.append(("stream.tls_port", "STREAMS", config.stream.tls_port))
    return ports


def hold_ports(config: BrokerConfig) -> tuple[BrokerConfig, list[socket.socket]]:
    """The config with every client port resolved, and the sockets holding them."""
    held = []
    values = {}
    try:
        for setting, listener, port in _client_ports(config):
            family = socket.AF_INET6 if ":" in config.bind else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind((config.bind, port))
            except OSError as exc:
                # As one process says it (a node's error does not depend on its shard count).
                raise ListenError("cannot listen for %s on %s:%d: %s" % (
                    listener, config.bind, port, exc.strerror or exc)) from None
            values[setting] = sock.getsockname()[1]
    except BaseException:
        for sock in held:
            sock.close()
        raise
    resolved = dataclasses.replace(config, port=values["port"])
    for setting, port in values.items():
        if "." in setting:
            group, field = setting.split(".")
            setattr(resolved, group, dataclasses.replace(getattr(resolved, group), **{field: port}))
    return resolved, held


def _die_with_parent() -> None:
    """A shard ends with its supervisor, even a SIGKILLed one (Linux's
    PR_SET_PDEATHSIG): shards left behind would keep the node's ports and
    data directories."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the supervisor died before the call
        os._exit(1)


class Supervisor:
    def __init__(self, config: BrokerConfig, serve_shard, data_directory) -> None:
        """`serve_shard(config, shard)` runs one shard to its end in a child;
        `data_directory`: the node's, as its start claimed it (locked:
        storage.data_directory.DataDirectory.claim)."""
        self.config = config
        self.serve_shard = serve_shard
        self.claimed = data_directory
        self.data_directory = data_directory  # for shard 0's first start
        self.forks: dict[int, int] = {}  # shard -> times it was forked
        self.children: dict[int, tuple[int, float]] = {}  # pid -> (shard index, start time)
        self.stopping = False
        self.restarting: set[int] = set()  # shards stopped because shard 0 ended
        self.held: list[socket.socket] = []
        self.links = ""

    def run(self) -> int:
        config = self.config
        # Claimed before any shard (and before the ports, as one process claims it before
        # it listens: the same first refusal): a shard K > 0 that came first would make the
        # node's directory as the parent of DATA_DIR/shards/K, and shard 0 would then take
        # a new node's first start for a crash to recover from.
        try:
            self.config, self.held = hold_ports(config)
            self.links = tempfile.mkdtemp(prefix="hutch-shards-")  # mode 0700
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._stop)
            for index in range(config.shards):
                self._fork(index)
            return self._watch()
        except ListenError:
            # A port taken, or a shard that could not start at the node's start (every shard
            # has ended): what this start created goes, as after one process's failed start,
            # unless a shard had accepted a client (what it did may be stored).
            if not (self.links and os.path.exists(os.path.join(self.links, ACCEPTED))):
                self.claimed.remove_created()
            raise
        finally:
            for sock in self.held:
                sock.close()
            if self.links:
                shutil.rmtree(self.links, ignore_errors=True)

    def _stop(self, signum, _frame) -> None:
        self.stopping = True
        for pid in self.children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _fork(self, index: int) -> None:
        config = dataclasses.replace(self.config, data_dir=shard_data_dir(self.config.data_dir, index))
        shard = Shard(index, self.config.shards, self.links, self.data_directory if index == 0 else None)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                _die_with_parent()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                for sock in self.held:
                    sock.close()
                status = self.serve_shard(config, shard)
            except ListenError as exc:
                log.error("shard %d cannot start: %s", index, exc)
                with open(self._reason_file(index), "w") as reason:
                    reason.write(str(exc))
                status = CANNOT_START
            except BaseException:
                log.exception("shard %d failed", index)
            finally:
                logging.shutdown()
                os._exit(status or 0)
        log.info("shard %d of %d: pid %d, data in %s", index, self.config.shards, pid, config.data_dir)
        if index == 0:  # a restarted shard 0 finds the directory its earlier run used
            self.data_directory = None
        self.children[pid] = (index, time.monotonic())
        self.forks[index] = self.forks.get(index, 0) + 1

    def _reason_file(self, index: int) -> str:
        return os.path.join(self.links, "%d.cannot-start" % index)

    def _cannot_start(self) -> ListenError:
        """A shard could not start: stop the others; the reason of the lowest shard that gave one."""
        self._stop(signal.SIGTERM, None)
        while self.children:
            try:
                pid, _code = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            self.children.pop(pid, None)
        for index in range(self.config.shards):
            try:
                with open(self._reason_file(index)) as reason:
                    return ListenError(reason.read())
            except OSError:
                continue
        return ListenError("a shard could not start")

    def _watch(self) -> int:
        failures: dict[int, int] = {}
        status = 0
        while self.children:
            try:
                pid, code = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid not in self.children:
                continue
            index, started = self.children.pop(pid)
            if os.waitstatus_to_exitcode(code) == CANNOT_START and self.forks[index] == 1:
                # At the node's start: the node stops with the reason. A shard started again
                # after a crash that cannot start is tried again below, as a crash is.
                raise self._cannot_start()
            if self.stopping:
                status = status or os.waitstatus_to_exitcode(code)
                continue
            if index in self.restarting:
                self.restarting.discard(index)
                if self.restarting:
                    continue
                index = 0  # every shard stopped: shard 0 first, the others follow below
            else:
                how = os.waitstatus_to_exitcode(code)
                log.error("shard %d (pid %d) ended (%s); starting it again", index, pid,
                          "signal %d" % -how if how < 0 else "status %d" % how)
                if index == 0 and self.children and not self.config.cluster.enabled:
                    # Shard 0 orders the definitions and alone knew the others' transient
                    # ones: the node restarts whole, as after a node's crash. (In a cluster the
                    # other shards' leaders sync with group 0's next leader, wherever it runs.)
                    log.error("shard 0 orders the node's definitions: stopping the other shards to start "
                              "them again with it")
                    self.restarting = {other for other, _started in self.children.values()}
                    for other_pid in self.children:
                        os.kill(other_pid, signal.SIGTERM)
                    continue
            quick = time.monotonic() - started < 2.0
            failures[index] = failures.get(index, 0) + 1 if quick else 0
            delay = min(RESTART_BACKOFF[0] * 2 ** failures[index], RESTART_BACKOFF[1]) if quick else 0
            deadline = time.monotonic() + delay
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.05)
            if not self.stopping:
                self._fork(index)
                running = {other for other, _started in self.children.values()}
                if index == 0:
                    for other in range(1, self.config.shards):
                        if other not in running:
                            self._fork(other)
        return status
