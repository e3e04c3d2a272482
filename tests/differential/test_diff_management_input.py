"""What the management API answers to bodies a browser on another site, or a
careless client, sends, differential: hutch and RabbitMQ 3.10 give the same
status and body for a definitions import that is not JSON (415), RabbitMQ's
multipart upload (204), malformed JSON and a body over the size limit (400).
Where hutch goes further (415 on every route, not only definitions; 403 for a
cross-origin Origin), tests/test_management_hostile.py shows it and
docs/security.md says so."""
from __future__ import annotations

import json

import pytest

from helpers import unique
from http_api import Api

from .conftest import rabbitmq_management

pytestmark = pytest.mark.differential


@pytest.fixture
def both(api, rabbitmq_url):
    port, credentials = rabbitmq_management(rabbitmq_url)
    return api, Api(port, credentials)


def answers(both, method: str, path: str, raw: bytes, content_type: str | None) -> list:
    headers = {"Content-Type": content_type} if content_type else {}
    out = []
    for side in both:
        reply = getattr(side, method)(path, raw=raw, headers=headers)
        out.append((reply.status, reply.body if reply.status != 415 else None))
    return out


def test_a_definitions_import_that_is_not_json_is_415_on_both(both):
    name = unique("csrf")
    body = json.dumps({"users": [{"name": name, "password": "pw", "tags": "administrator"}]}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded"):
        hutch, rabbit = answers(both, "post", "/api/definitions", body, kind)
        assert hutch == rabbit == (415, None), kind
    for side in both:
        assert side.get("/api/users/" + name).status == 404


def test_a_multipart_upload_and_malformed_json(both):
    vhost = unique("upload")
    form = ("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.json\"\r\n\r\n%s\r\n--b--\r\n"
            % json.dumps({"vhosts": [{"name": vhost}]})).encode()
    try:
        hutch, rabbit = answers(both, "post", "/api/definitions", form, "multipart/form-data; boundary=b")
        assert hutch == rabbit == (204, None)
        assert [side.get("/api/vhosts/" + vhost).status for side in both] == [200, 200]
    finally:
        for side in both:
            side.delete("/api/vhosts/" + vhost)
    for raw in (b"{", b"[1, 2", b"\"text\""):
        hutch, rabbit = answers(both, "post", "/api/definitions", raw, "application/json")
        assert hutch == rabbit, raw


def test_a_body_over_the_limit_is_refused_alike(both):
    """Over 10,000,000 bytes: RabbitMQ's own limit is that (management.http.max_body_size)."""
    raw = b"[" + b" " * 10_000_001 + b"]"
    hutch, rabbit = answers(both, "post", "/api/definitions", raw, "application/json")
    assert hutch == rabbit == (400, {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"})
