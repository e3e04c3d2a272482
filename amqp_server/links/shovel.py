"""A dynamic shovel: consume from a queue on one broker, publish to another,
as RabbitMQ 3.10's shovel plugin does with the keys of a "shovel" runtime
parameter (validated by vhosts.parameters).

Theory of operation. One task per shovel runs sessions until it is stopped:
a session connects to the source and the destination (the first URI of a
list that answers, tried in random order as RabbitMQ does), declares what
the definition names (below), consumes and forwards until either connection
goes away; then the shovel is "terminated" with the reason, waits (the
reconnect delay, doubled after each failed session up to `MAX_BACKOFF`,
back to the delay once a session has run), and starts again.

Declarations, as RabbitMQ's shovel: a named queue (src-queue, dest-queue)
is looked up passively and declared durable only when missing; with
src-exchange the shovel consumes from an exclusive server-named queue bound
to it with src-exchange-key. Exchanges are not declared.

Ack modes and what they guarantee (docs/links.md):
- on-confirm: the source delivery is acked only once the destination has
  confirmed the publish (for a persistent message, once it is on the
  destination's disk). Either broker may die at any moment and nothing is
  lost; a message confirmed whose ack did not reach the source is sent
  again (a duplicate).
- on-publish: acked once the publish is written to the destination
  connection; a message in flight when the destination dies is lost.
- no-ack: the source forgets each message as it sends it.

Where a message goes: dest-queue (through the default exchange), else
dest-exchange with dest-exchange-key or the message's own routing key, else
the exchange and routing key it was published with. dest-publish-properties
override the message's properties; dest-add-forward-headers adds the
"x-shovelled" header, dest-add-timestamp-header "x-shovelled-timestamp".

src-delete-after ("queue-length": the messages in the queue when the
shovel starts, or a number): once that many have been moved the shovel
deletes its own parameter (`on_done`), so it stops everywhere.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from vhosts.parameters import as_list

from amqp_server.links import client
from amqp_server.links.link import RUNNING, STARTING, Link, ensure_queue, timestamp

log = logging.getLogger("hutch.shovel")

DEFAULT_PREFETCH = 1000  # RabbitMQ's src-prefetch-count default
DEFAULT_RECONNECT_DELAY = 5.0  # seconds, RabbitMQ's default
TERMINATED = "terminated"


@dataclass(frozen=True)
class ShovelSpec:
    """A validated "shovel" parameter value, with RabbitMQ's defaults and
    pre-3.7 key names folded in."""

    src_uris: tuple
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    prefetch_count: int
    delete_after: object  # "never", "queue-length" or a count
    dest_uris: tuple
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None
    add_forward_headers: bool
    add_timestamp_header: bool
    publish_properties: dict
    ack_mode: str
    reconnect_delay: float

    @classmethod
    def of(cls, value: dict) -> "ShovelSpec":
        def either(key: str, old: str, default):
            return value.get(key, value.get(old, default))
        return cls(
            src_uris=tuple(as_list(value["src-uri"])),
            src_queue=value.get("src-queue"),
            src_exchange=value.get("src-exchange"),
            src_exchange_key=value.get("src-exchange-key", ""),
            prefetch_count=int(either("src-prefetch-count", "prefetch-count", DEFAULT_PREFETCH)),
            delete_after=either("src-delete-after", "delete-after", "never"),
            dest_uris=tuple(as_list(value["dest-uri"])),
            dest_queue=value.get("dest-queue"),
            dest_exchange=value.get("dest-exchange"),
            dest_exchange_key=value.get("dest-exchange-key"),
            add_forward_headers=either("dest-add-forward-headers", "add-forward-headers", False),
            add_timestamp_header=either("dest-add-timestamp-header", "add-timestamp-header", False),
            publish_properties=dict(either("dest-publish-properties", "publish-properties", {})),
            ack_mode=value.get("ack-mode", "on-confirm"),
            reconnect_delay=float(value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)),
        )


class Shovel(Link):
    """One running dynamic shovel (see the module docstring)."""

    kind = "shovel"

    def __init__(self, vhost: str, name: str, value: dict, local: client.LocalNode, on_done) -> None:
        self.spec = ShovelSpec.of(value)
        super().__init__(vhost, name, local, self.spec.reconnect_delay)
        self.value = value
        self.on_done = on_done  # called with no argument once src-delete-after is reached
        self.src_uri = next(iter(self.spec.src_uris), "")  # RabbitMQ accepts an empty list too
        self.dest_uri = next(iter(self.spec.dest_uris), "")
        self._remaining: int | None = None  # for src-delete-after
        if self.spec.delete_after not in ("never", "queue-length"):
            self._remaining = int(self.spec.delete_after)

    # -- one session ---------------------------------------------------------------------

    async def session(self) -> None:
        spec_ = self.spec
        src = dest = None
        try:
            self.src_uri, src = await self.connect(spec_.src_uris, "source")
            self.dest_uri, dest = await self.connect(spec_.dest_uris, "destination")
            src_channel = await src.channel(publisher_confirms=False)
            dest_channel = await dest.channel(publisher_confirms=spec_.ack_mode == "on-confirm")
            queue, ready = await self._declare_source(src)
            if spec_.dest_queue is not None:
                await ensure_queue(dest, spec_.dest_queue)
            if spec_.delete_after == "queue-length":
                if self._remaining is None:
                    self._remaining = ready
            if self._remaining is not None and self._remaining <= 0:
                self.on_done()
                return
            done = asyncio.get_running_loop().create_future()
            forward, acks = self._forwarder(src_channel, dest_channel, done)
            await src_channel.basic_qos(prefetch_count=spec_.prefetch_count)
            self.unless_stopped()  # a stopped shovel takes no message
            await src_channel.consume(queue, forward, no_ack=spec_.ack_mode == "no-ack")
            self.set_state(RUNNING)
            log.info("shovel '%s' in vhost '%s' running: %s -> %s", self.name, self.vhost,
                     client.redacted(self.src_uri), client.redacted(self.dest_uri))
            await self.until_closed([(src, "source connection"), (dest, "destination connection"),
                                     (src_channel, "source channel"), (dest_channel, "destination channel")], done)
            if acks is not None:
                await acks.sent()  # the last acks reach the source before the connections close
            self.on_done()
        finally:
            await self.close(src, dest)

    async def _declare_source(self, connection) -> tuple[str, int]:
        """The queue to consume from and how many messages it holds."""
        spec_ = self.spec
        if spec_.src_queue is not None:
            return spec_.src_queue, await ensure_queue(connection, spec_.src_queue)
        channel = await connection.channel()
        declared = await channel.queue_declare("", exclusive=True)
        # RabbitMQ binds with queue "" and the key as given: an empty key is then the
        # queue's own name (AMQP's queue.bind shortcut), so only a fanout (or headers)
        # exchange delivers to a shovel without src-exchange-key
        await channel.queue_bind(declared.queue, spec_.src_exchange,
                                 routing_key=spec_.src_exchange_key or declared.queue)
        await channel.close()
        return declared.queue, 0

    # -- forwarding ----------------------------------------------------------------------

    def _route(self, delivery) -> tuple[str, str]:
        spec_ = self.spec
        if spec_.dest_queue is not None:
            return "", spec_.dest_queue
        if spec_.dest_exchange is not None:
            return spec_.dest_exchange, spec_.dest_exchange_key if spec_.dest_exchange_key is not None \
                else delivery.routing_key
        return delivery.exchange, delivery.routing_key

    def _header(self, header):
        """The content header to publish with: the one received, its
        properties changed as the definition asks (left undecoded when it
        asks for nothing)."""
        spec_ = self.spec
        if not (spec_.publish_properties or spec_.add_forward_headers or spec_.add_timestamp_header):
            return header
        properties = header.properties
        for key, value in spec_.publish_properties.items():
            setattr(properties, key, value)
        if spec_.add_forward_headers or spec_.add_timestamp_header:
            headers = dict(properties.headers or {})
            if spec_.add_forward_headers:
                record = {"shovelled-by": "hutch", "shovel-type": "dynamic", "shovel-name": self.name,
                          "shovel-vhost": self.vhost, "src-uri": client.redacted(self.src_uri),
                          "dest-uri": client.redacted(self.dest_uri)}
                for key, value in (("src-queue", spec_.src_queue), ("src-exchange", spec_.src_exchange),
                                   ("dest-queue", spec_.dest_queue), ("dest-exchange", spec_.dest_exchange)):
                    if value is not None:
                        record[key] = value
                headers["x-shovelled"] = list(headers.get("x-shovelled") or []) + [record]
            if spec_.add_timestamp_header:
                headers["x-shovelled-timestamp"] = int(time.time())
            properties.headers = headers
        return header

    def _forwarder(self, src_channel, dest_channel, done: asyncio.Future):
        """(the consumer callback, its Acks). `done` is resolved once
        src-delete-after is reached, or failed when the session must end."""
        ack_mode = self.spec.ack_mode
        publisher = client.Publisher(dest_channel)
        confirms = dest_channel.publisher_confirms
        # src-delete-after: forward no more than what is left to move (what this
        # session forwards but does not settle is redelivered to the next one)
        allowed = self._remaining
        forwarded = 0

        def failed(exc: BaseException) -> None:
            if not done.done():
                done.set_exception(exc)

        acks = client.Acks(src_channel, failed) if ack_mode != "no-ack" else None

        def moved(tag: int) -> None:
            if acks is not None:
                acks.settle(tag)
            if self._remaining is not None:
                self._remaining -= 1
                if self._remaining <= 0 and not done.done():
                    done.set_result(None)

        def confirmed(tag: int, error: BaseException | None) -> None:
            if error is not None:
                failed(error)  # nacked, or the channel gone
            else:
                moved(tag)

        def forward(message) -> None:
            nonlocal forwarded
            if done.done() or (allowed is not None and forwarded >= allowed):
                return  # left unacked: back to the queue when the session closes
            forwarded += 1
            delivery = message.delivery
            tag = delivery.delivery_tag
            exchange, routing_key = self._route(delivery)
            if acks is not None:
                acks.delivered(tag)
            if confirms:
                publisher.publish(message.body, exchange, routing_key, self._header(message.header),
                                  lambda error: confirmed(tag, error))
            else:
                publisher.publish(message.body, exchange, routing_key, self._header(message.header))
                moved(tag)

        return forward, acks

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict:
        """RabbitMQ's /api/shovels entry."""
        spec_ = self.spec
        out = {"node": self.local.node, "timestamp": timestamp(self.since), "name": self.name,
               "vhost": self.vhost, "type": "dynamic", "state": self.state}
        if self.state == TERMINATED:
            out["reason"] = self.reason
            return out
        if self.state == STARTING:
            return out
        out.update({"src_uri": client.redacted(self.src_uri), "src_protocol": "amqp091",
                    "dest_protocol": "amqp091", "dest_uri": client.redacted(self.dest_uri)})
        for key, value in (("src_queue", spec_.src_queue), ("src_exchange", spec_.src_exchange),
                           ("src_exchange_key", spec_.src_exchange_key if spec_.src_exchange else None),
                           ("dest_queue", spec_.dest_queue), ("dest_exchange", spec_.dest_exchange),
                           ("dest_exchange_key", spec_.dest_exchange_key)):
            if value is not None:
                out[key] = value
        return out
