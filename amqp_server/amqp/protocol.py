"""The AMQP listener's protocol: the shared client IO
(amqp_server.shared.client) around an AMQP `Connection`."""
from __future__ import annotations

import asyncio

from amqp_server.amqp.connection import Connection
from amqp_server.shared.client import ClientProtocol


class AMQPProtocol(ClientProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.connection = Connection(self.broker, self.config, self, transport.get_extra_info("peername"),
                                     self.alarms)
        self.connections.add(self.connection)
