"""Federation links: a federated exchange or queue of this broker receives
from the same-named exchange or queue of an upstream broker, as RabbitMQ's
federation plugin does.

An upstream is a "federation-upstream" parameter (uri, prefetch-count,
reconnect-delay, ack-mode, trust-user-id, exchange, queue, max-hops,
expires, message-ttl); a policy's "federation-upstream" key names one, its
"federation-upstream-set" key names a "federation-upstream-set" parameter
(a list of {"upstream": name, and keys overriding the upstream's}) or "all"
(every upstream of the vhost). `upstreams_for` resolves a policy definition
to `Upstream`s; there is one link per (exchange or queue, upstream).

Federated exchange (`ExchangeLink`): on the upstream, the link declares the
exchange if it is missing (passive first, then with the local exchange's
type) and a durable queue "federation: X to <node> <id>" (with expires as
x-expires and message-ttl as x-message-ttl), and binds that queue to the
upstream exchange with the bindings of the local exchange, kept in step
(the table's version is looked at every `SYNC_INTERVAL`, the bindings
listed when it changed): only messages some local binding matches cross. What
arrives is published to the local exchange with its routing key.

Federated queue (`QueueLink`): the link consumes from the upstream queue
(queue, else the same name; declared durable if missing) only while the
local queue has a consumer that can take a message and nothing ready,
checked every `SYNC_INTERVAL`; what arrives is published to the local queue.
On a node of several shards the links run on shard 0 and the queue may live
on another shard, which alone knows its consumers (those of every shard:
its stand-ins too) and its ready messages: the link then asks the owner
(the `DEMAND` service every shard answers, `demand_here`) rather than
reading its RemoteQueue, which holds only shard 0's own consumers and
counts as last reported.

Cycles: every message that crosses gets an entry appended to its
"x-received-from" header ({uri, exchange or queue, redelivered,
cluster-name: the upstream's name}). A link drops (acks without
publishing) a message that already crossed max-hops links (default 1) or
that was received from this node before. Node names are "hutch@<host>": two
hutch nodes on one host share a name, so a chain through both stops there.

Acknowledgement modes as for shovels (amqp_server.links.shovel): the local
publish is confirmed before the upstream delivery is acked (on-confirm, the
default), acked once written (on-publish), or not acked at all (no-ack).
"""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from urllib.parse import quote

from vhosts.parameters import FEDERATION_UPSTREAM, FEDERATION_UPSTREAM_SET, as_list

from amqp_server.links import client
from amqp_server.links.link import RUNNING, Link, ensure_queue, timestamp

SYNC_INTERVAL = 0.2  # seconds between two checks of bindings (exchanges) or demand (queues)
ERROR = "error"
DEMAND = "federation.demand"  # the shard service answering `demand_here`


@dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it, RabbitMQ's defaults filled in."""

    name: str
    uris: tuple
    prefetch_count: int = 1000
    reconnect_delay: float = 5.0
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    exchange: str | None = None
    queue: str | None = None
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None

    @classmethod
    def of(cls, name: str, value: dict) -> "Upstream":
        return cls(name, tuple(as_list(value["uri"])), int(value.get("prefetch-count", 1000)),
                   float(value.get("reconnect-delay", 5.0)), value.get("ack-mode", "on-confirm"),
                   bool(value.get("trust-user-id", False)), value.get("exchange"), value.get("queue"),
                   int(value.get("max-hops", 1)), value.get("expires"), value.get("message-ttl"))


def upstreams_for(vhost, definition: dict) -> list[Upstream]:
    """The upstreams a policy definition names, in `vhost` (a VirtualHost);
    names of parameters that do not exist are skipped."""
    upstreams = {name: value for (component, name), value in vhost.parameters.items()
                 if component == FEDERATION_UPSTREAM}
    if "federation-upstream" in definition:
        name = definition["federation-upstream"]
        return [Upstream.of(name, upstreams[name])] if name in upstreams else []
    chosen = definition.get("federation-upstream-set")
    if chosen is None:
        return []
    if chosen == "all":
        return [Upstream.of(name, upstreams[name]) for name in sorted(upstreams)]
    out = []
    for member in vhost.parameters.get((FEDERATION_UPSTREAM_SET, chosen)) or []:
        name = member.get("upstream")
        if name in upstreams:
            overrides = {key: value for key, value in member.items() if key != "upstream"}
            out.append(Upstream.of(name, {**upstreams[name], **overrides}))
    return out


def wants_messages(queue) -> bool:
    """A queue this shard owns has a consumer that can take a message and nothing ready."""
    return queue.message_count == 0 and any(c.channel.can_deliver(c) for c in queue.consumers)


def demand_here(broker, vhost: str, name: str) -> bool:
    """`wants_messages` of the queue this shard owns, for a link on another
    shard (False when it is gone, or not this shard's)."""
    host = broker.vhosts.get(vhost)
    queue = host.queues.get(name) if host is not None else None
    return queue is not None and not getattr(queue, "remote", False) and wants_messages(queue)


async def demand(queue) -> bool:
    """`wants_messages` of a local queue, asked of its owner when another
    shard owns it (a RemoteQueue: `port` is the way there). An owner that
    ended wants nothing: its consumers were cancelled with it."""
    if not getattr(queue, "remote", False):
        return wants_messages(queue)
    try:
        return bool(await queue.port.ask(queue.shard, DEMAND, queue.vhost, queue.name))
    # The owner ended before it answered (ShardGone, of the shards layer, which links may not
    # import), or its service failed (logged there): no demand.
    except Exception:  # noqa: BLE001
        return False


def received_from(properties) -> list:
    headers = properties.headers or {}
    entries = headers.get("x-received-from")
    return list(entries) if isinstance(entries, list) else []


class FederationLink(Link):
    """What exchange and queue links share: the two connections, the hop
    check, the forwarding with acknowledgements."""

    failed_state = ERROR
    kind = "federation link"
    type = ""  # "exchange" or "queue"

    def __init__(self, vhost, name: str, upstream: Upstream, local: client.LocalNode) -> None:
        super().__init__(vhost.name, name, local, upstream.reconnect_delay)
        self.host = vhost  # the VirtualHost: its exchange's bindings, its queue's demand
        self.upstream = upstream
        self.uri = next(iter(upstream.uris), "")  # RabbitMQ accepts an empty list too
        self.local_connection = ""
        self.id = hashlib.sha1(("%s/%s/%s/%s" % (self.vhost, self.type, name, upstream.name)).encode()
                               ).hexdigest()[:8]

    async def session(self) -> None:
        up = local = None
        try:
            self.uri, up = await self.connect(self.upstream.uris, "upstream")
            _uri, local = await self.connect([self.downstream_uri], "downstream")
            self.local_connection = "<%s>" % self.name
            up_channel = await up.channel(publisher_confirms=False)
            local_channel = await local.channel(publisher_confirms=self.upstream.ack_mode == "on-confirm")
            done = asyncio.get_running_loop().create_future()
            forward = self._forwarder(up, up_channel, local_channel, done)
            await up_channel.basic_qos(prefetch_count=self.upstream.prefetch_count)
            sync = asyncio.get_running_loop().create_task(self.follow(up, up_channel, forward, done))
            try:
                await self.until_closed([(up, "upstream connection"), (local, "downstream connection"),
                                         (up_channel, "upstream channel"), (local_channel, "downstream channel")],
                                        done)
            finally:
                sync.cancel()
        finally:
            await self.close(up, local)

    @property
    def downstream_uri(self) -> str:
        """This broker's vhost of the link, as the link reaches it."""
        return "amqp:///" + quote(self.vhost, safe="")

    async def follow(self, up, channel, forward, done: asyncio.Future) -> None:
        """Declare upstream, start consuming and keep in step with the local
        side until the session ends (errors end it through `done`)."""
        try:
            await self.declare_and_follow(up, channel, forward)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            if not done.done():
                done.set_exception(exc)

    async def declare_and_follow(self, up, channel, forward) -> None:
        raise NotImplementedError

    def target(self, routing_key: str) -> tuple[str, str]:
        """(exchange, routing key) a message is published to locally, given its own routing key."""
        raise NotImplementedError

    def _forwarder(self, up, up_channel, local_channel, done: asyncio.Future):
        upstream = self.upstream
        cluster_name = str((up.server_properties or {}).get("cluster_name", ""))
        uri = client.redacted(self.uri)
        publisher = client.Publisher(local_channel)
        confirms = local_channel.publisher_confirms

        def failed(exc: BaseException) -> None:
            if not done.done():
                done.set_exception(exc)

        acks = client.Acks(up_channel, failed) if upstream.ack_mode != "no-ack" else None

        def confirmed(tag: int, error: BaseException | None) -> None:
            if error is not None:
                failed(error)  # nacked, or the channel gone
            else:
                acks.settle(tag)

        def forward(message) -> None:
            delivery = message.delivery
            tag = delivery.delivery_tag
            if acks is not None:
                acks.delivered(tag)
            properties = message.header.properties
            hops = received_from(properties)
            if len(hops) >= upstream.max_hops or any(
                    isinstance(hop, dict) and hop.get("cluster-name") == self.local.node for hop in hops):
                if acks is not None:
                    acks.settle(tag)  # dropped: it has been here, or crossed enough links
                return
            entry = {"uri": uri, self.type: self.upstream_name, "redelivered": bool(delivery.redelivered),
                     "cluster-name": cluster_name}
            properties.headers = dict(properties.headers or {}, **{"x-received-from": hops + [entry]})
            if not upstream.trust_user_id:
                properties.user_id = None  # the local broker would check it against the link's user
            exchange, routing_key = self.target(delivery.routing_key)
            if acks is not None and confirms:
                publisher.publish(message.body, exchange, routing_key, message.header,
                                  lambda error: confirmed(tag, error))
            else:
                publisher.publish(message.body, exchange, routing_key, message.header)
                if acks is not None:
                    acks.settle(tag)

        return forward

    def status(self) -> dict:
        """RabbitMQ's /api/federation-links entry."""
        state = self.state
        out = {"node": self.local.node, self.type: self.name, "upstream_" + self.type: self.upstream_name,
               "type": self.type, "vhost": self.vhost, "upstream": self.upstream.name, "id": self.id,
               "status": state, "local_connection": self.local_connection, "uri": client.redacted(self.uri),
               "timestamp": timestamp(self.since)}
        if state == ERROR:
            out["error"] = self.reason
        return out

    @property
    def upstream_name(self) -> str:
        raise NotImplementedError


class ExchangeLink(FederationLink):
    type = "exchange"

    @property
    def upstream_name(self) -> str:
        return self.upstream.exchange or self.name

    @property
    def queue_name(self) -> str:
        # RabbitMQ's is "federation: X -> node"; pamqp refuses ">" in a queue name
        return "federation: %s to %s %s" % (self.name, self.local.node, self.local.cluster_id)

    def target(self, routing_key: str) -> tuple[str, str]:
        return self.name, routing_key

    async def declare_and_follow(self, up, channel, forward) -> None:
        from aiormq.exceptions import ChannelNotFoundEntity
        local = self.host.exchanges.get(self.name)
        if local is None:
            return
        try:
            probe = await up.channel()
            await probe.exchange_declare(self.upstream_name, passive=True)
            await probe.close()
        except ChannelNotFoundEntity:
            await channel.exchange_declare(self.upstream_name, exchange_type=local.type, durable=local.durable)
        arguments = {"x-internal-purpose": "federation"}
        if self.upstream.expires is not None:
            arguments["x-expires"] = self.upstream.expires
        if self.upstream.message_ttl is not None:
            arguments["x-message-ttl"] = self.upstream.message_ttl
        await ensure_queue(up, self.queue_name, arguments)
        bound: dict = {}
        seen = (local, local.table.version)
        await self._sync_bindings(channel, local, bound)
        await channel.consume(self.queue_name, forward, no_ack=self.upstream.ack_mode == "no-ack")
        self.set_state(RUNNING)
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            local = self.host.exchanges.get(self.name)
            if local is None:
                return
            if (local, local.table.version) != seen:  # the bindings (or the exchange) changed
                seen = (local, local.table.version)
                await self._sync_bindings(channel, local, bound)

    async def _sync_bindings(self, channel, local, bound: dict) -> None:
        """Bind the upstream queue with every binding key (and arguments) of
        the local exchange, and unbind what the local exchange lost.
        `bound`: (key, arguments as text) -> arguments, of what is bound now."""
        wanted = {(key, _frozen(arguments)): arguments for _dest, key, arguments in local.table.bindings()}
        for binding in sorted(set(wanted) - set(bound)):
            await channel.queue_bind(self.queue_name, self.upstream_name, routing_key=binding[0],
                                     arguments=wanted[binding] or None)
            bound[binding] = wanted[binding]
        for binding in sorted(set(bound) - set(wanted)):
            await channel.queue_unbind(self.queue_name, self.upstream_name, routing_key=binding[0],
                                       arguments=bound.pop(binding) or None)


class QueueLink(FederationLink):
    type = "queue"

    @property
    def upstream_name(self) -> str:
        return self.upstream.queue or self.name

    def target(self, routing_key: str) -> tuple[str, str]:
        return "", self.name

    async def declare_and_follow(self, up, channel, forward) -> None:
        await ensure_queue(up, self.upstream_name)
        self.set_state(RUNNING)
        tag = None
        while True:
            queue = self.host.queues.get(self.name)
            if queue is None:
                return
            wanted = await demand(queue)
            if wanted and tag is None:
                tag = await channel.consume(self.upstream_name, forward,
                                           no_ack=self.upstream.ack_mode == "no-ack")
            elif not wanted and tag is not None:
                await channel.basic_cancel(tag)
                tag = None
            await asyncio.sleep(SYNC_INTERVAL)


def _frozen(arguments: dict) -> str:
    """Binding arguments as a comparable key."""
    return repr(sorted((arguments or {}).items()))
