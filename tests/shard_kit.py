"""Reaching a chosen shard of a node from the outside: a connection the
kernel landed on it (`on_shard`, by the `shard` server property), a durable
queue placed on it (`queue_on`, by shard 0's definitions store), and the
pid of a shard process (`pid_of_shard`, from the supervisor's log) and
the link socket it listens on (`link_socket`)."""
from __future__ import annotations

import os
import sqlite3

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
