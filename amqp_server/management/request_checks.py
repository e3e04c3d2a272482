"""What the management API checks on a request before any handler runs: where
it comes from (`Origin`), what its body is (`Content-Type`), and how large and
how slow that body may be.

Why: a browser that has cached an administrator's Basic credentials sends them
with any request another site makes it send. Such a site can only make
"simple" requests without a CORS preflight (which hutch never grants): a
GET/HEAD/POST whose body is `text/plain`, `application/x-www-form-urlencoded`
or `multipart/form-data`. So:

- a request whose `Origin` names another origin than the `Host` it was sent to
  is refused (403) whatever its method: a browser adds `Origin` to every
  cross-origin request it sends, and the UI's own calls are same-origin;
- a non-empty body must be `application/json` (415), except the
  `multipart/form-data` definitions upload RabbitMQ's UI sends (its `file`
  part is the JSON). Requests without a body carry no content type to check.

The body is read with RabbitMQ's size limit (`management.http.max_body_size`,
10,000,000 bytes) and answered with RabbitMQ's 400 beyond it, without buffering
more than the limit; a client sending it more slowly than one chunk per
`request_timeout` seconds is cut off (408). The request head itself must
arrive within `request_timeout` seconds of the connection or of the previous
answer (aiohttp's keep-alive timer, set by the listener), as cowboy's
`request_timeout` does in RabbitMQ.
"""
from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from aiohttp import web

from amqp_server.management.errors import ApiError

DEFAULT_PORTS = {"http": 80, "https": 443}
JSON = "application/json"
MULTIPART = "multipart/form-data"
TOO_LARGE = "Exceeded HTTP request body size limit"  # RabbitMQ's reason


def cross_origin(request: web.Request) -> str | None:
    """None when the request has no `Origin` or one naming the origin it was
    sent to (scheme aside: a TLS-terminating proxy may stand in between; a
    `Host` without a port is the scheme's default port), else the reason it
    is refused."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    host_header = request.headers.get("Host", "")
    try:
        url, host = urlsplit(origin), urlsplit("//" + host_header)
        same = (url.scheme in DEFAULT_PORTS and url.hostname is not None and url.hostname == host.hostname
                and (url.port or DEFAULT_PORTS[url.scheme]) == (host.port or DEFAULT_PORTS[url.scheme]))
    except ValueError:  # a port out of range or not a number
        same = False
    if same:
        return None
    return "cross-origin request refused: Origin %s is not the origin of Host %s" % (origin, host_header or "(none)")


def check_content_type(request: web.Request, body: bytes, multipart_allowed: bool) -> None:
    """415 unless an empty body or a JSON one (or a multipart upload where the
    route takes one)."""
    if not body:
        return
    kind = request.content_type.lower() if "Content-Type" in request.headers else ""
    if kind == JSON or (multipart_allowed and kind == MULTIPART):
        return
    raise ApiError(415, "unsupported_media_type",
                   "the body must be %s, not %s" % (JSON, kind or "without a Content-Type"))


async def read_body(request: web.Request, limit: int, idle_timeout: float) -> bytes:
    """The whole body, refused past `limit` bytes (from `Content-Length` before
    reading anything, else as it arrives) or when no chunk comes for
    `idle_timeout` seconds."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(400, "bad_request", TOO_LARGE)
    chunks, size = [], 0
    while True:
        try:
            chunk = await asyncio.wait_for(request.content.readany(), idle_timeout)
        except TimeoutError:
            raise ApiError(408, "request_timeout", "the request body did not arrive within %g s" % idle_timeout) from None
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ApiError(400, "bad_request", TOO_LARGE)
        chunks.append(chunk)
