"""The domain root: every virtual host and user of one broker."""
from __future__ import annotations

from vhosts.errors import NOT_ALLOWED, AMQPError
from vhosts.users import Permission, User, hash_password
from vhosts.vhost import VirtualHost


class Broker:
    def __init__(self, default_user: str, default_pass: str, default_vhost: str, loopback_users: list[str]) -> None:
        self.vhosts: dict[str, VirtualHost] = {default_vhost: VirtualHost(default_vhost)}
        self.users: dict[str, User] = {}
        self.loopback_users = frozenset(loopback_users)
        if default_user:
            self.users[default_user] = User(
                default_user,
                hash_password(default_pass),
                tags=["administrator"],
                permissions={default_vhost: Permission()},
            )

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
