"""A small client for the management HTTP API (stdlib urllib, JSON in and out).

Every path segment is percent-encoded on its own, so the default vhost "/" and
names with spaces or slashes address the right object. Failures become the
exceptions below; `main` turns them into rabbitmqctl-style messages.
"""
from __future__ import annotations

import base64
import html
import json
import socket
import urllib.error
import urllib.parse
import urllib.request


class Unreachable(Exception):
    """No HTTP answer from the API (refused, unresolvable, not HTTP)."""


class TimedOut(Exception):
    """The API did not answer within the timeout."""


class Refused(Exception):
    """The API rejected our credentials: a 401 that challenges them again
    (WWW-Authenticate), as RabbitMQ's "Login failed" does."""


class NotAuthorised(Exception):
    """The credentials are good but the user may not do this: a 403, or
    RabbitMQ's 401 "not_authorised" answered without a challenge (its
    management API uses 401 for both; only a failed login challenges)."""


class ApiError(Exception):
    """The API answered with an error status; `reason` is its explanation."""

    def __init__(self, status: int, error: str, reason: str):
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason


def path(*segments: str) -> str:
    """`/api/` followed by the percent-encoded segments."""
    return "/api/" + "/".join(urllib.parse.quote(s, safe="") for s in segments)


class ManagementClient:
    __slots__ = ("url", "_authorization", "timeout")

    def __init__(self, url: str, username: str, password: str, timeout: float):
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._authorization = "Basic " + token
        self.timeout = timeout

    def get(self, api_path: str, query: dict | None = None):
        return self.request("GET", api_path, query=query)

    def put(self, api_path: str, body) -> None:
        self.request("PUT", api_path, body)

    def post(self, api_path: str, body):
        return self.request("POST", api_path, body)

    def delete(self, api_path: str, query: dict | None = None, headers: dict | None = None) -> None:
        self.request("DELETE", api_path, query=query, headers=headers)

    def request(self, method: str, api_path: str, body=None, query: dict | None = None,
                headers: dict | None = None):
        """The decoded JSON answer (None for an empty body)."""
        url = self.url + api_path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, method=method)
        request.add_header("Authorization", self._authorization)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, data, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (socket.timeout, TimeoutError)):
                raise TimedOut(str(exc.reason)) from None
            raise Unreachable(str(exc.reason)) from None
        except (TimeoutError, socket.timeout) as exc:
            raise TimedOut(str(exc)) from None
        except (OSError, ValueError) as exc:  # reset connections, non-HTTP peers, bad URLs
            raise Unreachable(str(exc) or type(exc).__name__) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(200, "bad_response", "the API answered something that is not JSON") from None
        except RecursionError:  # e.g. queue arguments nested thousands of levels deep
            raise ApiError(200, "bad_response", "the API answered JSON nested too deeply to read") from None


def _api_error(exc: urllib.error.HTTPError) -> Exception:
    try:
        payload = json.loads(exc.read() or b"{}")
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    error = str(payload.get("error", exc.reason))
    # RabbitMQ HTML-escapes the reason (`&lt;&lt;"a"&gt;&gt;` for <<"a">>)
    reason = html.unescape(str(payload.get("reason", error))).strip()
    if exc.code == 401 and exc.headers.get("WWW-Authenticate"):
        return Refused(reason)
    if exc.code in (401, 403):
        return NotAuthorised(reason)
    return ApiError(exc.code, error, reason)
