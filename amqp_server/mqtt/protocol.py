"""The MQTT listener's transport side: asyncio.Protocol <-> MQTTConnection,
with the same once-per-loop-turn batched writes as the AMQP protocol."""
from __future__ import annotations

import asyncio

from amqp_server.mqtt.session import MQTTConnection, Sessions


class MQTTProtocol(asyncio.Protocol):
    def __init__(self, broker, config, sessions: Sessions, connections: set) -> None:
        self.broker = broker
        self.connections = connections
        self.config = config
        self.sessions = sessions
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.connection: MQTTConnection | None = None
        self._flush_scheduled = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.connection = MQTTConnection(self.broker, self.config, self, transport.get_extra_info("peername"),
                                         self.sessions, self.connections)

    def data_received(self, data: bytes) -> None:
        self.connection.received(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.lost()

    def pause_writing(self) -> None:
        self.connection.output_paused = True

    def resume_writing(self) -> None:
        self.connection.output_paused = False
        self.connection.output_resumed()

    def wake(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = self.connection.take_output()
        if out:
            transport.writelines(out)

    def close(self) -> None:
        """Write whatever is pending, then close."""
        self._flush()
        self.transport.close()

    def call_later(self, delay: float, callback) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback)

    def call_soon(self, callback) -> None:
        self.loop.call_soon(callback)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()
