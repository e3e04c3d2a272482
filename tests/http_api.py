"""A small HTTP client for the management API tests (urllib, no extra
dependency): `call(port, method, path, body)` -> Reply(status, body, headers)
with the body parsed as JSON when it is JSON. Paths are given with their
segments already percent-encoded (`vhost_path` encodes one)."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote


@dataclass
class Reply:
    status: int
    body: object
    headers: dict


def segment(name: str) -> str:
    """One path segment, as RabbitMQ's API expects it (%2F for "/")."""
    return quote(name, safe="")


def call(port: int, method: str, path: str, body=None, auth=("guest", "guest"), headers=None,
         raw: bytes | None = None) -> Reply:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method, data=data)
    if auth is not None:
        token = base64.b64encode(("%s:%s" % auth).encode()).decode()
        request.add_header("Authorization", "Basic " + token)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return _reply(response.status, response.read(), response.headers)
    except urllib.error.HTTPError as error:
        return _reply(error.code, error.read(), error.headers)


def _reply(status: int, payload: bytes, headers) -> Reply:
    text = payload.decode("utf-8")
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = text
    return Reply(status, parsed, {k.lower(): v for k, v in headers.items()})


class Api:
    """Calls against one broker's HTTP port, as one user."""

    def __init__(self, port: int, auth=("guest", "guest")) -> None:
        self.port = port
        self.auth = auth

    def as_user(self, user: str, password: str) -> "Api":
        return Api(self.port, (user, password))

    def __getattr__(self, method: str):
        if method not in ("get", "put", "post", "delete"):
            raise AttributeError(method)
        return lambda path, body=None, **kw: call(self.port, method.upper(), path, body, self.auth, **kw)
