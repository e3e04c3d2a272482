"""Open and close the HTTP and metrics listeners."""
from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from amqp_server.management import http, prometheus
from amqp_server.management.node import Node
from amqp_server.management.rates import RateSampler
from amqp_server.management.routes import ROUTES

log = logging.getLogger("hutch.server")


class ClientErrorLog(logging.LoggerAdapter):
    """aiohttp's server log (its request handler's `logger`): a request it
    cannot parse is the client's error, already answered 400; it is logged on
    one short line at info, not as an ERROR with a traceback that a client
    could repeat into the log at will (cowboy logs nothing for it). Anything
    else aiohttp reports stays an error with its traceback."""

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.info(msg + ": %s", *args, " ".join(str(exc_info).split())[:200])
        else:
            self.error(msg, *args, exc_info=exc_info, **kwargs)


CLIENT_ERRORS = ClientErrorLog(logging.getLogger("hutch.management"), {})


class ListenerError(Exception):
    """An HTTP listener could not be opened (the message says which and why)."""


class ManagementListeners:
    def __init__(self, broker, connections: set, config, writer, monitor, listeners: list, alarms,
                 mqtt_sessions, logins) -> None:
        """`listeners` is the broker's list of (protocol, address, port); the
        HTTP listeners opened here are added to it. `mqtt_sessions`: the MQTT
        front end's `Sessions`; `logins`: the broker's `LoginThrottle`."""
        self.config = config
        self.node = Node(broker, connections, config, writer, monitor,
                         RateSampler(broker, connections, config.management.sample_interval), alarms,
                         mqtt_sessions, logins, listeners)
        self._runners: list[web.AppRunner] = []
        # protocol -> (protocol factory, TLS context, address), as BrokerServer.acceptors
        self.acceptors: dict[str, tuple] = {}

    async def start(self) -> None:
        management, metrics = self.config.management, self.config.prometheus
        if management.enabled:
            self.node.sampler.start()
            app = http.make_app(self.node, ROUTES, management.max_body_size, management.request_timeout)
            # aiohttp's keep-alive timer runs from the opening and from each answer, and
            # incoming bytes do not reset it: a request head must be complete within it
            await self._open("HTTP", "http", app, management.bind, management.port,
                             keepalive_timeout=management.request_timeout)
        if metrics.enabled:
            await self._open("PROMETHEUS", "http/prometheus", prometheus.make_app(self.node), metrics.bind,
                             metrics.port, keepalive_timeout=management.request_timeout)

    async def _open(self, name: str, protocol: str, app: web.Application, bind: str, port: int, **server) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=CLIENT_ERRORS, **server)
        await runner.setup()
        site = web.TCPSite(runner, bind, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ListenerError("cannot listen for %s on %s:%d: %s" % (name, bind, port, exc.strerror or exc)) from None
        self._runners.append(runner)
        for address in runner.addresses:
            host, bound = address[:2]
            self.node.listeners.append((protocol, host, bound))
            self.acceptors[protocol] = (runner.server, None, (host, bound))
            log.info("listening for %s on %s:%d", name, host, bound)

    async def stop(self) -> None:
        self.node.stopping.set()  # refused logins still waiting are answered now
        await self.node.sampler.stop()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
