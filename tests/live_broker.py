"""A real hutch server (`amqp_server.server.BrokerServer`) on an event loop in
a background thread, listening on 127.0.0.1:0, for tests that administer the
broker while clients are connected (users, permissions, vhosts, limits,
policies): `admin(fn)` runs `fn(broker)` on the broker's loop, as the
management API does, and returns its result or raises its exception.
Clients talk to it over TCP like to any broker process; `stop()` shuts it
down cleanly so a broker process can be started on the same data directory.
"""
from __future__ import annotations

import asyncio
import threading

from amqp_server.config import BrokerConfig, ManagementConfig, MQTTConfig, PrometheusConfig
from amqp_server.server import BrokerServer


class LiveBroker:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def start() -> BrokerServer:
            # The HTTP listeners stay off: administration goes through `admin`.
            config = BrokerConfig(bind="127.0.0.1", port=0, data_dir=data_dir,
                                  management=ManagementConfig(enabled=False),
                                  prometheus=PrometheusConfig(enabled=False), mqtt=MQTTConfig(enabled=False))
            server = BrokerServer(config)
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(20)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def broker(self):
        return self.server.broker

    def admin(self, fn):
        async def call():
            return fn(self.server.broker)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(20)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(20)
        self.loop.close()
