"""A cluster node, composed: the cluster face (amqp_server.cluster) given
how to open a leader's broker and a follower's metrics, run until
SIGINT/SIGTERM (cli.server starts it when cluster.etcd is set)."""
from __future__ import annotations

import asyncio
import functools
import logging
import signal

from aiohttp import web

from amqp_server.cluster.node import ClusterNode
from amqp_server.management import prometheus
from amqp_server.process.server import BrokerServer, run
from amqp_server.process.shards import Shard
from amqp_server.shared.figures import member_figures
from amqp_server.shared.config import BrokerConfig

log = logging.getLogger("hutch.cluster")


def follower_metrics(node: ClusterNode) -> web.Application:
    """A follower's own /metrics: its replication state and its own memory
    and disk, not the leader's broker."""
    return prometheus.follower_app(lambda: prometheus.render_follower(
        node.name, node.follower.state, node.follower.position, node.leader,
        member_figures(node.config, node.uptime_ms())))


def serve_shard(config: BrokerConfig, shard: Shard) -> int:
    """One shard of a cluster node, in its own process: its group's member
    (amqp_server.process.shards forks it)."""
    run(config, functools.partial(serve_node, shard=shard))
    return 0


async def serve_node(config: BrokerConfig, shard: Shard | None = None) -> None:
    """Run a cluster node (or one shard of it) until SIGINT/SIGTERM."""
    open_broker = BrokerServer if shard is None else functools.partial(BrokerServer, shard=shard)
    node = ClusterNode(config, open_broker, follower_metrics, shard)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    running = loop.create_task(node.run(stop))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait((running, stopping), return_when=asyncio.FIRST_COMPLETED)
    if running.done() and running.exception() is not None:
        stopping.cancel()
        await node.stop()
        raise running.exception()  # a listener that cannot open: reported by cli.server
    log.info("shutting down")
    if not running.done():
        running.cancel()
    try:
        await running
    except asyncio.CancelledError:
        pass
    await node.stop()
