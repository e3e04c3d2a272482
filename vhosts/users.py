"""Users, password hashes and per-vhost permissions.

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


@dataclass
class Permission:
    """configure / write / read regular expressions for one user in one vhost."""

    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    def allows(self, kind: str, name: str) -> bool:
        return re.match(getattr(self, kind), name) is not None


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    permissions: dict[str, Permission] = field(default_factory=dict)

    def authenticate(self, password: str) -> bool:
        return check_password(password, self.password_hash)
