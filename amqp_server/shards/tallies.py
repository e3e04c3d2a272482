"""What a node limits as a whole, counted at every shard (docs/scaling.md).

RabbitMQ's limits count a node's connections (`connection_max`), a vhost's
and a user's connections, and a user's channels; hutch's login throttle
counts refused logins of a user from an address over every front end. On a
node of several shards each of those is spread over the shards, so every
shard tells every other shard its own counts as they change, and its
refused and then accepted logins; a check then reads its own copy and
needs no round trip (the answer to a connection.open waits for nothing).

Records, on the link to each other shard (no answer):
  ("tallies", {(kind, name): count}, node)   all of them, first on a link after the hellos,
                                       and the sender's node (None on a node outside a cluster)
  ("tally", kind, name, count)         one changed (0: none open)
  ("login", failed, host, username)           a refused (True) or accepted (False) login

In a cluster the links reach the other groups' leaders on every node: a
vhost's and a user's counts add up all of them (RabbitMQ's vhost and user
limits are the cluster's), the node's own (`connection_max`) only the
shards of this node.

Invariants: a shard's copy of another shard's counts is that shard's
latest word, replaced whole on each of their links (so a link lost while
both live loses nothing for long: the next one tells all) and dropped once
that shard is known to have ended, its connections with it (`ended`); a
shard that starts again tells its counts anew, and serves clients only
once shard 0's counts came. On a node of more than two shards, two shards
K, J > 0 starting together may each admit clients for a moment before the
other's counts came. Two
shards may admit one connection each at the same instant past a limit:
the copies trail by one message on a local socket, as RabbitMQ's own count
of a node's connections trails the connections being opened.
"""
from __future__ import annotations

import asyncio

# The kind of count that is the node's own: its connections (vhosts.broker's ("node", "")).
NODE = "node"


class Tallies:
    def __init__(self, node) -> None:
        self.node = node
        self.theirs: dict[int, dict[tuple[str, str], int]] = {}  # another shard -> its counts
        self.logins = None  # the shard's amqp_server.shared.login_throttle.LoginThrottle, once shared
        self.heard_from_0 = asyncio.Event()  # shard 0's counts came: a shard serves from then on
        self.node_name = None  # in a cluster, this node's (set by amqp_server.cluster.node)
        self.local: set[int] = set()  # the other shards that run on this node

    def share_logins(self, logins) -> None:
        """Refused logins count over the whole node: this shard's are told to the others."""
        self.logins = logins
        logins.told = self._told_login

    # -- this shard's counts --------------------------------------------------

    def tallied(self, kind: str, name: str, count: int) -> None:
        for link in self.node.peers.values():
            link.send(("tally", kind, name, count))

    def linked(self, link) -> None:
        """A link to another shard opened: it learns every count of this one."""
        link.send(("tallies", dict(self.node.broker.counted), self.node_name))

    def elsewhere(self, kind: str, name: str) -> int:
        key = (kind, name)
        if kind == NODE:
            return sum(counts.get(key, 0) for peer, counts in self.theirs.items() if peer in self.local)
        return sum(counts.get(key, 0) for counts in self.theirs.values())

    # -- the other shards' --------------------------------------------------------

    def ended(self, peer: int) -> None:
        self.theirs.pop(peer, None)
        self.local.discard(peer)

    def all_of(self, link, counts: dict, node) -> None:
        if link.peer is None:  # no shard's word: it said no hello
            return
        self.theirs[link.peer] = dict(counts)
        if node == self.node_name:  # a peer's node changes only with its incarnation (`ended`)
            self.local.add(link.peer)
        if link.peer == 0:
            self.heard_from_0.set()

    def one_of(self, link, kind: str, name: str, count: int) -> None:
        if link.peer is None:
            return
        counts = self.theirs.setdefault(link.peer, {})
        if count:
            counts[(kind, name)] = count
        else:
            counts.pop((kind, name), None)

    # -- refused logins -------------------------------------------------------------

    def _told_login(self, failed: bool, host: str, username: str) -> None:
        for link in self.node.peers.values():
            link.send(("login", failed, host, username))

    def login(self, failed: bool, host: str, username: str) -> None:
        if self.logins is not None:
            if failed:
                self.logins.count_failure(host, username)
            else:
                self.logins.forget(host, username)
