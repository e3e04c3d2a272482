"""Users, password hashes, per-vhost permissions, topic permissions, limits.

Permission patterns are matched as RabbitMQ's internal backend does
(`re:run`): a *search* anywhere in the name, not an anchored match, and an
empty pattern means "^$" (nothing but the empty name). The default exchange
is named "amq.default" for matching and in error texts (see vhosts.access).

Password hashes use RabbitMQ's default scheme (rabbit_password_hashing_sha256):
base64(salt ++ sha256(salt ++ password)) with a 4-byte random salt, so hashes
exported from RabbitMQ verify here and the other way round.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field

from vhosts.errors import erl_term


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    salt = raw[:4]
    return hmac.compare_digest(hash_password(password, salt), password_hash)


def compile_pattern(pattern: str) -> re.Pattern:
    """A permission pattern as RabbitMQ reads it ("" matches only "")."""
    return re.compile(pattern or "^$")


def check_pattern(pattern: str) -> None:
    """Raise ValueError unless `pattern` compiles (set_permissions refuses it)."""
    try:
        compile_pattern(pattern)
    except re.error as exc:
        raise ValueError("invalid regular expression '%s': %s" % (pattern, exc)) from None


@dataclass
class Permission:
    """configure / write / read regular expressions for one user in one vhost."""

    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def allows(self, kind: str, name: str) -> bool:
        """`kind` is "configure", "write" or "read"."""
        compiled = self._compiled.get(kind)
        if compiled is None:
            compiled = self._compiled[kind] = compile_pattern(getattr(self, kind))
        return compiled.search(name) is not None


@dataclass
class TopicPermission:
    """write / read patterns on the routing keys of one topic exchange, for one
    user in one vhost. Before matching, "{username}" and "{vhost}" (and
    "{client_id}" where the front end knows one, as for MQTT) are replaced
    by their values, as RabbitMQ expands them."""

    exchange: str
    write: str = ".*"
    read: str = ".*"

    def allows(self, kind: str, routing_key: str, variables: dict[str, str]) -> bool:
        pattern = getattr(self, kind) or "^$"
        for name, value in variables.items():
            pattern = pattern.replace("{%s}" % name, value)
        try:
            return re.search(pattern, routing_key) is not None
        except re.error:  # an expanded value broke the pattern: refuse, as a failed match
            return False


# Keys of user and vhost limits, as rabbitmqctl set_user_limits / set_vhost_limits take them.
USER_LIMITS = ("max-connections", "max-channels")
VHOST_LIMITS = ("max-connections", "max-queues")


def check_limits(limits: dict, known: tuple) -> dict:
    """Validated limits (a negative value means no limit); raise ValueError
    with rabbitmqctl's words for an unknown key or a non-integer value."""
    unknown = [(key, value) for key, value in limits.items() if key not in known]
    if unknown:
        raise ValueError("Unrecognised terms [%s] in limits"
                         % ",".join("{%s,%s}" % (erl_term(k), erl_term(v)) for k, v in unknown))
    for key, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("%s should be a number, actually was %s" % (key, erl_term(value)))
    return dict(limits)


def limit_reached(limits: dict, key: str, current: int) -> int | None:
    """The limit `key` when `current` already reaches it, else None."""
    limit = limits.get(key)
    if limit is None or limit < 0 or current < limit:
        return None
    return limit


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permission] = field(default_factory=dict)
    # (vhost, exchange) -> TopicPermission
    topic_permissions: dict[tuple, TopicPermission] = field(default_factory=dict)
    limits: dict = field(default_factory=dict)

    def authenticate(self, password: str) -> bool:
        return check_password(password, self.password_hash)
