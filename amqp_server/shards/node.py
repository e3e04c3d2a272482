"""This shard's side of its node (docs/scaling.md): a ShardNode is the
composition of its parts, each a module of this package named for its
concern: the links to the other shards and the requests on them (`mesh`),
the queues it owns for the others (`owner`), its RemoteQueues' way to
theirs (`port`: it is the `vhosts.remote_queue.ShardPort`), connections
moving between shards (`moves`), and the services it shares with the node
(`services`); which part handles which record is `records.table`.
"""
from __future__ import annotations

from amqp_server.shards import dead_letters, records
from amqp_server.shards.definitions import Definitions
from amqp_server.shards.mesh import Mesh, ShardGone
from amqp_server.shards.moves import Moves
from amqp_server.shards.owner import OwnerSide
from amqp_server.shards.port import PortSide
from amqp_server.shards.services import Services
from amqp_server.shards.tallies import Tallies

__all__ = ["ShardGone", "ShardNode"]


class ShardNode(Mesh, OwnerSide, PortSide, Moves, Services):
    def __init__(self, shard, heartbeat: float) -> None:
        self.shard = shard
        self.here = shard.index
        self.broker = None  # set once the broker is built (it needs this node first)
        Mesh.__init__(self, heartbeat)
        OwnerSide.__init__(self)
        PortSide.__init__(self)
        Moves.__init__(self)
        Services.__init__(self)
        self.definitions = Definitions(self)
        self.tallies = Tallies(self)
        self._handlers = records.table(self)

    async def start(self) -> None:
        if self.dial is None:
            await self._listen()
            self._listen_for_moves()
        self._spawn(self._beat(self.heartbeat))
        for peer in range(self.here):  # the lower shards; the higher ones dial this one
            self._connect_soon(peer, 0)
        if self.here == 0:
            self.definitions.synced.set()
        else:  # serve only with shard 0's definitions, and its counts (amqp_server.shards.tallies)
            await self.definitions.synced.wait()
            await self.tallies.heard_from_0.wait()
            self._spawn(self._report())
            self._spawn(dead_letters.hand_over(self))

    def abandon(self) -> None:
        """The shard's start ended before it served (amqp_server.process.server): its links
        close, and a closed transport hands over no more data."""
        self.stopping = True
        self._close_links()

    async def stop(self) -> None:
        self.stopping = True
        self._stop_moves()
        self._close_links()
