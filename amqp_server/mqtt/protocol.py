"""The MQTT listener's protocol: the shared client IO (batched writes once
per loop turn, flow control: amqp_server.shared.client) around an
MQTTConnection."""
from __future__ import annotations

import asyncio

from amqp_server.mqtt.session import MQTTConnection
from amqp_server.mqtt.sessions import Sessions
from amqp_server.shared.client import ClientProtocol


class MQTTProtocol(ClientProtocol):
    def __init__(self, broker, config, sessions: Sessions, connections: set, alarms, logins, writer) -> None:
        super().__init__(broker, config, connections, alarms, logins, writer)
        self.sessions = sessions

    def connection_made(self, transport: asyncio.Transport) -> None:
        # Listed in `connections` (the management API) once CONNECT is accepted.
        self.transport = transport
        self.connection = MQTTConnection(self.broker, self.config, self, transport.get_extra_info("peername"),
                                         self.sessions, self.connections)
