"""Security from the outside: names cannot reach outside the data directory,
refused logins are logged (user and peer, never the password) and slowed,
and no secret reaches the log even at debug level."""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAuthenticationError

from amqp_raw import TIMEOUT, RawClient, plain_response, start_ok_frame
from amqp_server.login_throttle import MAX_ENTRIES, LoginThrottle
from helpers import assert_serves, connect, unique, wait_for
from http_api import Api, call, segment
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
