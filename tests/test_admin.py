"""Vhost and user administration seen by clients: deleting a vhost or a user
closes their connections (320, RabbitMQ's texts) and a deleted vhost's data
leaves the disk; vhost limits (max-connections, max-queues) and user limits
(max-connections, max-channels) with RabbitMQ's errors; passwords and tags;
everything durable across a restart of a broker process.
"""
from __future__ import annotations

import os
import re

import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError, \
    ProbableAuthenticationError

from amqp_raw import RawClient
from helpers import channel_error, connect, publish_sync, unique, wait_for
from live_broker import LiveBroker
from storage.vhost_storage import dir_name
from vhosts.users import Permission


def login(port: int, user: str, password: str = "pw", vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials(user, password)))


def new_user(live, vhost: str = "/", tags=()) -> str:
    name = unique("user")
    live.admin(lambda b: b.add_user(name, "pw", list(tags)))
    live.admin(lambda b: b.set_permissions(name, vhost, Permission()))
    return name


def new_vhost(live) -> str:
    name = unique("vhost")
    live.admin(lambda b: b.add_vhost(name))
    return name


def closed_by_broker(connection) -> ConnectionClosedByBroker:
    """Pump the connection until the broker closes it; the close it sent."""
    def pump() -> bool:
        connection.process_data_events(time_limit=0.05)
        return False

    with pytest.raises(ConnectionClosedByBroker) as info:
        wait_for(pump)
    return info.value


# -- vhosts ----------------------------------------------------------------------------------


def test_deleting_a_vhost_closes_its_connections_and_removes_its_data(live):
    vhost = new_vhost(live)
    user = new_user(live, vhost)
    connection = login(live.port, user, vhost=vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dq", durable=True)
    channel.basic_publish("", "dq", b"x" * 10000, pika.BasicProperties(delivery_mode=2))
    directory = os.path.join(live.data_dir, "vhosts", dir_name(vhost))
    assert os.listdir(os.path.join(directory, "queues"))
    other = connect(live.port)  # on "/": stays open
    live.admin(lambda b: b.delete_vhost(vhost))
    closed = closed_by_broker(connection)
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - vhost '%s' is deleted" % vhost)
    wait_for(lambda: not any(name.startswith(dir_name(vhost)) for name in os.listdir(os.path.dirname(directory))))
    assert other.is_open
    other.close()
    with pytest.raises(ProbableAccessDeniedError):
        login(live.port, user, vhost=vhost)
    # A vhost of the same name starts empty.
    live.admin(lambda b: b.add_vhost(vhost))
    live.admin(lambda b: b.set_permissions(user, vhost, Permission()))
    again = login(live.port, user, vhost=vhost)
    assert channel_error(again.channel().queue_declare, "dq", passive=True)[0] == 404
    again.close()


def test_vhosts_are_isolated(live):
    vhost = new_vhost(live)
    user = new_user(live, vhost)
    live.admin(lambda b: b.set_permissions(user, "/", Permission()))
    q = unique("q")
    login(live.port, user, vhost=vhost).channel().queue_declare(q)
    assert channel_error(login(live.port, user).channel().queue_declare, q, passive=True) == (
        404, "NOT_FOUND - no queue '%s' in vhost '/'" % q)


def test_vhost_connection_limit(live):
    vhost = new_vhost(live)
    user = new_user(live, vhost)
    live.admin(lambda b: b.set_vhost_limits(vhost, {"max-connections": 1}))
    first = login(live.port, user, vhost=vhost)
    with pytest.raises(ProbableAccessDeniedError) as info:
        login(live.port, user, vhost=vhost)
    assert ("NOT_ALLOWED - access to vhost '%s' refused for user '%s': connection limit (1) is reached"
            % (vhost, user)) in str(info.value)
    first.close()
    login(live.port, user, vhost=vhost).close()
    live.admin(lambda b: b.set_vhost_limits(vhost, {"max-connections": -1}))
    [login(live.port, user, vhost=vhost) for _ in range(2)]


def test_vhost_queue_limit(live):
    vhost = new_vhost(live)
    user = new_user(live, vhost)
    live.admin(lambda b: b.set_vhost_limits(vhost, {"max-queues": 1}))
    channel = login(live.port, user, vhost=vhost).channel()
    channel.queue_declare("q1")
    channel.queue_declare("q1")  # redeclaring an existing queue is fine
    assert channel_error(channel.queue_declare, "q2") == (
        406, "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '%s' (1) is reached" % vhost)


def test_limits_are_validated_with_rabbitmqctls_words(live):
    vhost = new_vhost(live)
    with pytest.raises(ValueError, match=re.escape('Unrecognised terms [{<<"max-foo">>,1}] in limits')):
        live.admin(lambda b: b.set_vhost_limits(vhost, {"max-foo": 1}))
    with pytest.raises(ValueError, match=re.escape('max-queues should be a number, actually was <<"x">>')):
        live.admin(lambda b: b.set_vhost_limits(vhost, {"max-queues": "x"}))
    with pytest.raises(LookupError):
        live.admin(lambda b: b.set_vhost_limits(unique("missing"), {"max-queues": 1}))


# -- users ----------------------------------------------------------------------------------


def test_deleting_a_user_closes_its_connections(live):
    user = new_user(live)
    connection = login(live.port, user)
    connection.channel()
    live.admin(lambda b: b.delete_user(user))
    closed = closed_by_broker(connection)
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - user '%s' is deleted" % user)
    with pytest.raises(ProbableAuthenticationError):
        login(live.port, user)


def test_user_connection_and_channel_limits(live):
    user = new_user(live)
    live.admin(lambda b: b.set_user_limits(user, {"max-connections": 1, "max-channels": 1}))
    connection = login(live.port, user)
    with pytest.raises(ProbableAccessDeniedError) as info:
        login(live.port, user)
    assert "NOT_ALLOWED - connection refused for user '%s': user connection limit (1) is reached" % user in str(
        info.value)
    connection.channel()
    with pytest.raises(ConnectionClosedByBroker) as closed:
        connection.channel()
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user '%s' has reached the maximum allowed user limit "
             "of (1)" % user)
    live.admin(lambda b: b.clear_user_limits(user, "max-connections"))
    assert live.admin(lambda b: b.users[user].limits) == {"max-channels": 1}
    [login(live.port, user) for _ in range(2)]


def test_change_password_and_tags(live):
    user = new_user(live, tags=["management"])
    live.admin(lambda b: b.change_password(user, "new"))
    with pytest.raises(ProbableAuthenticationError):
        login(live.port, user, "pw")
    login(live.port, user, "new").close()
    live.admin(lambda b: b.set_user_tags(user, ["monitoring", "policymaker"]))
    assert live.admin(lambda b: b.users[user].tags) == ["monitoring", "policymaker"]
    with pytest.raises(ValueError, match="already exists"):
        live.admin(lambda b: b.add_user(user, "x"))


def test_a_rabbitmq_password_hash_logs_in(live):
    # `rabbitmqctl add_user pphash secret`, then its password_hash from
    # `rabbitmqctl export_definitions` (RabbitMQ 3.10, rabbit_password_hashing_sha256).
    name = unique("hashuser")
    live.admin(lambda b: b.put_user(name, "XuJNaGMO3jpC1/YW6I9stO7P5WTqOLYmLmaHrA+XMTcLql6J", []))
    live.admin(lambda b: b.set_permissions(name, "/", Permission()))
    login(live.port, name, "secret").close()


# -- durability --------------------------------------------------------------------------------


def test_topic_permissions_and_limits_survive_a_restart(tmp_path, start_broker):
    live = LiveBroker(str(tmp_path / "data"))
    try:
        user = new_user(live)
        vhost = new_vhost(live)
        live.admin(lambda b: b.set_permissions(user, vhost, Permission()))
        live.admin(lambda b: b.set_topic_permissions(user, "/", "amq.topic", "^ok", ".*"))
        live.admin(lambda b: b.set_vhost_limits(vhost, {"max-queues": 0}))
        live.admin(lambda b: b.set_user_limits(user, {"max-channels": 1}))
    finally:
        live.stop()
    proc = start_broker("--data-dir", str(tmp_path / "data"))
    connection = login(proc.port, user)
    channel = connection.channel()
    publish_sync(channel, "amq.topic", "ok.1")
    with pytest.raises(ChannelClosedByBroker) as info:
        publish_sync(channel, "amq.topic", "no.1")
    assert info.value.reply_code == 403
    connection.channel()  # the closed one no longer counts
    with pytest.raises(ConnectionClosedByBroker):
        connection.channel()
    assert channel_error(login(proc.port, user, vhost=vhost).channel().queue_declare, "q")[0] == 406


def test_limit_errors_name_the_method_as_rabbitmq_does(live):
    """The Close frames themselves: connection.open (10, 40) for the vhost
    connection limit, no method (0, 0) for the user channel limit."""
    vhost = new_vhost(live)
    user = new_user(live, vhost)
    live.admin(lambda b: b.set_permissions(user, "/", Permission()))
    live.admin(lambda b: b.set_vhost_limits(vhost, {"max-connections": 0}))
    live.admin(lambda b: b.set_user_limits(user, {"max-channels": 1}))
    with RawClient(live.port) as client:
        client.handshake(user=user, password="pw", vhost=vhost, open_ok=False)
        close = client.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    with RawClient.connected(live.port, user=user, password="pw", channels=(1,)) as client:
        client.send_frame(commands.Channel.Open(), 2)
        close = client.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
