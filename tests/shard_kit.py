"""Reaching a chosen shard of a node from the outside: a connection the
kernel landed on it (`on_shard`, by the `shard` server property), a durable
queue placed on it (`queue_on`, by shard 0's definitions store), and the
pid of a shard process (`pid_of_shard`, from the supervisor's log), the
link socket it listens on (`link_socket`), and a link between two live
shards broken by a frame that does not decode (`break_link`)."""
from __future__ import annotations

import ctypes
import os
import socket
import sqlite3
import struct

import pika

from helpers import unique


def on_shard(port: int, shard: int, **params) -> pika.BlockingConnection:
    """A connection served by `shard` (connections land where the kernel puts them),
    with pika's ConnectionParameters `params`."""
    others = []
    try:
        for _ in range(200):
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, **params))
            if connection._impl.server_properties["shard"] == shard:
                return connection
            others.append(connection)
    finally:
        for other in others:
            other.close()
    raise AssertionError("no connection landed on shard %d" % shard)


def placement(node, name: str) -> int:
    """The shard shard 0's definitions store places queue `name` on."""
    db = sqlite3.connect(os.path.join(node.data_dir, "definitions.db"))
    try:
        row = db.execute("SELECT shard FROM queues WHERE name = ?", (name,)).fetchone()
    finally:
        db.close()
    assert row is not None, "queue %s is not in shard 0's definitions" % name
    return row[0]


def queue_on(node, channel, shard: int, arguments: dict | None = None, shards: int = 2) -> str:
    """A durable queue that lives on `shard`: a queue is placed on the shard
    with the fewest queues, so declare until one lands there, then delete the others."""
    extra = []
    try:
        for _ in range(4 * shards):
            name = unique("sq")
            channel.queue_declare(name, durable=True, arguments=arguments)
            if placement(node, name) == shard:
                return name
            extra.append(name)
    finally:
        for name in extra:
            channel.queue_delete(name)
    raise AssertionError("no queue placed on shard %d" % shard)


def pid_of_shard(node, shard: int, of: int = 2) -> int | None:
    """The pid of shard `shard`'s latest process (of a node of `of` shards), None if it is not running."""
    found = None
    for line in node.log.splitlines():
        if "shard %d of %d: pid " % (shard, of) in line:
            found = int(line.split("pid ")[1].split(",")[0])
    try:
        os.kill(found, 0)
    except (OSError, TypeError):
        return None
    return found


def link_socket(pid: int) -> str:
    """The path of the link socket shard process `pid` listens on (its
    node's private link directory, amqp_server.process.shards)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/unix") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) == 8 and fields[6] in inodes and fields[7].endswith(".sock"):
                return fields[7]
    raise AssertionError("shard pid %d listens on no link socket" % pid)


_PIDFD_GETFD = 438  # the syscall's number on x86-64 and arm64 (Linux 5.6)
_PEERCRED = struct.Struct("3i")


def break_link(pid: int, peer: int) -> None:
    """Write a frame that does not decode into the link between shard
    processes `pid` and `peer` from `pid`'s end (the link `pid` dialed to
    `peer` if it dialed one, else the one it accepted from it): `peer`
    reads it and closes that link, and both processes live on. The end is
    a duplicate of `pid`'s descriptor (pidfd_getfd: a test may take one from
    a process it started), told apart by its socket's peer process."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    ends = []
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                if not os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("socket:"):
                    continue
            except FileNotFoundError:
                continue
            got = libc.syscall(_PIDFD_GETFD, pidfd, int(fd), 0)
            if got < 0:
                raise OSError(ctypes.get_errno(), "pidfd_getfd of fd %s of pid %d" % (fd, pid))
            end = socket.socket(fileno=got)
            if end.family == socket.AF_UNIX and end.type == socket.SOCK_STREAM and \
                    _PEERCRED.unpack(end.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0] == peer:
                ends.append((end.getsockname() != "", end))  # a dialed end has no name
            else:
                end.close()
        assert ends, "no link between shard processes %d and %d" % (pid, peer)
        ends.sort(key=lambda found: found[0])
        ends[0][1].sendall(struct.pack(">I", 5) + b"\x00" * 5)  # neither pickle nor a list of records
    finally:
        os.close(pidfd)
        for _accepted, end in ends:
            end.close()
