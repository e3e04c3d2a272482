"""The AMQP listener's protocol: the shared client IO
(amqp_server.shared.client) around an AMQP `Connection`."""
from __future__ import annotations

import asyncio

from amqp_server.amqp.connection import Connection
from amqp_server.shared.client import ClientProtocol


class AMQPProtocol(ClientProtocol):
    # (state, pending bytes) of a connection another shard moved here (amqp_server.amqp.hand_over)
    moved_in: tuple | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.connection = Connection(self.broker, self.config, self, transport.get_extra_info("peername"),
                                     self.alarms)
        self.connections.add(self.connection)
        if self.moved_in is not None:  # before the first read: the bytes read elsewhere come first
            self.connection.adopt(*self.moved_in)
            self.moved_in = None
