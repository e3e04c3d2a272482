"""Access control for one channel: RabbitMQ's permission checks and their cache.

Theory of operation:
- Every AMQP operation names resources (an exchange or a queue) and needs a
  permission on each: configure to declare or delete, write to publish to
  an exchange or bind to a destination, read to consume, get, purge or bind
  from a source (the mapping is in docs/permissions.md; `VirtualHost` and
  the channel call `check` where RabbitMQ's rabbit_channel does, so checks
  and the other errors come in RabbitMQ's order).
- A decision is read from the user's live permissions (vhosts.users), so a
  change applies to every check made after it. Like RabbitMQ's channel,
  each `Access` caches the *granted* (kind, name, permission) triples, the
  most recent CACHE_SIZE of them: a channel that already used a resource
  keeps that grant after a revocation; a new channel sees the change at once.
  Publishing looks its exchange up in `_publishable` (a dict keyed by the
  exchange name), so a publish costs one dict lookup, no regex and no
  allocation.
- Topic permissions apply only to topic exchanges and only when the user has
  one for that exchange in this vhost (none means allowed, as RabbitMQ);
  granted (exchange, routing key, permission) checks are cached like the rest.
"""
from __future__ import annotations

from vhosts.errors import ACCESS_REFUSED, AMQPError
from vhosts.users import User

CACHE_SIZE = 12  # RabbitMQ's ?MAX_PERMISSION_CACHE_SIZE
DEFAULT_EXCHANGE = "amq.default"  # how permissions name the default exchange ""


class Access:
    __slots__ = ("user", "vhost", "variables", "_granted", "_publishable")

    def __init__(self, user: User, vhost: str, client_id: str | None = None) -> None:
        self.user = user
        self.vhost = vhost
        # Topic permission variables (RabbitMQ's variable map).
        self.variables = {"username": user.name, "vhost": vhost}
        if client_id is not None:
            self.variables["client_id"] = client_id
        self._granted: dict[tuple, None] = {}
        self._publishable: dict[str, None] = {}

    def check(self, kind: str, name: str, permission: str) -> None:
        """Raise 403 unless the user has `permission` ("configure", "write",
        "read") on the `kind` ("exchange", "queue") resource `name`."""
        key = (kind, name, permission)
        if key in self._granted:
            return
        self._decide(kind, name, permission)
        _remember(self._granted, key)

    def publish(self, exchange: str) -> None:
        """basic.publish: write on the exchange (the hot path)."""
        if exchange in self._publishable:
            return
        self._decide("exchange", exchange, "write")
        _remember(self._publishable, exchange)

    def _decide(self, kind: str, name: str, permission: str) -> None:
        if kind == "exchange" and name == "":
            name = DEFAULT_EXCHANGE
        granted = self.user.permissions.get(self.vhost)
        if granted is None or not granted.allows(permission, name):
            raise AMQPError(
                ACCESS_REFUSED,
                "access to %s '%s' in vhost '%s' refused for user '%s'" % (kind, name, self.vhost, self.user.name),
            )

    def topic(self, exchange, routing_key: str, permission: str) -> None:
        """Topic permission ("write" to publish, "read" to bind) of a routing
        key on `exchange` (an `Exchange`, or None when it does not exist)."""
        if exchange is None or exchange.type != "topic":
            return
        rule = self.user.topic_permissions.get((self.vhost, exchange.name))
        if rule is None:
            return
        key = ("topic", exchange.name, routing_key, permission)
        if key in self._granted:
            return
        if not rule.allows(permission, routing_key, self.variables):
            raise AMQPError(
                ACCESS_REFUSED,
                "access to topic '%s' in exchange '%s' in vhost '%s' refused for user '%s'"
                % (routing_key, exchange.name, self.vhost, self.user.name),
            )
        _remember(self._granted, key)


def _remember(cache: dict, key) -> None:
    if len(cache) >= CACHE_SIZE:
        del cache[next(iter(cache))]
    cache[key] = None
