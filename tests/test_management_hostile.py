"""The management API against requests a browser on another site, or a hostile
client, can send (amqp_server/management/request_checks.py, docs/security.md):
non-JSON bodies (415), cross-origin `Origin` (403), RabbitMQ's multipart
definitions upload (accepted), bodies over RabbitMQ's size limit (400 before
the body is buffered), malformed and deeply nested JSON (400), and clients
that send their request one byte at a time or never finish it (cut off after
`request_timeout`). Afterwards the broker still serves, without a traceback,
and its file descriptors and memory settle."""
from __future__ import annotations

import base64
import json
import socket
import time

import pytest

from fuzz_session import broker_resources
from helpers import assert_serves, unique, wait_for
from http_api import Api, call, segment

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
TOO_LARGE = {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"}


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


def admin_definitions(name: str) -> bytes:
    return json.dumps({"users": [{"name": name, "password": "pw", "tags": "administrator"}]}).encode()


def test_a_body_that_is_not_json_is_refused_and_changes_nothing(api):
    """The attack of issue 28: a form on another site posts definitions as
    text/plain with the browser's cached administrator credentials."""
    name = unique("csrf")
    for kind in ("text/plain", "application/x-www-form-urlencoded", "text/plain; charset=utf-8"):
        reply = api.post("/api/definitions", raw=admin_definitions(name), headers={"Content-Type": kind})
        assert reply.status == 415, (kind, reply)
        assert reply.body["error"] == "unsupported_media_type" and kind.split(";")[0] in reply.body["reason"]
    # the same on every route that takes a body, not only definitions
    reply = api.put("/api/users/" + name, raw=b'{"password": "pw", "tags": "administrator"}',
                    headers={"Content-Type": "text/plain"})
    assert reply.status == 415
    assert api.get("/api/users/" + name).status == 404
    # a JSON body as JSON works, whatever the letter case and parameters
    vhost = unique("json")
    assert api.put("/api/vhosts/" + vhost, raw=b"{}", headers={"Content-Type": "Application/JSON; charset=utf-8"}
                   ).status == 201
    # no body, no content type to check: what curl -X PUT sends
    bare = unique("bare")
    assert call(api.port, "PUT", "/api/vhosts/" + bare, raw=b"", headers={"Content-Type": "text/plain"}).status == 201
    for made in (vhost, bare):
        assert api.delete("/api/vhosts/" + made).status == 204


def test_a_body_without_a_content_type_is_refused(broker):
    """What fetch() sends for a Blob without a type: no Content-Type at all."""
    name = unique("notype")
    body = admin_definitions(name)
    with socket.create_connection(("127.0.0.1", broker.ports["HTTP"]), timeout=10) as sock:
        sock.sendall(b"POST /api/definitions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: %s\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (GUEST.encode(), len(body), body))
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 415")
    assert b"without a Content-Type" in answer
    assert Api(broker.ports["HTTP"]).get("/api/users/" + name).status == 404


def test_rabbitmq_s_multipart_definitions_upload_is_accepted_there_only(api):
    vhost = unique("upload")
    boundary = "hutchboundary"
    form = ("--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"defs.json\"\r\n"
            "Content-Type: application/json\r\n\r\n{defs}\r\n--{b}--\r\n").format(
        b=boundary, defs=json.dumps({"vhosts": [{"name": vhost}]})).encode()
    headers = {"Content-Type": "multipart/form-data; boundary=" + boundary}
    assert api.post("/api/definitions", raw=form, headers=headers).status == 204
    assert api.get("/api/vhosts/" + vhost).status == 200
    assert api.delete("/api/vhosts/" + vhost).status == 204
    # a form without the file part is RabbitMQ's 400
    empty = ("--{b}\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nx\r\n--{b}--\r\n").format(b=boundary)
    assert api.post("/api/definitions", raw=empty.encode(), headers=headers).body == {
        "error": "bad_request", "reason": "failed_to_parse_json"}
    # elsewhere a form is not JSON
    assert api.put("/api/vhosts/" + vhost, raw=form, headers=headers).status == 415
    assert api.get("/api/vhosts/" + vhost).status == 404


def test_a_cross_origin_request_is_refused_before_it_does_anything(api):
    port = api.port
    name = unique("origin")
    for origin in ("http://evil.example", "null", "http://127.0.0.1:%d" % (port + 1), "https://127.0.0.1",
                   "not a url"):
        reply = api.post("/api/definitions", raw=admin_definitions(name), headers={"Origin": origin})
        assert reply.status == 403, origin
        assert reply.body["error"] == "forbidden" and origin in reply.body["reason"]
        assert api.get("/api/overview", headers={"Origin": origin}).status == 403
    assert api.get("/api/users/" + name).status == 404
    # the UI's own calls: same origin as the Host they were sent to
    same = api.post("/api/definitions", raw=admin_definitions(name), headers={"Origin": "http://127.0.0.1:%d" % port})
    assert same.status == 204
    assert api.delete("/api/users/" + name).status == 204


def test_the_origin_is_compared_with_the_host_the_request_was_sent_to(broker):
    """Behind a proxy the Host is the proxy's: a default port may be left out."""
    port = broker.ports["HTTP"]
    for host, origin, status in (("rabbit.example", "https://rabbit.example", 200),
                                 ("rabbit.example", "http://rabbit.example", 200),
                                 ("rabbit.example:8443", "https://rabbit.example:8443", 200),
                                 ("rabbit.example", "https://rabbit.example:8443", 403),
                                 ("rabbit.example", "https://other.example", 403)):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /api/whoami HTTP/1.1\r\nHost: %s\r\nOrigin: %s\r\nAuthorization: %s\r\n"
                         b"Connection: close\r\n\r\n" % (host.encode(), origin.encode(), GUEST.encode()))
            assert read_all(sock).startswith(b"HTTP/1.1 %d" % status), (host, origin)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer (head and Content-Length body), without waiting for
    the connection to close: the broker reads and discards what the client
    still sends for a while (aiohttp's lingering close) before closing."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_body_over_rabbitmq_s_limit_is_refused_without_being_buffered(broker):
    port, pid = broker.ports["HTTP"], broker.process.pid
    _fds, rss_before = broker_resources(pid)
    # announced: refused from the headers, before a byte of the body is sent
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /api/definitions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: %s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 10000001\r\n\r\n" % GUEST.encode())
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == TOO_LARGE
    # chunked, so the size is known only as it arrives: cut off past the limit
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"PUT /api/vhosts/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: %s\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     % (unique("big").encode(), GUEST.encode()))
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
        try:
            for _ in range(40):  # 40 MiB offered
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker answered and closed before all of it was sent
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400") and b"Exceeded HTTP request body size limit" in answer
    # just under the limit is read (and then judged as JSON)
    reply = call(port, "PUT", "/api/vhosts/" + unique("near"), raw=b" " * (10_000_000 - 2) + b"[]")
    assert reply.status == 400 and reply.body == {"error": "bad_request", "reason": "not_json"}
    assert broker_resources(pid)[1] < rss_before + 60 * 1024  # KiB: one body at most, not 40 MiB
    assert_serves(broker.port)


@pytest.mark.parametrize("body", [
    b"{", b"{\"a\": }", b"\xff\xfe", b"[1, 2", b"\"just a string\"", b"{\"a\": NaN" + b"}" * 3,
    b"[" * 100_000 + b"]" * 100_000, b"{\"a\":" * 50_000 + b"1" + b"}" * 50_000,
], ids=["open", "missing value", "not utf-8", "open list", "string", "bad literal", "deep lists", "deep objects"])
def test_malformed_and_deeply_nested_json_is_a_400(broker, api, body):
    logged = len(broker.log_lines)  # the session broker's log before this test (others log their own)
    reply = api.put("/api/vhosts/" + unique("bad"), raw=body)
    assert reply.status == 400 and reply.body == {"error": "bad_request", "reason": "not_json"}
    reply = api.post("/api/definitions", raw=body)
    assert reply.status == 400 and reply.body == {"error": "bad_request", "reason": "failed_to_parse_json"}
    assert "Traceback" not in "".join(broker.log_lines[logged:])
    assert api.get("/api/overview").status == 200


@pytest.fixture
def slow_broker(start_broker):
    """A broker whose HTTP clients (API and metrics) have 1 s to send a request head."""
    return start_broker("--management-request-timeout", "1", expect=("AMQP", "HTTP", "PROMETHEUS"))


def test_a_request_head_sent_one_byte_at_a_time_is_cut_off(slow_broker):
    """Slowloris: bytes keep coming, the head never completes; as cowboy's
    request_timeout does, the connection is closed when the time is up,
    however lively it looks."""
    port, pid = slow_broker.ports["HTTP"], slow_broker.process.pid
    fds_before, _rss = broker_resources(pid)
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(50)]
    head = b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    started = time.monotonic()
    closed = set()
    step = 0
    while len(closed) < len(sockets):
        assert time.monotonic() - started < 30, "%d of 50 still open" % (len(sockets) - len(closed))
        for index, sock in enumerate(sockets):
            if index in closed:
                continue
            try:
                sock.sendall(head[step:step + 1] or b"a")
                sock.setblocking(False)
                if sock.recv(1) == b"":
                    closed.add(index)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(index)
            finally:
                sock.setblocking(True)
        step += 1
        time.sleep(0.05)  # pacing the slow client itself, not waiting for the broker
    assert time.monotonic() - started >= 1.0
    for sock in sockets:
        sock.close()
    assert wait_for(lambda: broker_resources(pid)[0] <= fds_before + 2, timeout=20, what="the fds to settle")
    assert call(port, "GET", "/api/overview").status == 200
    assert_serves(slow_broker.port)


def test_a_request_that_never_finishes_its_head_or_body_is_cut_off(slow_broker):
    port = slow_broker.ports["HTTP"]
    with socket.create_connection(("127.0.0.1", port), timeout=20) as silent, \
            socket.create_connection(("127.0.0.1", port), timeout=20) as half_head, \
            socket.create_connection(("127.0.0.1", slow_broker.ports["PROMETHEUS"]), timeout=20) as metrics, \
            socket.create_connection(("127.0.0.1", port), timeout=20) as half_body:
        half_head.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        metrics.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        half_body.sendall(b"PUT /api/vhosts/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: %s\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
                          % (unique("slow").encode(), GUEST.encode()))
        assert read_all(silent) == b""
        assert read_all(half_head) == b""
        assert read_all(metrics) == b""
        answer = read_all(half_body)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
    assert "Traceback" not in slow_broker.log
    assert call(port, "GET", "/api/overview").status == 200


@pytest.mark.parametrize("head", [
    b"GET /api/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(500)) + b"\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) + b"\r\n\r\n",  # a TLS hello
    b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
    b"POST /api/definitions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["long request line", "long header", "500 headers", "tls hello", "negative length", "bad chunk"])
def test_a_head_beyond_the_parser_s_limits_is_a_4xx(broker, head):
    """aiohttp's bounds (request line and header fields of 8190 bytes, 128
    headers) keep a head's memory small; what breaks them is answered 4xx."""
    logged = len(broker.log_lines)  # the session broker's log before this test (others log their own)
    with socket.create_connection(("127.0.0.1", broker.ports["HTTP"]), timeout=10) as sock:
        sock.sendall(head)
        answer = read_all(sock)
    assert answer[:10] in (b"HTTP/1.1 4", b"HTTP/1.0 4") and answer[9:10] == b"4", answer[:200]
    assert "Traceback" not in "".join(broker.log_lines[logged:])
    assert call(broker.ports["HTTP"], "GET", "/api/overview").status == 200
