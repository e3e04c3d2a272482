"""Vhost and user administration seen by clients, done through the
management API of a broker process: deleting a vhost or a user closes their
connections (320, RabbitMQ's texts) and a deleted vhost's data leaves the
disk; vhost limits (max-connections, max-queues) and user limits
(max-connections, max-channels) with RabbitMQ's errors (their validation
texts: test_management_policies.py); passwords and tags; everything
durable across a restart of the broker process.
"""
from __future__ import annotations

import os

import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError, \
    ProbableAuthenticationError

from amqp_raw import RawClient
from helpers import channel_error, connect, publish_sync, unique, wait_for
from http_api import Api, segment
from storage.vhost_storage import dir_name

ALL = {"configure": ".*", "write": ".*", "read": ".*"}


def login(port: int, user: str, password: str = "pw", vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials(user, password)))


def new_user(api: Api, vhost: str = "/", tags: str = "") -> str:
    name = unique("user")
    assert api.put("/api/users/" + name, {"password": "pw", "tags": tags}).status == 201
    permit(api, name, vhost)
    return name


def permit(api: Api, user: str, vhost: str) -> None:
    assert api.put("/api/permissions/%s/%s" % (segment(vhost), user), ALL).status in (201, 204)


def new_vhost(api: Api) -> str:
    name = unique("vhost")
    assert api.put("/api/vhosts/" + segment(name)).status == 201
    return name


def limit(api: Api, kind: str, owner: str, name: str, value: int) -> None:
    """PUT /api/{kind}-limits/{owner}/{name} (kind: "vhost" or "user")."""
    assert api.put("/api/%s-limits/%s/%s" % (kind, segment(owner), name), {"value": value}).status == 204


def closed_by_broker(connection) -> ConnectionClosedByBroker:
    """Pump the connection until the broker closes it; the close it sent."""
    def pump() -> bool:
        connection.process_data_events(time_limit=0.05)
        return False

    with pytest.raises(ConnectionClosedByBroker) as info:
        wait_for(pump)
    return info.value


# -- vhosts ----------------------------------------------------------------------------------


def test_deleting_a_vhost_closes_its_connections_and_removes_its_data(api, broker):
    vhost = new_vhost(api)
    user = new_user(api, vhost)
    connection = login(broker.port, user, vhost=vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dq", durable=True)
    channel.basic_publish("", "dq", b"x" * 10000, pika.BasicProperties(delivery_mode=2))
    directory = os.path.join(broker.data_dir, "vhosts", dir_name(vhost))
    assert os.listdir(os.path.join(directory, "queues"))
    other = connect(broker.port)  # on "/": stays open
    assert api.delete("/api/vhosts/" + segment(vhost)).status == 204
    closed = closed_by_broker(connection)
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - vhost '%s' is deleted" % vhost)
    wait_for(lambda: not any(name.startswith(dir_name(vhost)) for name in os.listdir(os.path.dirname(directory))))
    assert other.is_open
    other.close()
    with pytest.raises(ProbableAccessDeniedError):
        login(broker.port, user, vhost=vhost)
    # A vhost of the same name starts empty.
    assert api.put("/api/vhosts/" + segment(vhost)).status == 201
    permit(api, user, vhost)
    again = login(broker.port, user, vhost=vhost)
    assert channel_error(again.channel().queue_declare, "dq", passive=True)[0] == 404
    again.close()


def test_vhosts_are_isolated(api, broker):
    vhost = new_vhost(api)
    user = new_user(api, vhost)
    permit(api, user, "/")
    q = unique("q")
    login(broker.port, user, vhost=vhost).channel().queue_declare(q)
    assert channel_error(login(broker.port, user).channel().queue_declare, q, passive=True) == (
        404, "NOT_FOUND - no queue '%s' in vhost '/'" % q)


def test_vhost_connection_limit(api, broker):
    vhost = new_vhost(api)
    user = new_user(api, vhost)
    limit(api, "vhost", vhost, "max-connections", 1)
    first = login(broker.port, user, vhost=vhost)
    with pytest.raises(ProbableAccessDeniedError) as info:
        login(broker.port, user, vhost=vhost)
    assert ("NOT_ALLOWED - access to vhost '%s' refused for user '%s': connection limit (1) is reached"
            % (vhost, user)) in str(info.value)
    first.close()
    login(broker.port, user, vhost=vhost).close()
    limit(api, "vhost", vhost, "max-connections", -1)
    [login(broker.port, user, vhost=vhost) for _ in range(2)]


def test_vhost_queue_limit(api, broker):
    vhost = new_vhost(api)
    user = new_user(api, vhost)
    limit(api, "vhost", vhost, "max-queues", 1)
    channel = login(broker.port, user, vhost=vhost).channel()
    channel.queue_declare("q1")
    channel.queue_declare("q1")  # redeclaring an existing queue is fine
    assert channel_error(channel.queue_declare, "q2") == (
        406, "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '%s' (1) is reached" % vhost)


# -- users ----------------------------------------------------------------------------------


def test_deleting_a_user_closes_its_connections(api, broker):
    user = new_user(api)
    connection = login(broker.port, user)
    connection.channel()
    assert api.delete("/api/users/" + user).status == 204
    closed = closed_by_broker(connection)
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - user '%s' is deleted" % user)
    with pytest.raises(ProbableAuthenticationError):
        login(broker.port, user)


def test_user_connection_and_channel_limits(api, broker):
    user = new_user(api)
    limit(api, "user", user, "max-connections", 1)
    limit(api, "user", user, "max-channels", 1)
    connection = login(broker.port, user)
    with pytest.raises(ProbableAccessDeniedError) as info:
        login(broker.port, user)
    assert "NOT_ALLOWED - connection refused for user '%s': user connection limit (1) is reached" % user in str(
        info.value)
    connection.channel()
    with pytest.raises(ConnectionClosedByBroker) as closed:
        connection.channel()
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user '%s' has reached the maximum allowed user limit "
             "of (1)" % user)
    assert api.delete("/api/user-limits/%s/max-connections" % user).status == 204
    assert api.get("/api/user-limits/" + user).body == [{"user": user, "value": {"max-channels": 1}}]
    [login(broker.port, user) for _ in range(2)]


def test_change_password_and_tags(api, broker):
    user = new_user(api, tags="management")
    assert api.put("/api/users/" + user, {"password": "new", "tags": "management"}).status == 204
    with pytest.raises(ProbableAuthenticationError):
        login(broker.port, user, "pw")
    login(broker.port, user, "new").close()
    assert api.put("/api/users/" + user, {"tags": "monitoring,policymaker"}).status == 204
    assert api.get("/api/users/" + user).body["tags"] == ["monitoring", "policymaker"]
    login(broker.port, user, "new").close()  # a PUT without a password keeps it


def test_a_rabbitmq_password_hash_logs_in(api, broker):
    # `rabbitmqctl add_user pphash secret`, then its password_hash from
    # `rabbitmqctl export_definitions` (RabbitMQ 3.10, rabbit_password_hashing_sha256).
    name = unique("hashuser")
    assert api.put("/api/users/" + name, {"password_hash": "XuJNaGMO3jpC1/YW6I9stO7P5WTqOLYmLmaHrA+XMTcLql6J",
                                          "tags": ""}).status == 201
    permit(api, name, "/")
    login(broker.port, name, "secret").close()


# -- durability --------------------------------------------------------------------------------


def test_topic_permissions_and_limits_survive_a_restart(start_broker):
    first = start_broker(expect=("AMQP", "HTTP"))
    api = Api(first.ports["HTTP"])
    user = new_user(api)
    vhost = new_vhost(api)
    permit(api, user, vhost)
    api.put("/api/topic-permissions/%2F/" + user, {"exchange": "amq.topic", "write": "^ok", "read": ".*"})
    limit(api, "vhost", vhost, "max-queues", 0)
    limit(api, "user", user, "max-channels", 1)
    first.stop()
    proc = start_broker("--data-dir", str(first.data_dir))
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


def test_limit_errors_name_the_method_as_rabbitmq_does(api, broker):
    """The Close frames themselves: connection.open (10, 40) for the vhost
    connection limit, no method (0, 0) for the user channel limit."""
    vhost = new_vhost(api)
    user = new_user(api, vhost)
    permit(api, user, "/")
    limit(api, "vhost", vhost, "max-connections", 0)
    limit(api, "user", user, "max-channels", 1)
    with RawClient(broker.port) as client:
        client.handshake(user=user, password="pw", vhost=vhost, open_ok=False)
        close = client.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    with RawClient.connected(broker.port, user=user, password="pw", channels=(1,)) as client:
        client.send_frame(commands.Channel.Open(), 2)
        close = client.expect(commands.Connection.Close, 0)
        assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
