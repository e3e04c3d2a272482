"""Who may use which part of the management API, by user tags, as RabbitMQ
decides it: no management tag -> nothing; management -> its own vhosts and
connections; monitoring -> everything, read only; administrator -> all."""
from __future__ import annotations

import pika
import pytest

from helpers import unique, wait_for
from http_api import Api, segment


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


@pytest.fixture
def setup(api, broker):
    """A vhost `mine` where users of each tag have permissions, and a vhost
    `other` where only guest has."""
    mine, other = unique("mine"), unique("other")
    users = {}
    for vhost in (mine, other):
        api.put("/api/vhosts/" + segment(vhost))
        api.put("/api/permissions/%s/guest" % segment(vhost), {"configure": ".*", "write": ".*", "read": ".*"})
    for tag in ("", "management", "policymaker", "monitoring", "administrator"):
        name = unique("u-" + (tag or "none"))
        api.put("/api/users/" + name, {"password": "pw", "tags": tag})
        api.put("/api/permissions/%s/%s" % (segment(mine), name), {"configure": ".*", "write": ".*", "read": ".*"})
        users[tag or "none"] = api.as_user(name, "pw")
    yield mine, other, users
    for vhost in (mine, other):
        api.delete("/api/vhosts/" + segment(vhost))
    for user in users.values():
        api.delete("/api/users/" + user.auth[0])


def refused(reply, reason: str) -> bool:
    return (reply.status, reply.body) == (401, {"error": "not_authorised", "reason": reason})


def test_a_user_without_a_management_tag_cannot_use_the_api(setup):
    _mine, _other, users = setup
    for path in ("/api/overview", "/api/whoami", "/api/queues"):
        assert refused(users["none"].get(path), "Not management user")


def test_management_user(setup):
    mine, other, users = setup
    user = users["management"]
    assert user.get("/api/overview").status == 200
    assert user.get("/api/whoami").body == {"name": user.auth[0], "tags": ["management"]}
    assert [v["name"] for v in user.get("/api/vhosts").body] == [mine]
    assert user.get("/api/queues/" + segment(mine)).status == 200
    assert refused(user.get("/api/queues/" + segment(other)), "User not authorised to access virtual host")
    assert refused(user.put("/api/queues/%s/q" % segment(other), {}), "User not authorised to access virtual host")
    assert user.put("/api/queues/%s/%s" % (segment(mine), unique("q")), {}).status == 201
    for path in ("/api/users", "/api/permissions", "/api/definitions"):
        assert refused(user.get(path), "Not administrator user"), path
    assert refused(user.put("/api/vhosts/" + unique("v")), "Not administrator user")
    assert refused(user.get("/api/nodes"), "Not monitor user")


def test_policymaker_is_a_management_user(setup):
    mine, _other, users = setup
    assert [v["name"] for v in users["policymaker"].get("/api/vhosts").body] == [mine]
    assert refused(users["policymaker"].get("/api/users"), "Not administrator user")


def test_monitoring_user_sees_everything_but_changes_nothing_outside_its_vhosts(setup):
    mine, other, users = setup
    user = users["monitoring"]
    names = [v["name"] for v in user.get("/api/vhosts").body]
    assert mine in names and other in names
    assert user.get("/api/queues/" + segment(other)).status == 200
    assert user.get("/api/nodes").status == 200
    assert refused(user.put("/api/queues/%s/q" % segment(other), {}), "User not authorised to access virtual host")
    assert refused(user.get("/api/users"), "Not administrator user")


def test_administrator_tag_grants_everything(setup):
    _mine, other, users = setup
    user = users["administrator"]
    assert user.get("/api/users").status == 200
    assert user.get("/api/definitions").status == 200
    assert user.get("/api/queues/" + segment(other)).status == 200


def test_connections_are_visible_to_their_owner_and_to_monitors(setup, broker, api):
    mine, _other, users = setup
    owner = users["management"]
    params = pika.ConnectionParameters("127.0.0.1", broker.port, mine, pika.PlainCredentials(owner.auth[0], "pw"))
    connection = pika.BlockingConnection(params)
    try:
        mine_listed = [c for c in owner.get("/api/connections").body]
        assert [c["user"] for c in mine_listed] == [owner.auth[0]]
        assert owner.auth[0] not in [c["user"] for c in users["policymaker"].get("/api/connections").body]
        assert owner.auth[0] in [c["user"] for c in users["monitoring"].get("/api/connections").body]
        name = mine_listed[0]["name"]
        assert refused(users["monitoring"].delete("/api/connections/" + segment(name)), "Not administrator user")
        assert users["policymaker"].delete("/api/connections/" + segment(name)).status == 404
        assert owner.delete("/api/connections/" + segment(name)).status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            wait_for(lambda: connection.process_data_events(0.05) or not connection.is_open)
        assert info.value.reply_code == 320
    finally:
        if connection.is_open:
            connection.close()
