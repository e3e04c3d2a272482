"""Differential connection-level replies on raw sockets: the Connection.Close
(reply code, text, class and method) each broker sends for a malformed or
forbidden frame sequence, and how the socket ends, must be the same."""
from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlparse

import aiormq
import aiormq.exceptions
import pika
import pytest
from pamqp import body as pbody, commands, frame, header as pheader

from amqp_raw import raw_frame_bytes

from .diffkit import WAIT_SECONDS, RawClient

pytestmark = pytest.mark.differential


@pytest.fixture
def both(broker, rabbitmq_url):
    """both(script, **handshake) -> (hutch observation, RabbitMQ observation).
    `script(client)` runs after a successful handshake and returns what it saw."""
    rabbit = pika.URLParameters(rabbitmq_url)
    targets = [("127.0.0.1", broker.port, "guest", "guest"),
               (rabbit.host, rabbit.port, rabbit.credentials.username, rabbit.credentials.password)]

    def run(script, **handshake):
        seen = []
        for host, port, username, password in targets:
            client = RawClient(host, port)
            try:
                handshake.setdefault("username", username)
                if handshake.get("password") != "wrong":
                    handshake["password"] = password
                observed = client.handshake(**handshake)
                if observed == ["Connection.OpenOk"] and script is not None:
                    observed = script(client)
                seen.append(observed)
            finally:
                client.close()
            handshake.pop("username")
        return seen[0], seen[1]

    return run


def _publish(client, channel=1, **fields):
    client.send_frame(commands.Basic.Publish(exchange="amq.direct", routing_key="diff-nowhere", **fields), channel)


def _header(body_size, channel=1):
    return frame.marshal(pheader.ContentHeader(0, body_size, commands.Basic.Properties()), channel)


def _check(both, script, code, **handshake):
    hutch, rabbit = both(script, **handshake)
    assert hutch == rabbit
    if code is None:
        assert rabbit[-1] == "socket closed"
    else:
        close = rabbit[-1]
        assert close[0] == "Connection.Close" and close[2] == code, rabbit


def test_method_on_an_unopened_channel(both):
    def script(c):
        c.send_frame(commands.Basic.Qos(prefetch_count=1), 5)
        return c.observe_close()
    _check(both, script, 504)


def test_second_channel_open(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Channel.Open(), 1)
        return c.observe_close()
    _check(both, script, 504)


def test_content_header_without_publish(both):
    def script(c):
        c.open_channel(1)
        c.send(_header(3))
        return c.observe_close()
    _check(both, script, 505)


def test_content_body_without_header(both):
    def script(c):
        c.open_channel(1)
        _publish(c)
        c.send(frame.marshal(pbody.ContentBody(b"abc"), 1))
        return c.observe_close()
    _check(both, script, 505)


def test_method_where_a_content_body_is_due(both):
    def script(c):
        c.open_channel(1)
        _publish(c)
        c.send(_header(3))
        c.send_frame(commands.Basic.Qos(), 1)
        return c.observe_close()
    _check(both, script, 505)


def test_content_header_of_another_class(both):
    def script(c):
        c.open_channel(1)
        _publish(c)
        header = _header(3)
        c.send(header[:7] + b"\x00\x32" + header[9:])  # class 50 (queue)
        return c.observe_close()
    _check(both, script, 505)


@pytest.mark.parametrize("payload", [b"", b"abc", b"a" * 16, b"a" * 17 + b"tail"], ids=["empty", "short", "16", "long"])
def test_bad_frame_end(both, payload):
    def script(c):
        c.send(raw_frame_bytes(1, 0, payload, end=0))
        return c.observe_close()
    _check(both, script, 501)


def test_frame_larger_than_frame_max(both):
    def script(c):
        c.open_channel(1)
        _publish(c)
        c.send(_header(200000))
        c.send(raw_frame_bytes(3, 1, b"x" * (c.tune.frame_max + 100)))
        return c.observe_close()
    _check(both, script, 501)


def test_unknown_frame_type(both):
    def script(c):
        c.send(raw_frame_bytes(9, 0, b"abc"))
        return c.observe_close()
    _check(both, script, 501)


def test_heartbeat_on_a_channel(both):
    def script(c):
        c.open_channel(1)
        c.send(raw_frame_bytes(8, 1, b""))
        return c.observe_close()
    _check(both, script, 505)


def test_publish_immediate(both):
    def script(c):
        c.open_channel(1)
        _publish(c, immediate=True)
        c.send(_header(0))
        return c.observe_close()
    _check(both, script, 540)


def test_channel_method_on_channel_zero(both):
    def script(c):
        c.send_frame(commands.Basic.Qos(), 0)
        return c.observe_close()
    _check(both, script, 504)


def test_channel_open_on_channel_zero(both):
    def script(c):
        c.send_frame(commands.Channel.Open(), 0)
        return c.observe_close()
    _check(both, script, 504)


def test_connection_method_on_a_channel(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Connection.Open(virtual_host="/"), 1)
        return c.observe_close()
    _check(both, script, 503)


def test_channel_close_ok_on_an_open_channel(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Channel.CloseOk(), 1)
        return c.observe_close()
    _check(both, script, 503)


def test_frames_after_a_channel_error_are_ignored_until_close_ok(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="diff-surely-missing-queue", passive=True), 1)
        seen = []
        channel, close = c.read_frame()
        seen.append((type(close).__name__, channel, close.reply_code, close.reply_text, close.class_id,
                     close.method_id))
        c.send_frame(commands.Basic.Qos(prefetch_count=1), 1)  # discarded
        c.send_frame(commands.Channel.CloseOk(), 1)
        c.send_frame(commands.Channel.Open(), 1)
        channel, reply = c.read_frame()
        seen.append((type(reply).__name__, channel))
        return seen
    hutch, rabbit = both(script)
    assert hutch == rabbit
    assert rabbit[1] == ("OpenOk", 1)


def test_consumer_tag_reuse_on_a_channel(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)  # gone with the connection
        channel, declared = c.read_frame()
        seen = [type(declared).__name__]
        for _ in range(2):
            c.send_frame(commands.Basic.Consume(queue=declared.queue, consumer_tag="diff-tag"), 1)
        channel, consumed = c.read_frame()
        seen.append((type(consumed).__name__, consumed.consumer_tag))
        return seen + c.observe_close()
    _check(both, script, 530)


def test_login_refused_with_authentication_failure_close(both):
    _check(both, None, 403, password="wrong")


def test_login_refused_without_the_capability_just_closes(both):
    _check(both, None, None, password="wrong", capabilities={})


def test_unknown_vhost(both):
    _check(both, None, 530, vhost="diff-no-such-vhost")


def test_client_close_gets_close_ok(both):
    def script(c):
        c.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
        channel, reply = c.read_frame()
        return [type(reply).__name__, channel]
    hutch, rabbit = both(script)
    assert hutch == rabbit == ["CloseOk", 0]


@pytest.mark.parametrize("greeting", [b"GET / HTTP/1.1\r\n\r\n", b"AMQP\x00\x00\x09\x02", b"AMQP\x00\x00\x0a\x00",
                                      b"XMQP\x00\x00\x09\x01"], ids=["http", "0-9-2", "1-0", "xmqp"])
def test_wrong_protocol_header_gets_ours(broker, rabbitmq_url, greeting):
    rabbit = pika.URLParameters(rabbitmq_url)
    seen = []
    for host, port in (("127.0.0.1", broker.port), (rabbit.host, rabbit.port)):
        with socket.create_connection((host, port), timeout=WAIT_SECONDS) as sock:
            sock.sendall(greeting)
            data = b""
            while len(data) < 8 and (chunk := sock.recv(8 - len(data))):
                data += chunk
            seen.append(data)
    assert seen[0] == seen[1] == b"AMQP\x00\x00\x09\x01"


# -- issue 18: what clients read and write on a running connection ----------------------------


def test_server_properties_clients_read_match(both):
    """Everything a client switches on (capabilities, version) is RabbitMQ's;
    `product` stays honest."""
    seen = []
    both(lambda c: seen.append(c.start.server_properties) or [])
    hutch, rabbit = seen
    assert hutch["capabilities"] == rabbit["capabilities"]
    assert hutch["version"] == rabbit["version"]
    assert (hutch["product"], rabbit["product"]) == ("hutch", "RabbitMQ")


def test_channel_flow_active_false_is_not_implemented(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Channel.Flow(active=False), 1)
        return c.observe_close()
    hutch, rabbit = both(script)
    assert hutch == rabbit == [("Connection.Close", 0, 540, "NOT_IMPLEMENTED - active=false", 20, 20)]


def test_channel_flow_active_true_is_answered(both):
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Channel.Flow(active=True), 1)
        channel, reply = c.read_frame()
        return [type(reply).__name__, channel, reply.active]
    hutch, rabbit = both(script)
    assert hutch == rabbit == ["FlowOk", 1, True]


def test_socket_stays_open_after_close_ok_until_the_client_closes(both):
    """Both brokers answer Close with Close-Ok and leave the socket to the
    client (RabbitMQ: for up to 30 s); what the client still sends is read
    and ignored."""
    def script(c):
        c.open_channel(1)
        c.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
        channel, reply = c.read_frame()
        c.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)  # discarded
        return [type(reply).__name__, channel, c.is_open(0.5), c.buf]
    hutch, rabbit = both(script)
    assert hutch == rabbit == ["CloseOk", 0, True, b""]


async def _update_secret(url: str, secret: str) -> list:
    """What aiormq observes of connection.update-secret with `secret`, then
    of a queue.declare on the same connection."""
    connection = await aiormq.connect(url)
    seen = []
    try:
        try:
            reply = await asyncio.wait_for(connection.update_secret(secret, reason="token refresh"), WAIT_SECONDS)
            seen.append(type(reply).__name__)
            channel = await connection.channel()
            declared = await channel.queue_declare(exclusive=True)
            seen.append(type(declared).__name__)
        except aiormq.exceptions.AMQPConnectionError as exc:
            seen.append(("closed", type(exc).__name__, str(exc)))
    finally:
        if not connection.is_closed:
            await connection.close()
    return seen


def _amqp_url(host: str, port: int, user: str, password: str) -> str:
    return "amqp://%s:%s@%s:%d/" % (user, password, host, port)


def test_update_secret_with_the_users_password(broker, rabbitmq_url):
    rabbit = pika.URLParameters(rabbitmq_url)
    urls = [broker.url, _amqp_url(rabbit.host, rabbit.port, rabbit.credentials.username,
                                  rabbit.credentials.password)]
    hutch, rabbitmq = (asyncio.run(_update_secret(url, urlparse(url).password)) for url in urls)
    assert hutch == rabbitmq == ["UpdateSecretOk", "DeclareOk"]


def test_update_secret_with_another_secret_is_answered_ok(broker, rabbitmq_url):
    """RabbitMQ 3.10's internal backend ignores the new secret (the
    connection is authenticated already; only token backends check it):
    update-secret-ok, and the connection goes on. hutch answers alike."""
    rabbit = pika.URLParameters(rabbitmq_url)
    hutch = asyncio.run(_update_secret(broker.url, "not-the-password"))
    rabbitmq = asyncio.run(_update_secret(
        _amqp_url(rabbit.host, rabbit.port, rabbit.credentials.username, rabbit.credentials.password),
        "not-the-password"))
    assert hutch == rabbitmq == ["UpdateSecretOk", "DeclareOk"]


def test_close_ok_to_the_brokers_close_ends_the_connection_at_once(both):
    """The other closing path: the broker's Close, the client's Close-Ok,
    then both brokers close the socket without waiting for the client."""
    def script(c):
        c.send_frame(commands.Basic.Qos(prefetch_count=1), 5)  # unopened channel: 504
        observed = c.observe_close()  # answers Close-Ok
        return observed + [c.at_eof(1.0)]
    hutch, rabbit = both(script)
    assert hutch == rabbit
    assert rabbit[0][2] == 504 and rabbit[-1] is True
