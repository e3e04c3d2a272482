"""HTTP glue for the management API: one aiohttp handler for every path.

Theory of operation:
- Routing is ours, not aiohttp's: the raw path is split on "/" and each
  segment percent-decoded, so a vhost named "/" (sent as %2F) is one segment,
  as in RabbitMQ. `routes.ROUTES` maps a pattern to {method: (handler, tag)}.
- Authentication is HTTP basic against the broker's users (loopback-only
  users only from loopback); then the route's tag requirement
  (`access.require`). Every refusal is RabbitMQ's status and JSON body.
  A wrong password is answered after the broker's login-throttle delay
  (`amqp_server.shared.login_throttle`, the table AMQP logins use too), awaited
  so that other requests are served meanwhile, and cut short when the
  broker stops (its shutdown waits for every pending answer). A 401 carries
  the Basic challenge except to the web UI's own requests (`_challenge`).
- Before any of that a cross-origin `Origin` is refused; after it the body
  is read within RabbitMQ's size limit and must be JSON (`request_checks`:
  why, and what RabbitMQ does differently).
- A handler gets an `ApiRequest` and returns the JSON body (status 200),
  `CREATED`/`NO_CONTENT`, or raises `ApiError`; it may be a coroutine.
  Nothing a client sends may take the broker down: unexpected exceptions
  become 500 with a JSON body and a log line.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import decimal
import email.parser
import email.policy
import inspect
import ipaddress
import json
import logging
from urllib.parse import parse_qsl, unquote

from aiohttp import web
from vhosts.access import Access

from amqp_server.management import access, request_checks, ui
from amqp_server.management.errors import NOT_FOUND_BODY, ApiError

log = logging.getLogger("hutch.management")

REALM = 'Basic realm="RabbitMQ Management"'
_NO_BODY = object()
# routes that also take RabbitMQ's multipart/form-data definitions upload
MULTIPART_ROUTES = frozenset({("api", "definitions"), ("api", "definitions", "{vhost}")})


class Created:
    """201, with a Location header when the new object has an address
    (RabbitMQ's for a binding: its properties key)."""

    def __init__(self, location: str | None = None) -> None:
        self.location = location


CREATED = Created()
NO_CONTENT = object()


class ApiRequest:
    """What a handler needs to know about one request."""

    def __init__(self, node, user, method: str, params: dict, query: dict, headers, raw_body: bytes) -> None:
        self.node = node
        self.broker = node.broker
        self.user = user
        self.method = method
        self.params = params
        self.query = query
        self.headers = headers
        self._raw_body = raw_body
        self._body = _NO_BODY

    def body(self) -> dict:
        """The JSON object sent (in a multipart upload: its `file` part);
        RabbitMQ's 400 not_json otherwise (an empty body is an empty object,
        as RabbitMQ reads it). Nesting too deep for the parser is not JSON
        hutch takes either."""
        if self._body is _NO_BODY:
            raw = self._raw_body
            if self.headers.get("Content-Type", "").lower().startswith(request_checks.MULTIPART):
                raw = _form_part(self.headers["Content-Type"], raw, "file")
                if raw is None:
                    raise ApiError(400, "bad_request", "not_json")
            if not raw.strip():
                self._body = {}
            else:
                try:
                    self._body = json.loads(raw)
                except (ValueError, UnicodeDecodeError, RecursionError):
                    raise ApiError(400, "bad_request", "not_json") from None
            if not isinstance(self._body, dict):
                raise ApiError(400, "bad_request", "not_json")
        return self._body

    def vhost(self, name: str):
        """The named vhost if it exists and the user may use it (`access.vhost`)."""
        return access.vhost(self, name)

    def access(self, vhost) -> Access:
        """The user's permission checks in `vhost`, for the domain calls that
        take them: an HTTP operation is checked as its AMQP method is. One
        per request, so no grant outlives the request."""
        return Access(self.user, vhost.name)


def _form_part(content_type: str, body: bytes, name: str) -> bytes | None:
    """The content of the part called `name` of a multipart/form-data body
    (the stdlib's MIME parser), None when there is none."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart():
        return None
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == name:
            return part.get_payload(decode=True) or b""
    return None


def _json_default(value):
    """AMQP table values JSON cannot hold natively."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    raise TypeError("cannot encode %r" % type(value))


def json_response(status: int, body, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, default=_json_default, separators=(",", ":")),
                        content_type="application/json", headers=headers)


def split_path(raw_path: str) -> list[str]:
    """Percent-decoded segments of the path (without the query)."""
    path = raw_path.split("?", 1)[0]
    return [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []


def match(routes, segments: list[str]):
    """(pattern, methods table, params) of the first pattern matching, or
    (None, None, None)."""
    for pattern, methods in routes:
        if len(pattern) != len(segments):
            continue
        params = {}
        for want, got in zip(pattern, segments):
            if want.startswith("{"):
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            return pattern, methods, params
    return None, None, None


def _credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        username, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, ValueError):
        return None
    return (username, password) if sep else None


def _from_loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def _challenge(request: web.Request) -> dict:
    """The Basic challenge of a 401, except to the web UI's requests (marked
    X-Requested-With: XMLHttpRequest), so that the browser shows the UI's
    own "Login failed" and not its built-in password dialog."""
    if request.headers.get("X-Requested-With") == "XMLHttpRequest":
        return {}
    return {"WWW-Authenticate": REALM}


async def _refusal_delay(node, seconds: float) -> None:
    try:
        await asyncio.wait_for(node.stopping.wait(), seconds)
    except TimeoutError:
        pass


def make_handler(node, routes, max_body_size: int, request_timeout: float):
    async def handle(request: web.Request) -> web.StreamResponse:
        refusal = request_checks.cross_origin(request)
        if refusal is not None:
            return json_response(403, {"error": "forbidden", "reason": refusal})
        pattern, methods, params = match(routes, split_path(request.raw_path))
        if methods is None:
            return json_response(404, NOT_FOUND_BODY)
        method = "GET" if request.method == "HEAD" else request.method
        if method == "OPTIONS" or method not in methods:
            allowed = sorted(set(methods) | {"OPTIONS"} | ({"HEAD"} if "GET" in methods else set()))
            return web.Response(status=405 if method != "OPTIONS" else 200, headers={"Allow": ", ".join(allowed)})
        credentials = _credentials(request)
        if credentials is None:
            return web.Response(status=401, headers=_challenge(request))
        username, password = credentials
        host = request.remote or ""
        user = node.broker.authenticate(username, password, _from_loopback(request))
        if user is None:
            log.warning("HTTP login refused for user '%s' from %s", username, host)
            await _refusal_delay(node, node.logins.failed(host, username))
            return json_response(401, {"error": "not_authorized", "reason": "Login failed"}, _challenge(request))
        node.logins.succeeded(host, username)
        handler, tag = methods[method]
        try:
            access.require(user, tag)
            try:
                body = await request_checks.read_body(request, max_body_size, request_timeout)
            except ApiError as exc:  # the rest of the body is not read: the connection cannot go on
                response = json_response(exc.status, exc.body())
                response.force_close()
                return response
            request_checks.check_content_type(request, body, method == "POST" and pattern in MULTIPART_ROUTES)
            api_request = ApiRequest(node, user, method, params, dict(parse_qsl(request.query_string)),
                                     request.headers, body)
            result = handler(api_request)
            if inspect.isawaitable(result):
                result = await result
        except ApiError as exc:
            return json_response(exc.status, exc.body())
        except Exception:
            log.exception("management API: %s %s failed", request.method, request.raw_path)
            return json_response(500, {"error": "internal_server_error", "reason": "internal error"})
        if isinstance(result, Created):
            headers = {"Location": result.location} if result.location else None
            return web.Response(status=201, headers=headers)
        if result is NO_CONTENT:
            return web.Response(status=204)
        if isinstance(result, web.StreamResponse):
            return result
        return json_response(200, result)

    return handle


def make_app(node, routes, max_body_size: int, request_timeout: float) -> web.Application:
    """The API and the UI; bodies are read by `request_checks.read_body` within
    `max_body_size` bytes (aiohttp's own limit is not used)."""
    app = web.Application()
    ui.add_to(app)
    app.router.add_route("*", "/{tail:.*}", make_handler(node, routes, max_body_size, request_timeout))
    return app
