"""What a node limits as a whole, counted at every shard (docs/scaling.md).

RabbitMQ's limits count a node's connections (`connection_max`), a vhost's
and a user's connections, and a user's channels; hutch's login throttle
counts refused logins of a user from an address over every front end; the
memory alarm weighs the node's resident memory (amqp_server.shared.alarms:
each shard tells its own, kind "memory", at every check). On a
node of several shards each of those is spread over the shards, so every
shard tells every other shard its own counts as they change, and its
refused and then accepted logins; a check then reads its own copy and
needs no round trip (the answer to a connection.open waits for nothing).

Records, on the link a shard opened to each other shard (no answer):
  ("tallies", {(kind, name): count})   all of them, first on a link
  ("tally", kind, name, count)         one changed (0: none open)
  ("login", failed, host, username)           a refused (True) or accepted (False) login

Invariants: a shard's copy of another shard's counts is that shard's
latest word on its link, and is dropped with the link (the shard ended, and
its connections with it); a shard that starts again tells its counts anew
on every link it opens, and serves clients only once shard 0's counts came
(shard 0 links back at once when a shard links to it). On a node of more
than two shards, two shards K, J > 0 starting together may each admit
clients for a moment before the other's counts came. Two
shards may admit one connection each at the same instant past a limit:
the copies trail by one message on a local socket, as RabbitMQ's own count
of a node's connections trails the connections being opened.
"""
from __future__ import annotations

import asyncio

# The kind of tally by which a shard tells its resident memory (name "").
MEMORY = "memory"


class Tallies:
    def __init__(self, node) -> None:
        self.node = node
        self.theirs: dict[object, dict[tuple[str, str], int]] = {}  # another shard's link here -> its counts
        self.logins = None  # the shard's amqp_server.shared.login_throttle.LoginThrottle, once shared
        self.heard_from_0 = asyncio.Event()  # shard 0's counts came: a shard serves from then on
        self.memory = 0  # this shard's resident bytes, as it last told them

    def share_logins(self, logins) -> None:
        """Refused logins count over the whole node: this shard's are told to the others."""
        self.logins = logins
        logins.told = self._told_login

    # -- this shard's counts --------------------------------------------------

    def tallied(self, kind: str, name: str, count: int) -> None:
        if kind == MEMORY:  # not one of the broker's counts: kept here for the links to come
            self.memory = count
        for link in self.node.outgoing.values():
            link.send(("tally", kind, name, count))

    def linked(self, link) -> None:
        """A link to another shard opened: it learns every count of this one."""
        counts = dict(self.node.broker.counted)
        if self.memory:
            counts[(MEMORY, "")] = self.memory
        link.send(("tallies", counts))

    def elsewhere(self, kind: str, name: str) -> int:
        key = (kind, name)
        return sum(counts.get(key, 0) for counts in self.theirs.values())

    # -- the other shards' --------------------------------------------------------

    def lost(self, link) -> None:
        self.theirs.pop(link, None)

    def all_of(self, link, counts: dict) -> None:
        self.theirs[link] = dict(counts)
        if link.peer == 0:
            self.heard_from_0.set()

    def one_of(self, link, kind: str, name: str, count: int) -> None:
        counts = self.theirs.setdefault(link, {})
        if count:
            counts[(kind, name)] = count
        else:
            counts.pop((kind, name), None)

    # -- refused logins -------------------------------------------------------------

    def _told_login(self, failed: bool, host: str, username: str) -> None:
        for link in self.node.outgoing.values():
            link.send(("login", failed, host, username))

    def login(self, failed: bool, host: str, username: str) -> None:
        if self.logins is not None:
            if failed:
                self.logins.count_failure(host, username)
            else:
                self.logins.forget(host, username)
