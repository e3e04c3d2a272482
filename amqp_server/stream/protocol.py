"""The stream listener's transport side: an asyncio.Protocol around a
`StreamConnection` (batched writes once per loop turn, pause/resume on the
socket's flow control), and `StreamNode`, what all stream connections of
the broker share."""
from __future__ import annotations

import asyncio

from amqp_server.stream.connection import StreamConnection
from amqp_server.stream.groups import Groups
from amqp_server.stream.tracking import Tracking


class StreamNode:
    """The broker as the stream listener sees it: the vhosts, the settings,
    the disk writer, alarms, the login throttle, the connection list (the
    management API's and the shutdown's), single-active-consumer groups and
    each stream's tracking."""

    def __init__(self, broker, config, writer, alarms, logins, connections: set) -> None:
        self.broker = broker
        self.config = config
        self.writer = writer
        self.alarms = alarms
        self.logins = logins
        self.connections = connections
        self.groups = Groups()
        self._tracking: dict[int, Tracking] = {}

    @property
    def cluster_name(self) -> str:
        return str(self.broker.global_parameters.get("cluster_name", "hutch"))

    def tracking(self, queue) -> Tracking:
        """The stream's tracking (loaded on first use)."""
        found = self._tracking.get(id(queue))
        if found is None or found.queue is not queue:
            for key in [k for k, t in self._tracking.items() if t.queue.deleted]:
                self._tracking.pop(key).close()
            found = self._tracking[id(queue)] = Tracking(queue, self.writer, asyncio.get_running_loop())
        return found

    def advertised(self, connection) -> tuple[str, int]:
        """The host and port metadata names for this node."""
        settings = self.config.stream
        transport = connection.io.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        host = settings.advertised_host or (local[0] if local else "localhost")
        port = settings.advertised_port or (local[1] if local else settings.port)
        return host, port

    def snapshot_all(self) -> None:
        """Write every changed tracking state now (the broker is stopping)."""
        for tracking in self._tracking.values():
            tracking.close()
            tracking.snapshot()


class StreamProtocol(asyncio.Protocol):
    def __init__(self, node: StreamNode) -> None:
        self.node = node
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.connection: StreamConnection | None = None
        self._flush_scheduled = False
        self._closing = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.connection = StreamConnection(self.node, self, transport.get_extra_info("peername"))

    def data_received(self, data: bytes) -> None:
        self.connection.received(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.lost()

    def pause_writing(self) -> None:
        self.connection.socket_paused = True

    def resume_writing(self) -> None:
        self.connection.socket_paused = False
        self.connection.output_resumed()

    # -- what the connection asks of its IO --------------------------------------

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
        if self._closing:
            transport.close()

    def close(self) -> None:
        """Write what is pending, then close."""
        self._closing = True
        self.wake()

    def call_later(self, delay: float, callback) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, callback)

    def call_soon(self, callback) -> None:
        self.loop.call_soon(callback)

    def pause_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()
