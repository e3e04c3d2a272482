"""The domain root: every virtual host and user of one broker.

Durable definitions: given a `definitions` store (the methods of
`storage.definitions.DefinitionStore`), the broker starts from what it holds
and writes every change to vhosts, users and permissions (and, through each
`VirtualHost`, to durable exchanges, queues and bindings) before making it in
memory. The default vhost and user are created only on a blank store, as
RabbitMQ seeds only a fresh node's database: deleting the default user stays
deleted across restarts. Without a store (None) nothing is kept.

Administration (vhosts, users, permissions, topic permissions, limits,
policies, operator policies, runtime and global parameters) is a set of
plain methods here, for the management API and tests; unknown names
raise LookupError and invalid values ValueError, with rabbitmqctl's words.

Open connections register here (`open_vhost` / `connection_closed`) so that
limits can count them and deleting a vhost or a user closes theirs (320, as
RabbitMQ). A connection is any object with `user`, `vhost`, `channels` and
`force_close(reason)` (amqp_server.amqp.connection.Connection). The limits
count the whole node: what this broker counts (`counted`: connections of the
node, of each vhost and user, channels of each user) plus, on a node of
several shards, the other shards' counts (`ShardPort.elsewhere`); every
change of a count is told to them (`ShardPort.tallied`).

Runtime parameters (vhosts.parameters) describe shovels and federation
upstreams; what runs them (amqp_server.links) follows them through
`on_parameter_changed`, called after every change has been stored, and
through `on_policies_changed` for the federation policy keys.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import secrets
from collections.abc import Callable

from vhosts.dead_letter_recorder import DeadLetterRecorder, ShardLog
from vhosts.errors import NOT_ALLOWED, AMQPError
from vhosts.stats import Churn
from vhosts.parameters import validate as validate_parameter
from vhosts.policies import OperatorPolicy, Policy
from vhosts.users import (
    USER_LIMITS,
    VHOST_LIMITS,
    Permission,
    TopicPermission,
    User,
    check_limits,
    check_pattern,
    hash_password,
    limit_reached,
)
from vhosts.vhost import VirtualHost

log = logging.getLogger("hutch.broker")


def _every_shard(method):
    """A change every shard of a node makes, in the order shard 0 made it
    (amqp_server.shards.definitions): shard 0 reports the call once it
    succeeded; the changes it makes on the way are part of it."""
    @functools.wraps(method)
    def change(self, *args, **kwargs):
        shards = self.shards
        if shards is None:
            return method(self, *args, **kwargs)
        with shards.nested() as outermost:
            result = method(self, *args, **kwargs)
        if outermost:  # a callable argument (a check) was made here and is not repeated
            shards.changed(("broker", method.__name__, args,
                            {key: value for key, value in kwargs.items() if not callable(value)}))
        return result
    change.every_shard = True  # the only Broker calls another shard's "apply" may name
    return change


class Broker:
    def __init__(
        self,
        default_user: str,
        default_pass: str,
        default_vhost: str,
        loopback_users: list[str],
        definitions=None,
        message_storage=None,
        shards=None,
    ) -> None:
        self.vhosts: dict[str, VirtualHost] = {}
        # The node's other shards (vhosts.remote_queue.ShardPort), when it has several.
        self.shards = shards
        # On a node of several shards: order(op, done) has a definition
        # change made on every shard, in one order, and calls done(result or
        # AMQPError) once every shard applied it (amqp_server.shards).
        self.order_definition = None
        self.users: dict[str, User] = {}
        self.loopback_users = frozenset(loopback_users)
        self.churn = Churn()
        self.definitions = definitions
        # the open ones (see the module docstring) -> the (vhost, user) names they are counted under
        self.connections: dict[object, tuple[str, str]] = {}
        # (kind, name) -> how many are open here: ("node", ""), ("vhost", v), ("user", u), ("channels", u)
        self.counted: dict[tuple[str, str], int] = {}
        # vhost name -> `storage.vhost_storage.VhostStorage` (None: all in memory)
        self.message_storage = message_storage
        # A cluster's leader: barrier(done) calls done once the in-sync
        # followers hold every change made so far (the replies to declares,
        # binds, deletes and tx.commit wait for it). None: a single node.
        self.durability_barrier = None
        # A cluster's leader: False once its lease may have run out; then no
        # confirm or PUBACK leaves (fencing, docs/cluster.md). None: a single node.
        self.promising = None
        self._started = False  # vhosts added later get their storage ready at once
        # Called with a vhost's name once it is deleted: front ends drop
        # what they keep per vhost (MQTT's retained messages and sessions).
        self.on_vhost_deleted: list[Callable[[str], None]] = []
        # name -> JSON value (RabbitMQ's global runtime parameters)
        self.global_parameters: dict[str, object] = {}
        # Called with (vhost, component, name, value or None when cleared).
        self.on_parameter_changed: list[Callable[[str, str, str, object], None]] = []
        # Called with a vhost's name when its policies or operator policies change.
        self.on_policies_changed: list[Callable[[str], None]] = []
        stored = definitions.load() if definitions is not None else None
        if stored is not None and not stored.blank:
            self._restore(stored)
        else:
            with self._transaction():
                self.add_vhost(default_vhost)
                if default_user:
                    self.put_user(default_user, hash_password(default_pass), ["administrator"])
                    self.set_permissions(default_user, default_vhost, Permission())
        if "internal_cluster_id" not in self.global_parameters:
            # RabbitMQ seeds one at first start; tools read it to tell clusters apart.
            self.set_global_parameter("internal_cluster_id", "hutch-cluster-id-" + secrets.token_urlsafe(16))
        for vhost in self.vhosts.values():
            vhost.storage_ready()
        self._started = True

    def _new_vhost(self, name: str) -> VirtualHost:
        storage = self.message_storage(name) if self.message_storage is not None else None
        vhost = VirtualHost(name, self.definitions, storage)
        vhost.churn = self.churn
        vhost.shards = self.shards
        if storage is not None and storage.dead_letters is not None:
            # shard 0 keeps the node's dead-letter log (vhosts.dead_letter_recorder)
            log = storage.dead_letters
            if self.shards is not None and self.shards.here != 0:
                log = ShardLog(name, self.shards, log.settings.include_bodies)
            vhost.on_dead_letter.append(DeadLetterRecorder(name, log))
        return vhost

    # -- durable definitions ---------------------------------------------------

    def _transaction(self):
        if self.definitions is None:
            return contextlib.nullcontext()
        return self.definitions.transaction()

    def _restore(self, stored) -> None:
        """Rebuild from a `storage.definitions.Definitions` snapshot."""
        for name in stored.vhosts:
            vhost = self.vhosts[name] = self._new_vhost(name)
            vhost.description, vhost.tags = stored.vhost_metadata[name]
        for row in stored.users:
            self.users[row.name] = User(row.name, row.password_hash, tags=list(row.tags))
        for row in stored.permissions:
            user = self.users.get(row.user)
            if user is not None and row.vhost in self.vhosts:
                user.permissions[row.vhost] = Permission(row.configure, row.write, row.read)
        for row in stored.topic_permissions:
            user = self.users.get(row.user)
            if user is not None and row.vhost in self.vhosts:
                user.topic_permissions[(row.vhost, row.exchange)] = TopicPermission(row.exchange, row.write, row.read)
        for name, limits in stored.user_limits.items():
            if name in self.users:
                self.users[name].limits = limits
        for name, limits in stored.vhost_limits.items():
            if name in self.vhosts:
                self.vhosts[name].limits = limits
        for rows, kind, attribute in ((stored.policies, Policy, "policies"),
                                      (stored.operator_policies, OperatorPolicy, "operator_policies")):
            for row in rows:
                if row.vhost in self.vhosts:
                    try:
                        policy = kind(row.vhost, row.name, row.pattern, row.definition, row.priority, row.apply_to)
                    except ValueError as exc:
                        log.warning("not restoring policy '%s' in vhost '%s': %s", row.name, row.vhost, exc)
                        continue
                    getattr(self.vhosts[row.vhost], attribute)[row.name] = policy
        for row in stored.parameters:
            if row.vhost in self.vhosts:
                self.vhosts[row.vhost].parameters[(row.component, row.name)] = row.value
                if row.owner is not None:
                    self.vhosts[row.vhost].parameter_owners[(row.component, row.name)] = row.owner
        self.global_parameters.update(stored.global_parameters)
        for name, vhost in self.vhosts.items():
            vhost.restore(
                [row for row in stored.exchanges if row.vhost == name],
                [row for row in stored.queues if row.vhost == name],
                [row for row in stored.bindings if row.vhost == name],
            )

    def detach_definitions(self) -> None:
        """Stop writing to the store (at shutdown: queues and exchanges
        auto-deleted while connections are closed stay in the store, as
        they do after a crash)."""
        self.definitions = None
        for vhost in self.vhosts.values():
            vhost.definitions = None

    # -- vhosts, users, permissions ---------------------------------------------

    @_every_shard
    def add_vhost(self, name: str, description: str = "", tags: list = (),
                  acting_user: str | None = None) -> VirtualHost:
        """The vhost, created if new, with this description and these tags
        (replacing what it had, as RabbitMQ's PUT /api/vhosts/{vhost} does).
        The acting user, when it is a broker user, gets full permissions on a
        vhost this creates (RabbitMQ's put_vhost does so for the API's user,
        not for an existing vhost nor for definitions loaded at boot)."""
        tags = list(tags)
        vhost = self.vhosts.get(name)
        if vhost is not None and vhost.description == description and vhost.tags == tags:
            return vhost
        created = vhost is None
        with self._transaction():
            if self.definitions is not None:
                self.definitions.upsert_vhost(name, description, tags)
            if created:
                vhost = self.vhosts[name] = self._new_vhost(name)
                if self._started:
                    vhost.storage_ready()
            vhost.description, vhost.tags = description, tags
            if created and acting_user in self.users:
                self.set_permissions(acting_user, name, Permission())
        return vhost

    @_every_shard
    def delete_vhost(self, name: str) -> None:
        """The vhost, its connections (closed with 320), exchanges, queues,
        their messages on disk, its limits and policies, and every permission
        and topic permission on it."""
        vhost = self._vhost(name)
        with self._transaction():  # with what closing its connections auto-deletes
            self._force_close(lambda c: c.vhost is vhost, "vhost '%s' is deleted" % name)
            if self.definitions is not None:
                self.definitions.delete_vhost(name)
        vhost.definitions = None
        del self.vhosts[name]
        for component, parameter in list(vhost.parameters):
            for notify in self.on_parameter_changed:
                notify(name, component, parameter, None)
        for user in self.users.values():
            user.permissions.pop(name, None)
            for key in [key for key in user.topic_permissions if key[0] == name]:
                del user.topic_permissions[key]
        for queue in list(vhost.queues.values()):
            vhost.remove_queue(queue)
        if vhost.message_storage is not None:
            vhost.message_storage.destroy()
        for forget in self.on_vhost_deleted:
            forget(name)

    @_every_shard
    def set_tracing(self, name: str, enabled: bool) -> None:
        """The firehose of the vhost on or off (vhosts.firehose; not kept across restarts, as in RabbitMQ)."""
        self._vhost(name).tracing = enabled

    @_every_shard
    def set_vhost_limits(self, name: str, limits: dict) -> None:
        """Replace the vhost's limits (max-connections, max-queues; negative:
        no limit), as rabbitmqctl set_vhost_limits does. Open connections
        and existing queues stay."""
        vhost = self._vhost(name)
        limits = check_limits(limits, VHOST_LIMITS)
        if self.definitions is not None:
            self.definitions.set_vhost_limits(name, limits)
        vhost.limits = limits

    @_every_shard
    def clear_vhost_limits(self, name: str) -> None:
        self.set_vhost_limits(name, {})

    def _vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise LookupError("no vhost '%s'" % name)
        return vhost

    def _user(self, name: str) -> User:
        user = self.users.get(name)
        if user is None:
            raise LookupError("no user '%s'" % name)
        return user

    @_every_shard
    def put_user(self, name: str, password_hash: str, tags: list[str]) -> User:
        """Add a user, or change an existing one's password hash and tags."""
        if self.definitions is not None:
            self.definitions.upsert_user(name, password_hash, tags)
        user = self.users.get(name)
        if user is None:
            user = self.users[name] = User(name, password_hash, tags=list(tags))
        else:
            user.password_hash = password_hash
            user.tags = list(tags)
        return user

    @_every_shard
    def add_user(self, name: str, password: str, tags=()) -> User:
        """A new user with a password (stored hashed); ValueError if it exists."""
        if name in self.users:
            raise ValueError("user '%s' already exists" % name)
        return self.put_user(name, hash_password(password), list(tags))

    @_every_shard
    def change_password(self, name: str, password: str) -> None:
        user = self._user(name)
        self.put_user(name, hash_password(password), user.tags)

    @_every_shard
    def set_user_tags(self, name: str, tags: list[str]) -> None:
        user = self._user(name)
        self.put_user(name, user.password_hash, list(tags))

    @_every_shard
    def delete_user(self, name: str) -> None:
        """The user, its permissions and limits; its connections are closed (320)."""
        self._user(name)
        if self.definitions is not None:
            self.definitions.delete_user(name)
        del self.users[name]
        self._force_close(lambda c: c.user is not None and c.user.name == name, "user '%s' is deleted" % name)

    @_every_shard
    def set_user_limits(self, name: str, limits: dict) -> None:
        """Add to the user's limits (max-connections, max-channels; negative:
        no limit), as rabbitmqctl set_user_limits does."""
        user = self._user(name)
        merged = {**user.limits, **check_limits(limits, USER_LIMITS)}
        if self.definitions is not None:
            self.definitions.set_user_limits(name, merged)
        user.limits = merged

    @_every_shard
    def clear_user_limits(self, name: str, limit: str = "all") -> None:
        """One limit by name, or "all"."""
        user = self._user(name)
        remaining = {} if limit == "all" else {k: v for k, v in user.limits.items() if k != limit}
        if self.definitions is not None:
            self.definitions.set_user_limits(name, remaining)
        user.limits = remaining

    @_every_shard
    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        """Open channels keep the grants they already used (RabbitMQ's
        per-channel cache, see vhosts.access); everything else sees the change."""
        self._user(user)
        self._vhost(vhost)
        for pattern in (permission.configure, permission.write, permission.read):
            check_pattern(pattern)
        if self.definitions is not None:
            self.definitions.set_permission(user, vhost, permission.configure, permission.write, permission.read)
        self.users[user].permissions[vhost] = permission

    @_every_shard
    def clear_permissions(self, user: str, vhost: str) -> None:
        found = self.users.get(user)
        if found is not None and vhost in found.permissions:
            if self.definitions is not None:
                self.definitions.clear_permission(user, vhost)
            del found.permissions[vhost]

    @_every_shard
    def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: str, read: str) -> None:
        found = self._user(user)
        self._vhost(vhost)
        for pattern in (write, read):
            check_pattern(pattern)
        if self.definitions is not None:
            self.definitions.set_topic_permission(user, vhost, exchange, write, read)
        found.topic_permissions[(vhost, exchange)] = TopicPermission(exchange, write, read)

    @_every_shard
    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        """One exchange's topic permission, or (None) all of the user's in the vhost."""
        found = self._user(user)
        if self.definitions is not None:
            self.definitions.clear_topic_permission(user, vhost, exchange)
        for key in [k for k in found.topic_permissions if k[0] == vhost and exchange in (None, k[1])]:
            del found.topic_permissions[key]

    # -- policies --------------------------------------------------------------

    @_every_shard
    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, priority: int = 0,
                   apply_to: str = "all", operator: bool = False) -> Policy:
        """Add or replace a policy, or (`operator`) an operator policy
        (ValueError with rabbitmqctl's reason when invalid), and apply it at
        once to existing queues and exchanges."""
        target = self._vhost(vhost)
        policy = (OperatorPolicy if operator else Policy)(vhost, name, pattern, definition, priority, apply_to)
        table = "operator_policies" if operator else "policies"
        if self.definitions is not None:
            self.definitions.set_policy(vhost, name, pattern, apply_to, policy.definition, priority, table)
        getattr(target, table)[name] = policy
        self._policies_changed(target)
        return policy

    @_every_shard
    def clear_policy(self, vhost: str, name: str, operator: bool = False) -> None:
        target = self._vhost(vhost)
        table = "operator_policies" if operator else "policies"
        if name not in getattr(target, table):
            raise LookupError("Parameter does not exist")
        if self.definitions is not None:
            self.definitions.clear_policy(vhost, name, table)
        del getattr(target, table)[name]
        self._policies_changed(target)

    def _policies_changed(self, target: VirtualHost) -> None:
        target.apply_policies()
        for notify in self.on_policies_changed:
            notify(target.name)

    def list_policies(self, vhost: str | None = None, operator: bool = False) -> list[Policy]:
        """Every policy (or operator policy), or those of one vhost."""
        vhosts = [self._vhost(vhost)] if vhost is not None else self.vhosts.values()
        table = "operator_policies" if operator else "policies"
        return [policy for v in vhosts for policy in getattr(v, table).values()]

    # -- runtime and global parameters -----------------------------------------

    @_every_shard
    def set_parameter(self, vhost: str, component: str, name: str, value: object,
                      owner: str | None = None, may_connect=None) -> None:
        """Add or replace a runtime parameter: ValueError whose text is
        RabbitMQ's error lines when the value is invalid (vhosts.parameters;
        `may_connect` checks the URIs a link would connect to for the user
        setting it). `owner`: that user, whose access the links check
        again whenever they start (None: the broker's own)."""
        target = self._vhost(vhost)
        errors = validate_parameter(component, name, value, may_connect)
        if errors:
            raise ValueError("\n".join(errors))
        if self.definitions is not None:
            self.definitions.set_parameter(vhost, component, name, value, owner)
        target.parameters[(component, name)] = value
        if owner is None:
            target.parameter_owners.pop((component, name), None)
        else:
            target.parameter_owners[(component, name)] = owner
        for notify in self.on_parameter_changed:
            notify(vhost, component, name, value)

    @_every_shard
    def clear_parameter(self, vhost: str, component: str, name: str) -> None:
        target = self._vhost(vhost)
        if (component, name) not in target.parameters:
            raise LookupError("Parameter does not exist")
        if self.definitions is not None:
            self.definitions.clear_parameter(vhost, component, name)
        del target.parameters[(component, name)]
        target.parameter_owners.pop((component, name), None)
        for notify in self.on_parameter_changed:
            notify(vhost, component, name, None)

    def list_parameters(self, vhost: str | None = None, component: str | None = None) -> list[tuple]:
        """(vhost, component, name, value) of every parameter, or those of a
        vhost and component, in RabbitMQ's order (by name)."""
        vhosts = [self._vhost(vhost)] if vhost is not None else self.vhosts.values()
        found = [(v.name, c, n, value) for v in vhosts for (c, n), value in v.parameters.items()
                 if component in (None, c)]
        return sorted(found, key=lambda row: (row[2], row[1], row[0]))

    @_every_shard
    def set_global_parameter(self, name: str, value: object) -> None:
        if self.definitions is not None:
            self.definitions.set_global_parameter(name, value)
        self.global_parameters[name] = value

    @_every_shard
    def clear_global_parameter(self, name: str) -> None:
        if name not in self.global_parameters:
            raise LookupError("Parameter does not exist")
        if self.definitions is not None:
            self.definitions.clear_global_parameter(name)
        del self.global_parameters[name]

    # -- connections ---------------------------------------------------------

    def authenticate(self, username: str, password: str, from_loopback: bool) -> User | None:
        """The user, or None when login must be refused (unknown user, wrong
        password, or a loopback-only user connecting from elsewhere)."""
        user = self.users.get(username)
        if user is None or not user.authenticate(password):
            return None
        if username in self.loopback_users and not from_loopback:
            return None
        return user

    def open_vhost(self, user: User, name: str, connection=None, admitted: bool = False) -> VirtualHost:
        """connection.open: RabbitMQ's checks in its order (the vhost's
        connection limit, the user's, access to the vhost); the connection
        is registered when it passes. `admitted`: a connection that moved
        here from another shard of the node, counted in the limits already."""
        vhost = self.vhosts.get(name)
        if vhost is not None and not admitted:
            limit = limit_reached(vhost.limits, "max-connections", self.node_count("vhost", name))
            if limit is not None:
                raise AMQPError(NOT_ALLOWED, "access to vhost '%s' refused for user '%s': connection limit (%d) is reached"
                                % (name, user.name, limit))
        limit = None if admitted else limit_reached(user.limits, "max-connections", self.node_count("user", user.name))
        if limit is not None:
            raise AMQPError(NOT_ALLOWED, "connection refused for user '%s': user connection limit (%d) is reached"
                            % (user.name, limit))
        if vhost is None:
            raise AMQPError(NOT_ALLOWED, "vhost %s not found" % name)
        if name not in user.permissions:
            raise AMQPError(NOT_ALLOWED, "access to vhost '%s' refused for user '%s'" % (name, user.name))
        if connection is not None:
            self.connections[connection] = (name, user.name)
            self._count("node", "", 1)
            self._count("vhost", name, 1)
            self._count("user", user.name, 1)
        return vhost

    def node_count(self, kind: str, name: str) -> int:
        """How many of (kind, name) are open on the whole node (see the module docstring)."""
        here = self.counted.get((kind, name), 0)
        return here if self.shards is None else here + self.shards.elsewhere(kind, name)

    def _count(self, kind: str, name: str, delta: int) -> None:
        key = (kind, name)
        count = self.counted.get(key, 0) + delta
        if count:
            self.counted[key] = count
        else:
            del self.counted[key]
        if self.shards is not None:
            self.shards.tallied(kind, name, count)

    def check_channel_limit(self, user: User) -> None:
        """channel.open: the user's max-channels over all its connections (530)."""
        limit = limit_reached(user.limits, "max-channels", self.node_count("channels", user.name))
        if limit is not None:
            raise AMQPError(NOT_ALLOWED, "number of channels opened for user '%s' has reached "
                            "the maximum allowed user limit of (%d)" % (user.name, limit))

    def channels_changed(self, connection, delta: int) -> None:
        """A registered connection opened (1) or closed (-1) channels."""
        names = self.connections.get(connection)
        if names is not None:
            self._count("channels", names[1], delta)

    def connection_closed(self, connection) -> None:
        """Unregister it (its channels uncounted with it; once: a second call does nothing)."""
        names = self.connections.pop(connection, None)
        if names is not None:
            vhost, user = names
            self._count("node", "", -1)
            self._count("vhost", vhost, -1)
            self._count("user", user, -1)
            if connection.channels:
                self._count("channels", user, -len(connection.channels))

    def _force_close(self, which, reason: str) -> None:
        for connection in [c for c in self.connections if which(c)]:
            connection.force_close(reason)
