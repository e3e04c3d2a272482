"""The stream listener's transport side (`StreamProtocol`) and `StreamNode`,
what all stream connections of the broker share."""
from __future__ import annotations

import asyncio
from typing import Callable

from amqp_server.shared.client import ClientProtocol
from amqp_server.stream.connection import StreamConnection
from amqp_server.stream.groups import Groups
from amqp_server.stream.tracking import Tracking


class StreamNode:
    """The broker as the stream listener sees it: the vhosts, the settings,
    the disk writer, alarms, the login throttle, the connection list (the
    management API's and the shutdown's), single-active-consumer groups and
    each stream's tracking."""

    def __init__(self, broker, config, writer, alarms, logins, connections: set, listeners: list) -> None:
        self.broker = broker
        self.config = config
        self.writer = writer
        self.alarms = alarms
        self.logins = logins
        self.connections = connections
        self.listeners = listeners  # (protocol, address, port) of the node's open listeners
        self.groups = Groups()
        self._tracking: dict[int, Tracking] = {}
        # (host, port) of each replica metadata names (TLS: the replicas' TLS ports); a cluster's
        # leader sets it to its in-sync followers (amqp_server.cluster.node), one node has none.
        self.replicas: Callable[[bool], list[tuple[str, int]]] = lambda tls: []

    def tracking(self, queue) -> Tracking:
        """The stream's tracking (loaded on first use)."""
        found = self._tracking.get(id(queue))
        if found is None or found.queue is not queue:
            for key in [k for k, t in self._tracking.items() if t.queue.deleted]:
                self._tracking.pop(key).close()
            found = self._tracking[id(queue)] = Tracking(queue, self.writer, asyncio.get_running_loop())
        return found

    def advertised(self, connection) -> tuple[str, int]:
        """The host and port metadata names for this node: the settings'
        advertised ones, else the cluster's advertised host (a connection a
        follower forwarded arrives on the replication port) or the address
        the client reached, and this node's stream (or stream TLS) port."""
        settings = self.config.stream
        transport = connection.io.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        host = settings.advertised_host or self.config.cluster.advertise or (local[0] if local else "localhost")
        if settings.advertised_port:
            return host, settings.advertised_port
        protocol = "stream/ssl" if self.tls(connection) else "stream"
        port = next((bound for name, _host, bound in self.listeners if name == protocol), settings.port)
        return host, port

    @staticmethod
    def tls(connection) -> bool:
        transport = connection.io.transport
        return transport is not None and transport.get_extra_info("ssl_object") is not None

    def snapshot_all(self) -> None:
        """Write every changed tracking state now (the broker is stopping)."""
        for tracking in self._tracking.values():
            tracking.close()
            tracking.snapshot()


class StreamProtocol(ClientProtocol):
    """The stream listener's protocol: the shared client transport
    (amqp_server.shared.client: one read buffer, batched writes, flow
    control) around a `StreamConnection`."""

    def __init__(self, node: StreamNode) -> None:
        super().__init__(node.broker, node.config, node.connections, node.alarms, node.logins, node.writer)
        self.node = node

    def connection_made(self, transport: asyncio.Transport) -> None:
        # Listed in `connections` (the management API) once Open succeeds.
        self.transport = transport
        self.connection = StreamConnection(self.node, self, transport.get_extra_info("peername"))
