"""The AMQP client side of shovels and federation links: aiormq, with what
a link needs that aiormq does not give as is.

- `resolve(uri, local)`: RabbitMQ's "amqp://" with no host means this very
  node; here it is this broker's own AMQP listener, logged in as the
  configured default user unless the URI names one (`LocalNode`).
- `publish(channel, ...)`: a basic.publish that sends the properties as
  given. aiormq's `basic_publish` gives every message without a message_id
  a random one (it uses them to match basic.return), which would change
  what a shovel moves; a link never publishes mandatory, so it needs no
  such mapping. It keeps aiormq's own bookkeeping (the channel's lock,
  delivery tag and confirmation futures), so confirms arrive as they do for
  `basic_publish`: written against aiormq 6.8 to 7.x (pyproject pins it).
- `redacted(uri)`: a URI without its password, for status and logs.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import aiormq
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader


@dataclass(frozen=True)
class LocalNode:
    """How a link reaches the broker it runs in."""

    host: str
    port: int
    username: str
    password: str
    node: str = "hutch@localhost"  # this node's name (amqp_server.NODE), for status and x-received-from
    cluster_id: str = ""  # the global parameter internal_cluster_id: names what this node leaves upstream


def resolve(uri: str, local: LocalNode) -> str:
    """The URI to connect to: a host-less one ("amqp://", "amqp:///vhost")
    is this node."""
    parts = urlsplit(uri)
    if parts.hostname:
        return uri
    user = parts.username if parts.username is not None else local.username
    password = parts.password if parts.password is not None else local.password
    netloc = "%s:%s@%s:%d" % (quote(user, safe=""), quote(password, safe=""), local.host, local.port)
    return urlunsplit(("amqp", netloc, parts.path, parts.query, ""))


def redacted(uri: str) -> str:
    """The URI without its password (RabbitMQ shows no credentials either)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = "%s@%s%s" % (parts.username, host, ":%d" % parts.port if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


async def connect(uri: str, name: str) -> aiormq.abc.AbstractConnection:
    """A connection, named `name` in the peer's connection list."""
    return await aiormq.connect(uri, client_properties={"connection_name": name})


async def publish(channel, body: bytes, exchange: str, routing_key: str,
                  properties: spec.Basic.Properties) -> asyncio.Future | None:
    """Send one message; returns the future of its confirm (None when the
    channel is not in confirm mode)."""
    frames = [spec.Basic.Publish(exchange=exchange, routing_key=routing_key),
              ContentHeader(properties=properties, body_size=len(body))]
    frame_max = channel.connection.connection_tune.frame_max - 8  # the frame's header and end octet
    for start in range(0, len(body), frame_max):
        frames.append(ContentBody(body[start:start + frame_max]))
    async with channel.lock:
        confirmation = None
        if channel.publisher_confirms:
            channel.delivery_tag += 1
            confirmation = channel.create_future()
            channel.confirmations[channel.delivery_tag] = confirmation
        await channel.write_queue.put(ChannelFrame.marshall(channel_number=channel.number, frames=frames))
    return confirmation
