"""The client listeners of a node: AMQP, AMQPS, MQTT, MQTTS, STREAM and STREAMS sockets
(the management and Prometheus listeners are the management face's own),
each logged as "listening for NAME on HOST:PORT", the line the tests and
operators read the ports from."""
from __future__ import annotations

import asyncio
import logging
import ssl

from amqp_server.shared.config import BrokerConfig
from amqp_server.shared.errors import ListenError

log = logging.getLogger("hutch.server")

# How each listener is named in the log, and as RabbitMQ lists its protocol
PROTOCOLS = {"AMQP": "amqp", "AMQPS": "amqp/ssl", "MQTT": "mqtt", "MQTTS": "mqtt/ssl",
             "STREAM": "stream", "STREAMS": "stream/ssl"}


def tls_context(config: BrokerConfig) -> ssl.SSLContext:
    tls = config.tls
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.cacertfile:
        context.load_verify_locations(tls.cacertfile)
    if tls.verify_peer:
        context.verify_mode = ssl.CERT_REQUIRED if tls.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return context


async def open_listeners(config: BrokerConfig, amqp_factory, mqtt_factory,
                         stream_factory=None) -> tuple[list, list, dict]:
    """Open every configured listener: (the asyncio servers, (protocol,
    address, port) of each socket as RabbitMQ lists listeners, protocol ->
    (protocol factory, TLS context, address) for the connections a cluster
    follower forwards, amqp_server.cluster.gateway). A face without a
    factory has no listener (shards other than 0). Raises ListenError
    naming the listener that cannot open."""
    loop = asyncio.get_running_loop()
    listeners = [("AMQP", config.port, None, amqp_factory)]
    context = None
    if config.tls.enabled:
        try:
            context = tls_context(config)
        except (OSError, ssl.SSLError) as exc:
            raise ListenError("cannot load the TLS certificate or key: %s" % exc) from None
        listeners.append(("AMQPS", config.tls.port, context, amqp_factory))
    if config.mqtt.enabled and mqtt_factory is not None:
        listeners.append(("MQTT", config.mqtt.port, None, mqtt_factory))
        if context is not None:
            listeners.append(("MQTTS", config.mqtt.tls_port, context, mqtt_factory))
    if config.stream.enabled and stream_factory is not None:
        listeners.append(("STREAM", config.stream.port, None, stream_factory))
        if context is not None:
            listeners.append(("STREAMS", config.stream.tls_port, context, stream_factory))
    servers, opened, acceptors = [], [], {}
    try:
        for name, port, context, factory in listeners:
            try:
                # Several shards listen on one port (amqp_server.process.shards).
                server = await loop.create_server(factory, config.bind, port, ssl=context, reuse_address=True,
                                                  reuse_port=config.shards > 1)
            except OSError as exc:
                raise ListenError("cannot listen for %s on %s:%d: %s" % (name, config.bind, port,
                                                                        exc.strerror or exc)) from None
            servers.append(server)
            for sock in server.sockets:
                host, bound = sock.getsockname()[:2]
                opened.append((PROTOCOLS[name], host, bound))
                acceptors[PROTOCOLS[name]] = (factory, context, (host, bound))
                log.info("listening for %s on %s:%d", name, host, bound)
    except ListenError:
        for server in servers:
            server.close()
        raise
    return servers, opened, acceptors
