"""The domain root: every virtual host and user of one broker.

Durable definitions: given a `definitions` store (the methods of
`storage.definitions.DefinitionStore`), the broker starts from what it holds
and writes every change to vhosts, users and permissions (and, through each
`VirtualHost`, to durable exchanges, queues and bindings) before making it in
memory. The default vhost and user are created only on a blank store, as
RabbitMQ seeds only a fresh node's database: deleting the default user stays
deleted across restarts. Without a store (None) nothing is kept.
"""
from __future__ import annotations

import contextlib

from vhosts.dead_letter_recorder import DeadLetterRecorder
from vhosts.errors import NOT_ALLOWED, AMQPError
from vhosts.stats import Churn
from vhosts.users import Permission, User, hash_password
from vhosts.vhost import VirtualHost


class Broker:
    def __init__(
        self,
        default_user: str,
        default_pass: str,
        default_vhost: str,
        loopback_users: list[str],
        definitions=None,
        message_storage=None,
    ) -> None:
        self.vhosts: dict[str, VirtualHost] = {}
        self.users: dict[str, User] = {}
        self.loopback_users = frozenset(loopback_users)
        self.churn = Churn()
        self.definitions = definitions
        # vhost name -> `storage.vhost_storage.VhostStorage` (None: all in memory)
        self.message_storage = message_storage
        self._started = False  # vhosts added later get their storage ready at once
        stored = definitions.load() if definitions is not None else None
        if stored is not None and not stored.blank:
            self._restore(stored)
        else:
            with self._transaction():
                self.add_vhost(default_vhost)
                if default_user:
                    self.put_user(default_user, hash_password(default_pass), ["administrator"])
                    self.set_permissions(default_user, default_vhost, Permission())
        for vhost in self.vhosts.values():
            vhost.storage_ready()
        self._started = True

    def _new_vhost(self, name: str) -> VirtualHost:
        storage = self.message_storage(name) if self.message_storage is not None else None
        vhost = VirtualHost(name, self.definitions, storage)
        vhost.churn = self.churn
        if storage is not None and storage.dead_letters is not None:
            vhost.on_dead_letter.append(DeadLetterRecorder(name, storage.dead_letters))
        return vhost

    # -- durable definitions ---------------------------------------------------

    def _transaction(self):
        if self.definitions is None:
            return contextlib.nullcontext()
        return self.definitions.transaction()

    def _restore(self, stored) -> None:
        """Rebuild from a `storage.definitions.Definitions` snapshot."""
        for name in stored.vhosts:
            self.vhosts[name] = self._new_vhost(name)
        for row in stored.users:
            self.users[row.name] = User(row.name, row.password_hash, tags=list(row.tags))
        for row in stored.permissions:
            user = self.users.get(row.user)
            if user is not None and row.vhost in self.vhosts:
                user.permissions[row.vhost] = Permission(row.configure, row.write, row.read)
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

    def add_vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            if self.definitions is not None:
                self.definitions.upsert_vhost(name)
            vhost = self.vhosts[name] = self._new_vhost(name)
            if self._started:
                vhost.storage_ready()
        return vhost

    def delete_vhost(self, name: str) -> None:
        """The vhost, its exchanges, queues (consumers are cancelled) and
        every permission on it."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            return
        if self.definitions is not None:
            self.definitions.delete_vhost(name)  # everything in it, in one transaction
        vhost.definitions = None
        del self.vhosts[name]
        for user in self.users.values():
            user.permissions.pop(name, None)
        for queue in list(vhost.queues.values()):
            vhost.remove_queue(queue)

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

    def delete_user(self, name: str) -> None:
        if name in self.users:
            if self.definitions is not None:
                self.definitions.delete_user(name)
            del self.users[name]

    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        if user not in self.users:
            raise LookupError("no user '%s'" % user)
        if vhost not in self.vhosts:
            raise LookupError("no vhost '%s'" % vhost)
        if self.definitions is not None:
            self.definitions.set_permission(user, vhost, permission.configure, permission.write, permission.read)
        self.users[user].permissions[vhost] = permission

    def clear_permissions(self, user: str, vhost: str) -> None:
        found = self.users.get(user)
        if found is not None and vhost in found.permissions:
            if self.definitions is not None:
                self.definitions.clear_permission(user, vhost)
            del found.permissions[vhost]

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

    def open_vhost(self, user: User, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise AMQPError(NOT_ALLOWED, "vhost %s not found" % name)
        if name not in user.permissions:
            raise AMQPError(NOT_ALLOWED, "access to vhost '%s' refused for user '%s'" % (name, user.name))
        return vhost
