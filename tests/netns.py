"""A private network of Linux network namespaces for the partition harness
(tests/partition_kit.py, bench/partitions.py): one namespace per host, each
with one veth interface plugged into a bridge that lives in a namespace of
its own, and partitions made with nftables rules inside the hosts'
namespaces (this kernel has no netem).

Nothing here touches the machine's own network: the bridge is not in the
root namespace, no address is given to any interface outside the
namespaces, and no route leads out of them. The addresses (SUBNET) are
only ever used inside one `Network`, so two networks (two test runs) may
use the same ones. Everything is deleted by `close()`, and a network left
behind by a run that died (its process is gone) is deleted by the next one.

Threads of the harness's own process reach the hosts by entering a
namespace (`setns`, per thread): `run_in` and `Thread`. That is how the
test's clients talk to the brokers without a route from the root namespace.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
SUBNET = "10.231.0"  # a /24 used only inside a Network's namespaces
PREFIX = "hutchpart"  # namespace names: hutchpart<pid>-<host>
TABLE = "hutch_partition"
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsUnavailable(RuntimeError):
    """What the harness needs is missing (tools, privileges): the message says what."""


def missing_tools() -> list[str]:
    """The programs the harness needs that are not installed."""
    return [tool for tool in ("ip", "nft", "unshare", "etcd") if shutil.which(tool) is None]


def _run(*args: str, input: str | None = None) -> str:
    done = subprocess.run(args, input=input, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable("%s: %s" % (" ".join(args), (done.stderr or done.stdout).strip()))
    return done.stdout


def enter(namespace: str) -> None:
    """Move the calling thread (only it) into `namespace`'s network."""
    fd = os.open("/run/netns/" + namespace, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, "setns(%s): %s" % (namespace, os.strerror(errno)))
    finally:
        os.close(fd)


class Thread(threading.Thread):
    """A daemon thread that runs `target` inside `namespace`'s network."""

    def __init__(self, namespace: str, target, name: str | None = None) -> None:
        super().__init__(target=self._inside, name=name, daemon=True)
        self.namespace, self.work = namespace, target

    def _inside(self) -> None:
        enter(self.namespace)
        self.work()


def run_in(namespace: str, call, timeout: float = 30.0):
    """`call()` on a fresh thread inside `namespace`; its result or its exception."""
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            outcome["error"] = exc

    thread = Thread(namespace, work)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError("no answer within %.0f s inside %s" % (timeout, namespace))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@dataclass
class Host:
    name: str  # n1, e1, client: also its interface's name on the bridge
    namespace: str
    address: str

    def command(self, argv: list[str], hostname: str | None = None) -> list[str]:
        """`argv` run inside this host's network (and, with `hostname`, its
        own UTS namespace under that host name)."""
        prefix = ["ip", "netns", "exec", self.namespace]
        if hostname is None:
            return prefix + argv
        return prefix + ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname] + argv


@dataclass
class Network:
    tag: str = field(default_factory=lambda: "%s%d" % (PREFIX, os.getpid()))
    hosts: dict = field(default_factory=dict)
    # host name -> the addresses it drops traffic to and from
    blocked: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = missing_tools()
        if missing:
            raise NetnsUnavailable("missing %s (Debian: iproute2, nftables, util-linux, etcd-server)"
                                   % ", ".join(missing))
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        delete_abandoned()
        self.bridge = self.tag + "-bridge"
        try:
            _run("ip", "netns", "add", self.bridge)
            self._in(self.bridge, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.bridge, "ip", "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def _in(self, namespace: str, *argv: str, input: str | None = None) -> str:
        return _run("ip", "netns", "exec", namespace, *argv, input=input)

    def add(self, name: str, number: int) -> Host:
        """A host `name` at SUBNET.`number`, plugged into the bridge. Its TCP
        gives up on an unanswered connection after about 13 s instead of
        Linux's 15 minutes (tcp_retries2 5), so that a partition can outlast
        it within a test."""
        host = Host(name, "%s-%s" % (self.tag, name), "%s.%d" % (SUBNET, number))
        self.hosts[name] = host
        _run("ip", "netns", "add", host.namespace)
        self._in(host.namespace, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", name,
                 "netns", self.bridge)
        self._in(host.namespace, "ip", "addr", "add", host.address + "/24", "dev", "eth0")
        self._in(host.namespace, "ip", "link", "set", "eth0", "up")
        self._in(host.namespace, "ip", "link", "set", "lo", "up")
        self._in(self.bridge, "ip", "link", "set", name, "master", "br0")
        self._in(self.bridge, "ip", "link", "set", name, "up")
        self._in(host.namespace, "sh", "-c", "echo 5 > /proc/sys/net/ipv4/tcp_retries2")
        self.blocked[name] = set()
        return host

    # -- partitions ------------------------------------------------------------

    def cut(self, side: list[str], other: list[str]) -> None:
        """Drop every packet between the hosts of `side` and those of `other`
        (both ways, silently: TCP sees a dead peer, not a refusal)."""
        for a in side:
            for b in other:
                self.blocked[a].add(self.hosts[b].address)
                self.blocked[b].add(self.hosts[a].address)
        for name in set(side) | set(other):
            self._apply(name)

    def isolate(self, name: str) -> None:
        """Cut `name` from every other host."""
        self.cut([name], [other for other in self.hosts if other != name])

    def heal(self) -> None:
        for name in self.hosts:
            if self.blocked[name]:
                self.blocked[name] = set()
                self._apply(name)

    def _apply(self, name: str) -> None:
        addresses = sorted(self.blocked[name])
        rules = ""
        if addresses:
            listed = ", ".join(addresses)
            rules = ("ip saddr { %s } drop" % listed, "ip daddr { %s } drop" % listed)
        script = ["table inet %s" % TABLE, "delete table inet %s" % TABLE, "table inet %s {" % TABLE,
                  "  chain input { type filter hook input priority 0; policy accept; %s; }"
                  % (rules[0] if rules else ""),
                  "  chain output { type filter hook output priority 0; policy accept; %s; }"
                  % (rules[1] if rules else ""),
                  "}"]
        self._in(self.hosts[name].namespace, "nft", "-f", "-", input="\n".join(script) + "\n")

    # -- the end -----------------------------------------------------------------

    def close(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them (their
        interfaces go with them)."""
        for namespace in [h.namespace for h in self.hosts.values()] + [self.bridge]:
            _delete(namespace)
        self.hosts.clear()


def _delete(namespace: str) -> None:
    if not os.path.exists("/run/netns/" + namespace):
        return
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def delete_abandoned() -> None:
    """Delete the namespaces of harness runs whose process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        match = re.match(r"(%s(\d+)-\S+)" % PREFIX, line)
        if match and not os.path.exists("/proc/%s" % match.group(2)):
            _delete(match.group(1))
