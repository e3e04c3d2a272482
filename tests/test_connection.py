"""Connection level: Connection.Start, authentication, tuning, vhosts,
heartbeats, and closing connections and channels; seen through pika and, where
a client library hides the detail, through a raw socket (tests/amqp_raw.py).

Reply codes and texts are RabbitMQ 3.10's.
"""
from __future__ import annotations

import socket
import time

import pika
import pytest
from pamqp import commands, heartbeat

from amqp_raw import Closed, RawClient, amqplain_response, plain_response, start_ok_frame
from helpers import assert_serves, connect, unique, wait_for

pytestmark = pytest.mark.usefixtures("still_serving")

# RabbitMQ 3.10's (tests/differential/test_diff_connection.py compares them).
CAPABILITIES = {
    "direct_reply_to": True,
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "consumer_priorities": True,
    "connection.blocked": True,
}
LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism %s. For details see the broker logfile."
)
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def negotiated(connection: pika.BlockingConnection) -> tuple:
    params = connection._impl.params  # pika keeps the tuned values here
    return params.channel_max, params.frame_max, params.heartbeat


def assert_refused_before_open(client: RawClient, reply_code: int, reply_text: str) -> None:
    """The handshake goes no further and the socket is closed. RabbitMQ closes
    silently (after 3 s) for errors before the connection is open, other than
    a refused login or vhost; hutch sends Connection.Close with the reason.
    Either is accepted here, but a Close must carry the right code and text."""
    try:
        channel, value = client.read_frame(timeout=6.0)
    except Closed:
        return
    assert channel == 0 and isinstance(value, commands.Connection.Close), "handshake went on: %r" % (value,)
    assert (value.reply_code, value.reply_text) == (reply_code, reply_text)
    client.send_frame(commands.Connection.CloseOk())
    client.wait_closed(2.0)


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    candidates = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.255", 9))  # no packet is sent; picks the outgoing interface
        candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    try:
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    for address in candidates:
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    return None


# -- Connection.Start --------------------------------------------------------------


def test_start_offers_version_mechanisms_locales_and_capabilities(raw):
    start = raw.handshake_start()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert sorted(start.mechanisms.split()) == ["AMQPLAIN", "PLAIN"]
    assert start.locales == "en_US"
    props = start.server_properties
    assert props["capabilities"] == CAPABILITIES
    assert props["product"] == "hutch"
    assert props["version"] == "3.10.8"  # clients read it as RabbitMQ's version
    for key in ("version", "platform", "copyright", "information", "cluster_name"):
        assert isinstance(props[key], str) and props[key], key


def test_pika_sees_the_server_capabilities(broker):
    connection = connect(broker.port)
    try:
        assert connection._impl.server_capabilities == CAPABILITIES
        channel = connection.channel()
        channel.confirm_delivery()  # pika only allows it when publisher_confirms is offered
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"confirmed", mandatory=True)
    finally:
        connection.close()


# -- authentication -------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_with_each_mechanism(raw, mechanism):
    tune = raw.handshake(mechanism=mechanism)  # Start, Tune, Open-Ok
    assert tune.frame_max == 131072
    raw.open_channel(1)
    raw.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
    assert raw.expect(commands.Queue.DeclareOk, 1).queue.startswith("amq.gen-")


@pytest.mark.parametrize(
    "mechanism, response",
    [
        ("PLAIN", plain_response("guest", "wrong")),
        ("PLAIN", plain_response("nobody", "guest")),
        ("AMQPLAIN", amqplain_response("guest", "wrong")),
    ],
    ids=["bad password", "unknown user", "AMQPLAIN bad password"],
)
def test_refused_login_with_authentication_failure_close(raw, mechanism, response):
    raw.handshake_start()
    raw.login(mechanism=mechanism, response=response, capabilities=True)
    close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        403, LOGIN_REFUSED % mechanism, 0, 0)


def test_refused_login_without_the_capability_just_closes(raw):
    raw.handshake_start()
    raw.login(password="wrong", capabilities=False)
    with pytest.raises(Closed):
        raw.read_frame(timeout=6.0)  # no Close frame, no Tune: EOF


def test_pika_reports_a_refused_login(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(broker.port, credentials=pika.PlainCredentials("guest", "wrong"))
    assert "(403)" in str(info.value) and LOGIN_REFUSED % "PLAIN" in str(info.value)


@pytest.mark.parametrize(
    "mechanism, response",
    [("PLAIN", b"guest-guest"), ("AMQPLAIN", b"\x05LOG")],
    ids=["PLAIN without NULs", "AMQPLAIN truncated table"],
)
def test_malformed_login_response_is_refused(raw, mechanism, response):
    raw.handshake_start()
    raw.login(mechanism=mechanism, response=response)
    assert_refused_before_open(raw, 403, LOGIN_REFUSED % mechanism)


def test_unknown_mechanism_is_refused(raw):
    raw.handshake_start()
    raw.send(start_ok_frame("FOO", b"\x00guest\x00guest", {"capabilities": {"authentication_failure_close": True}}))
    assert_refused_before_open(raw, 503, "COMMAND_INVALID - unknown authentication mechanism 'FOO'")


def expect_login(port: int, host: str, user: str, password: str) -> str:
    """'ok' if the login succeeds, else the Close text."""
    with RawClient(port, host=host) as client:
        client.handshake_start()
        client.login(user, password)
        channel, value = client.read_frame()
        if isinstance(value, commands.Connection.Tune):
            return "ok"
        assert isinstance(value, commands.Connection.Close) and value.reply_code == 403
        return value.reply_text


def test_loopback_users_may_only_log_in_over_loopback(start_broker):
    """guest (the default loopback_users) is refused from a non-loopback address;
    naming another user restricts that user instead, and an empty list lifts it."""
    address = non_loopback_address()
    default = start_broker("--bind", "0.0.0.0")
    bob_only = start_broker("--bind", "0.0.0.0", "--default-user", "bob", "--default-pass", "pw",
                            "--loopback-users", "bob")
    nobody = start_broker("--bind", "0.0.0.0", "--loopback-users", "")
    # over loopback, a loopback-only user is always welcome
    assert expect_login(default.port, "127.0.0.1", "guest", "guest") == "ok"
    assert expect_login(bob_only.port, "127.0.0.1", "bob", "pw") == "ok"
    if address is not None:  # this machine has one (if not, the refusal cannot be observed)
        assert expect_login(default.port, address, "guest", "guest") == LOGIN_REFUSED % "PLAIN"
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(default.port, host=address)
        assert expect_login(bob_only.port, address, "bob", "pw") == LOGIN_REFUSED % "PLAIN"
        assert expect_login(nobody.port, address, "guest", "guest") == "ok"
        connection = connect(nobody.port, host=address)
        assert connection.channel().queue_declare("", exclusive=True).method.queue
        connection.close()
    assert_serves(default.port)


# -- Connection.Tune ---------------------------------------------------------------------


def test_default_tune_values(raw, broker):
    tune = raw.handshake()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    connection = connect(broker.port)
    try:
        assert negotiated(connection) == (2047, 131072, 60)
    finally:
        connection.close()


def test_tune_values_come_from_the_flags(start_broker):
    tuned = start_broker("--channel-max", "10", "--frame-max", "8192", "--heartbeat", "7")
    with RawClient(tuned.port) as client:
        tune = client.handshake()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (10, 8192, 7)
    connection = connect(tuned.port)
    try:
        assert negotiated(connection) == (10, 8192, 7)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        payload = bytes(range(256)) * 100  # split into 8 KiB frames both ways
        channel.basic_publish("", queue, payload)
        assert channel.basic_get(queue, auto_ack=True)[2] == payload
    finally:
        connection.close()
    assert_serves(tuned.port)


def test_client_may_lower_tune_values(broker):
    connection = connect(broker.port, channel_max=5, frame_max=4096, heartbeat=9)
    try:
        assert negotiated(connection) == (5, 4096, 9)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        payload = bytes(range(256)) * 400  # 100 KiB: 26 frames each way at 4096
        channel.basic_publish("", queue, payload)
        assert channel.basic_get(queue, auto_ack=True)[2] == payload
    finally:
        connection.close()


@pytest.mark.parametrize(
    "tune_ok, reply_text",
    [
        ({"frame_max": 131073}, "NOT_ALLOWED - frame_max=131073 > 131072 max size"),
        ({"frame_max": 1000}, "NOT_ALLOWED - frame_max=1000 < 4096 min size"),
        ({"channel_max": 5000}, "NOT_ALLOWED - channel_max=5000 > 2047 max"),
    ],
    ids=["frame_max above the server's", "frame_max below 4096", "channel_max above the server's"],
)
def test_tune_ok_outside_the_servers_limits_is_refused(raw, tune_ok, reply_text):
    raw.handshake(open_ok=False, **tune_ok)
    assert_refused_before_open(raw, 530, reply_text)


# -- Connection.Open -------------------------------------------------------------------------


def test_unknown_vhost_is_not_allowed(raw):
    raw.handshake(vhost="nope", open_ok=False)
    close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - vhost nope not found", 10, 40)


def test_pika_reports_an_unknown_vhost(broker):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(broker.port, virtual_host="nope")
    assert "NOT_ALLOWED - vhost nope not found" in str(info.value)


# -- heartbeats ------------------------------------------------------------------------------------


def test_silent_client_is_disconnected_after_two_heartbeat_intervals(start_broker):
    """--heartbeat 1: a client that negotiated 1 s and says nothing gets
    heartbeats, then is dropped after about two intervals; a client that
    negotiated 0 on the same broker gets neither."""
    beating = start_broker("--heartbeat", "1")
    silent = RawClient(beating.port)
    quiet = RawClient(beating.port)
    try:
        assert silent.handshake(heartbeat=1).heartbeat == 1
        opened = time.monotonic()
        quiet.handshake(heartbeat=0)
        received = 0
        with pytest.raises(Closed):
            while True:
                _, value = silent.read_frame(timeout=10.0, heartbeats=True)
                assert isinstance(value, heartbeat.Heartbeat)
                received += 1
        elapsed = time.monotonic() - opened
        assert received >= 1
        assert 1.5 <= elapsed <= 8.0, elapsed
        # heartbeats off: nothing was sent to it and it is still connected
        quiet.send_frame(commands.Channel.Open(), 1)
        channel, value = quiet.read_frame(heartbeats=True)
        assert (channel, type(value)) == (1, commands.Channel.OpenOk)
    finally:
        silent.close()
        quiet.close()
    assert_serves(beating.port)


def test_heartbeat_lowered_by_the_client_is_enforced(raw):
    """The server offers 60 s; a client asking for 1 s is held to it."""
    raw.handshake(heartbeat=1)
    opened = time.monotonic()
    with pytest.raises(Closed):
        while True:
            raw.read_frame(timeout=10.0, heartbeats=True)
    assert 1.5 <= time.monotonic() - opened <= 8.0


def test_client_sending_heartbeats_stays_connected(start_broker):
    beating = start_broker("--heartbeat", "1")
    with RawClient(beating.port) as client:
        client.handshake(heartbeat=1)
        received = 0
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            try:
                _, value = client.read_frame(timeout=0.4, heartbeats=True)
                assert isinstance(value, heartbeat.Heartbeat)
                received += 1
            except socket.timeout:
                pass
            client.send(HEARTBEAT)
        assert received >= 2  # the server sent its own heartbeats meanwhile
        client.open_channel(1)  # and the connection is alive
    assert_serves(beating.port)


def test_pika_with_one_second_heartbeats_stays_connected(broker):
    connection = connect(broker.port, heartbeat=1)
    try:
        assert negotiated(connection)[2] == 1
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.25)
        assert connection.is_open
        channel.basic_publish("", queue, b"after idling")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"after idling"
    finally:
        connection.close()


# -- closing connections and channels ---------------------------------------------------------------


def queue_exists(port: int, queue: str) -> bool:
    connection = connect(port)
    try:
        connection.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code in (404, 405)  # 405: another connection's exclusive queue
        return exc.reply_code == 405
    finally:
        if connection.is_open:
            connection.close()


def test_client_close_gets_close_ok_and_releases_the_connection(raw, broker):
    raw.handshake()
    raw.open_channel(1)
    queue = unique("excl")
    raw.send_frame(commands.Queue.Declare(queue=queue, exclusive=True), 1)
    raw.expect(commands.Queue.DeclareOk, 1)
    raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    raw.expect(commands.Connection.CloseOk, 0)
    wait_for(lambda: not queue_exists(broker.port, queue))


def test_pika_close_deletes_exclusive_queues(broker):
    connection = connect(broker.port)
    queue = unique("excl")
    connection.channel().queue_declare(queue, exclusive=True)
    assert queue_exists(broker.port, queue)
    connection.close()
    assert connection.is_closed
    wait_for(lambda: not queue_exists(broker.port, queue))


def test_channels_open_close_and_reuse_numbers(broker):
    connection = connect(broker.port)
    try:
        channels = [connection.channel() for _ in range(3)]
        assert [c.channel_number for c in channels] == [1, 2, 3]
        channels[0].close()
        assert channels[0].is_closed and channels[1].is_open
        again = connection.channel(channel_number=1)
        queue = again.queue_declare("", exclusive=True).method.queue
        channels[2].basic_publish("", queue, b"across channels")
        got = wait_for(lambda: channels[1].basic_get(queue, auto_ack=True)[2])
        assert got == b"across channels"
    finally:
        connection.close()


def test_channel_closed_by_the_server_can_be_reopened(broker):
    connection = connect(broker.port)
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(unique("missing"), passive=True)
        assert info.value.reply_code == 404
        assert connection.is_open
        again = connection.channel(channel_number=channel.channel_number)
        assert again.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    finally:
        connection.close()
