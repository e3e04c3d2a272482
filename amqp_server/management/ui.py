"""The management web UI: static files (`static/`, shipped as package data)
served beside the API by the same listener, and the security headers every
answer of that listener carries.

The UI is plain JavaScript modules run by the browser; nothing here renders
HTML. It talks to the API with the same authorised calls as any client.
`GET /` answers `static/index.html`; `/js/...`, `/css/...` and `/vendor/...`
answer the files under `static/` (aiohttp's static route refuses paths that
leave the directory). The Content-Security-Policy allows scripts, styles,
images and requests from this origin only, so a name shown by mistake as
HTML could not run script or load anything from another host.
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).with_name("static")

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _index(_request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html")


async def _secure(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
    if not request.path.startswith("/api/"):
        # revalidated on each load (a 304 when unchanged), so an upgraded broker's UI is never stale
        response.headers.setdefault("Cache-Control", "no-cache")


def add_to(app: web.Application) -> None:
    """Routes for the UI's files (before the API's catch-all route) and the
    headers on every response of `app`."""
    app.router.add_get("/", _index)
    for folder in ("js", "css", "vendor"):
        app.router.add_static("/%s/" % folder, STATIC / folder)
    app.on_response_prepare.append(_secure)
