"""Security from the outside: names cannot reach outside the data directory,
refused logins (AMQP and management HTTP) are logged (user and peer, never
the password) and slowed by one shared throttle,
and no secret reaches the log even at debug level."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAuthenticationError

from amqp_raw import TIMEOUT, RawClient, plain_response, start_ok_frame
from amqp_server.shared.login_throttle import MAX_ENTRIES, LoginThrottle
from helpers import assert_serves, connect, unique, wait_for
from http_api import Api, call, segment
from mqtt_raw import RawMQTT
from test_tls import client_context, pki, round_trip, tls_broker  # noqa: F401 - pki is a fixture

HOSTILE_NAMES = ["../../x", "../" * 40 + "etc/passwd", "/etc/passwd", "a/../../b", "..", ".", "nul\x00byte",
                 "x" * 255, "é/../" * 40]


def files_under(root: Path) -> list[Path]:
    return [Path(base) / name for base, dirs, files in os.walk(root) for name in dirs + files]


def test_hostile_names_stay_inside_the_data_directory(start_broker, tmp_path):
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = Api(broker.ports["HTTP"])
    outside_before = set(files_under(broker.data_dir.parent)) - set(files_under(broker.data_dir))
    vhosts = []
    for name in HOSTILE_NAMES[:4] + HOSTILE_NAMES[7:]:
        vhost = name.replace("\x00", "")
        assert api.put("/api/vhosts/" + segment(vhost)).status in (201, 204), vhost
        assert api.put("/api/permissions/%s/guest" % segment(vhost),
                       {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
        vhosts.append(vhost)
    connection = connect(broker.port)
    channel = connection.channel()
    channel.confirm_delivery()
    for name in HOSTILE_NAMES:
        channel.queue_declare(name, durable=True)
        channel.exchange_declare("x" + name[:254], "fanout", durable=True)
        channel.basic_publish("", name, b"persistent " + name.encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    for vhost in vhosts:
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, vhost)) as other:
            other_channel = other.channel()
            other_channel.confirm_delivery()
            other_channel.queue_declare(vhost[:255], durable=True)
            other_channel.basic_publish("", vhost[:255], b"m", pika.BasicProperties(delivery_mode=2))
    broker.stop()  # everything flushed and closed

    data = broker.data_dir.resolve()
    inside = files_under(data)
    assert inside, "the broker wrote nothing at all"
    for path in inside:
        assert path.resolve().is_relative_to(data), path
        assert ".." not in path.relative_to(data).parts and "passwd" not in str(path), path
    outside_after = set(files_under(broker.data_dir.parent)) - set(inside) - {broker.data_dir}
    assert outside_after == outside_before - {broker.data_dir}


# -- refused logins ---------------------------------------------------------------------------------


def test_a_refused_login_is_logged_with_user_and_peer_never_the_password(fresh_broker):
    password = unique("Secret-")
    with pytest.raises(ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", fresh_broker.port, credentials=pika.PlainCredentials("guest", password)))
    assert wait_for(lambda: "login refused for user 'guest' from ('127.0.0.1'" in fresh_broker.log)
    assert password not in fresh_broker.log


def test_a_refused_login_waits_without_blocking_the_broker(start_broker):
    """With a long refusal delay, the refused client hears nothing while
    others are served; it may still close its side."""
    broker = start_broker("--auth-failure-delay", "600", "--auth-failure-delay-max", "600")
    with RawClient(broker.port) as client:
        client.send(b"AMQP\x00\x00\x09\x01")
        client.read_frame()  # Connection.Start
        client.send(start_ok_frame("PLAIN", plain_response("guest", "wrong"),
                                   {"capabilities": {"authentication_failure_close": True}}))
        assert_serves(broker.port)  # the event loop is not blocked by the wait
        assert client.collect(0.3)[-1] == TIMEOUT  # and the refusal is still pending
    assert_serves(broker.port)


def test_a_refused_login_is_answered_403_after_the_delay(start_broker):
    broker = start_broker("--auth-failure-delay", "0.01")
    with pytest.raises(ProbableAuthenticationError) as refused:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, credentials=pika.PlainCredentials("guest", "wrong")))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(refused.value)


def test_login_throttle_doubles_per_failure_up_to_the_cap_and_forgets_on_success():
    throttle = LoginThrottle(0.1, 1.0)
    assert [throttle.failed("10.0.0.1", "bob") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert throttle.failed("10.0.0.2", "bob") == 0.1  # per peer address
    assert throttle.failed("10.0.0.1", "alice") == 0.1  # and per user
    throttle.succeeded("10.0.0.1", "bob")
    assert throttle.failed("10.0.0.1", "bob") == 0.1


def test_login_throttle_memory_is_bounded():
    throttle = LoginThrottle(0.1, 1.0)
    for index in range(MAX_ENTRIES + 500):
        throttle.failed("10.0.0.1", "user%d" % index)
    assert len(throttle._failures) == MAX_ENTRIES
    assert throttle.failed("10.0.0.1", "user%d" % (MAX_ENTRIES + 499)) == 0.2  # the newest are kept


def amqp_login_refused(port: int, user: str, password: str) -> None:
    with pytest.raises(ProbableAuthenticationError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials(user, password)))


def http_login_refused(port: int, user: str, password: str) -> None:
    reply = call(port, "GET", "/api/overview", auth=(user, password))
    assert (reply.status, reply.body) == (401, {"error": "not_authorized", "reason": "Login failed"})
    assert reply.headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'


def mqtt_login_refused(port: int, user: str, password: str) -> None:
    with RawMQTT(port, timeout=30) as raw:
        assert raw.connect(unique("c"), username=user, password=password) == b"\x00\x04"
        assert raw.closed_by_server()


def seconds_taken(action, *args) -> float:
    started = time.monotonic()
    action(*args)
    return time.monotonic() - started


def test_refused_http_logins_are_answered_after_growing_delays(start_broker):
    broker = start_broker("--auth-failure-delay", "0.2", "--auth-failure-delay-max", "0.8", expect=("AMQP", "HTTP"))
    port = broker.ports["HTTP"]
    password = unique("Wrong-Http-")
    taken = [seconds_taken(http_login_refused, port, "guest", password) for _ in range(5)]
    for failure, seconds in enumerate(taken):
        assert seconds >= min(0.2 * 2 ** failure, 0.8), taken  # 0.2, 0.4, 0.8, then the cap
    assert call(port, "GET", "/api/overview").status == 200  # the right password still gets in
    assert wait_for(lambda: "HTTP login refused for user 'guest' from 127.0.0.1" in broker.log)
    assert password not in broker.log
    assert base64.b64encode(("guest:" + password).encode()).decode() not in broker.log


def test_amqp_and_http_login_failures_count_together(start_broker):
    """One table per broker: a user's failures from one address over either
    protocol lengthen the next refusal over the other."""
    broker = start_broker("--auth-failure-delay", "0.2", "--auth-failure-delay-max", "60", expect=("AMQP", "HTTP"))
    user = unique("user")  # unknown users are throttled the same way
    amqp_login_refused(broker.port, user, "x")  # 0.2 s
    amqp_login_refused(broker.port, user, "x")  # 0.4 s
    assert seconds_taken(http_login_refused, broker.ports["HTTP"], user, "x") >= 0.8
    assert seconds_taken(amqp_login_refused, broker.port, user, "x") >= 1.6
    assert seconds_taken(http_login_refused, broker.ports["HTTP"], unique("other"), "x") >= 0.2


def test_mqtt_login_failures_are_slowed_and_count_with_amqp(start_broker):
    """MQTT refusals (CONNACK 0x04) wait like AMQP and HTTP ones, in the same
    table; meanwhile other MQTT clients are served."""
    broker = start_broker("--auth-failure-delay", "0.5", "--auth-failure-delay-max", "60",
                          expect=("AMQP", "MQTT"))
    port, user, password = broker.ports["MQTT"], unique("user"), unique("Wrong-Mqtt-")
    assert seconds_taken(mqtt_login_refused, port, user, password) >= 0.5
    amqp_login_refused(broker.port, user, "x")  # 1 s
    refused = threading.Thread(target=mqtt_login_refused, args=(port, user, password))
    started = time.monotonic()
    refused.start()
    with RawMQTT(port) as other:  # served while the refusal waits its 2 s
        assert other.connect(unique("ok")) == b"\x00\x00"
        assert refused.is_alive()
    refused.join()
    assert time.monotonic() - started >= 2
    assert wait_for(lambda: "MQTT login refused for user '%s'" % user in broker.log)
    assert password not in broker.log


def test_a_successful_http_login_forgets_the_failures(start_broker):
    """After a success, the user's next refusal waits the first delay again:
    it is answered before a fresh user's second refusal started with it
    (remembered failures would make it the later one)."""
    broker = start_broker("--auth-failure-delay", "0.5", "--auth-failure-delay-max", "60", expect=("AMQP", "HTTP"))
    port = broker.ports["HTTP"]
    http_login_refused(port, "guest", "x")  # 0.5 s
    http_login_refused(port, "guest", "x")  # 1 s; a third would wait 2 s
    assert call(port, "GET", "/api/whoami").body["name"] == "guest"
    answered = []

    def refused(user: str, times: int) -> None:
        for _ in range(times):
            http_login_refused(port, user, "x")
        answered.append(user)

    threads = [threading.Thread(target=refused, args=("guest", 1)),
               threading.Thread(target=refused, args=(unique("fresh"), 2))]  # 0.5 + 1 s
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answered[0] == "guest" and len(answered) == 2


def pending_http_request(port: int, user: str, password: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    token = base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
    sock.sendall(("GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Basic %s\r\n"
                  "Connection: close\r\n\r\n" % token).encode())
    return sock


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_refused_http_login_waits_without_blocking_the_broker(start_broker):
    """With a long refusal delay, the refused request hears nothing while
    other HTTP and AMQP clients are served; stopping the broker answers it
    at once instead of waiting the delay out."""
    broker = start_broker("--auth-failure-delay", "600", "--auth-failure-delay-max", "600", expect=("AMQP", "HTTP"))
    port = broker.ports["HTTP"]
    with pending_http_request(port, "guest", "wrong") as pending:
        assert wait_for(lambda: "HTTP login refused for user 'guest'" in broker.log)
        assert call(port, "GET", "/api/whoami").status == 200
        assert_serves(broker.port)
        pending.settimeout(0.3)
        with pytest.raises(socket.timeout):
            pending.recv(1)  # the refusal is still pending
        broker.process.terminate()
        head, _, body = read_until_closed(pending, 60).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401")
    assert json.loads(body) == {"error": "not_authorized", "reason": "Login failed"}
    assert broker.process.wait(60) == 0
    assert (broker.data_dir / "clean_shutdown").exists()


# -- no secret in the log ---------------------------------------------------------------------------


def sha256_hash(password: str, salt: bytes = b"salt") -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_no_secret_in_a_debug_log(start_broker, pki):  # noqa: F811 - pki is the fixture imported above
    broker = tls_broker(start_broker, pki, "--log-level", "debug", "--default-pass", "Default-Pass-1f3e")
    broker_http = start_broker("--log-level", "debug", expect=("AMQP", "HTTP"))
    secrets = ["Default-Pass-1f3e"]

    def login(port: int, user: str, password: str, ok: bool) -> None:
        params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials(user, password))
        if ok:
            pika.BlockingConnection(params).close()
        else:
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                pika.BlockingConnection(params)

    login(broker.port, "guest", "Default-Pass-1f3e", True)
    bad = unique("Wrong-Pass-")
    secrets.append(bad)
    login(broker.port, "guest", bad, False)
    tls = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.ports["AMQPS"], credentials=pika.PlainCredentials("guest", "Default-Pass-1f3e"),
        ssl_options=pika.SSLOptions(client_context(pki), server_hostname="localhost")))
    round_trip(tls)

    api_port = broker_http.ports["HTTP"]
    api = Api(api_port)
    user_password, imported_password = unique("User-Pass-"), unique("Imported-Pass-")
    imported_hash = sha256_hash(imported_password)
    secrets += [user_password, imported_password, imported_hash]
    assert api.put("/api/users/alice", {"password": user_password, "tags": "management"}).status in (201, 204)
    secrets.append(api.get("/api/users/alice").body["password_hash"])
    assert api.post("/api/definitions", {"users": [{"name": "bob", "password_hash": imported_hash, "tags": "",
                                                    "hashing_algorithm": "rabbit_password_hashing_sha256"}],
                                         "permissions": [{"user": "bob", "vhost": "/", "configure": ".*",
                                                          "write": ".*", "read": ".*"}]}).status == 204
    assert call(api_port, "GET", "/api/overview", auth=("alice", user_password)).status == 200
    wrong_api = unique("Wrong-Api-Pass-")
    secrets.append(wrong_api)
    assert call(api_port, "GET", "/api/overview", auth=("alice", wrong_api)).status == 401
    assert call(api_port, "GET", "/api/overview", auth=("guest", wrong_api)).status == 401
    login(broker_http.port, "bob", imported_password, True)  # the imported hash works
    login(broker_http.port, "bob", unique("Bob-Wrong-"), False)
    exported = api.get("/api/definitions").body
    assert any(u["name"] == "bob" for u in exported["users"])

    for broker_process in (broker, broker_http):
        broker_process.stop()
        log = broker_process.log
        assert "DEBUG" in log or "debug" in log.lower()
        for secret in secrets:
            assert secret not in log, secret
            assert base64.b64encode(secret.encode()).decode() not in log
