"""Who may use which part of the management API, by user tags, as RabbitMQ
decides it: no management tag -> nothing; management -> its own vhosts and
connections; monitoring -> everything, read only; administrator -> all."""
from __future__ import annotations

from urllib.parse import unquote

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


def test_monitoring_user_lists_everything_but_changes_nothing_outside_its_vhosts(setup):
    """As RabbitMQ 3.10: every vhost's objects in the overall listings, one
    vhost's own routes only with a permission there."""
    mine, other, users = setup
    user = users["monitoring"]
    names = [v["name"] for v in user.get("/api/vhosts").body]
    assert mine in names and other in names
    assert other in {q["vhost"] for q in user.get("/api/queues").body} | {e["vhost"] for e in
                                                                          user.get("/api/exchanges").body}
    assert refused(user.get("/api/queues/" + segment(other)), "User not authorised to access virtual host")
    assert user.get("/api/queues/" + segment(mine)).status == 200
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
        assert refused(users["policymaker"].delete("/api/connections/" + segment(name)),
                       "User not authorised to access object")
        assert owner.delete("/api/connections/" + segment(name)).status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            wait_for(lambda: connection.process_data_events(0.05) or not connection.is_open)
        assert info.value.reply_code == 320
    finally:
        if connection.is_open:
            connection.close()


# -- AMQP permissions on HTTP operations (RabbitMQ's mapping and answers) ---------


@pytest.fixture
def limited(api, broker):
    """A vhost where a management user may configure ^c, write ^w and read
    ^r, with queues xq, wq, rq and exchanges xx, wx, rx made by guest."""
    vhost, name = unique("perm"), unique("limited")
    api.put("/api/vhosts/" + segment(vhost))
    api.put("/api/permissions/%s/guest" % segment(vhost), {"configure": ".*", "write": ".*", "read": ".*"})
    api.put("/api/users/" + name, {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%s/%s" % (segment(vhost), name), {"configure": "^c", "write": "^w", "read": "^r"})
    for queue in ("xq", "wq", "rq"):
        assert api.put("/api/queues/%s/%s" % (segment(vhost), queue), {}).status == 201
    for exchange in ("xx", "wx", "rx"):
        assert api.put("/api/exchanges/%s/%s" % (segment(vhost), exchange), {"type": "topic"}).status == 201
    yield segment(vhost), api.as_user(name, "pw"), name
    api.delete("/api/vhosts/" + segment(vhost))
    api.delete("/api/users/" + name)


ACCESS_REFUSED = "Access refused."
PUBLISH = {"routing_key": "k", "properties": {}, "payload": "m", "payload_encoding": "string"}
GET = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}


def test_declare_and_delete_need_configure(limited):
    vhost, user, _name = limited
    assert refused(user.put("/api/queues/%s/xq2" % vhost, {}), ACCESS_REFUSED)
    assert refused(user.put("/api/exchanges/%s/xx2" % vhost, {"type": "direct"}), ACCESS_REFUSED)
    assert refused(user.delete("/api/queues/%s/xq" % vhost), ACCESS_REFUSED)
    assert refused(user.delete("/api/exchanges/%s/xx" % vhost), ACCESS_REFUSED)
    assert user.put("/api/queues/%s/cq" % vhost, {}).status == 201
    assert user.put("/api/exchanges/%s/cx" % vhost, {"type": "direct"}).status == 201
    assert user.delete("/api/queues/%s/cq" % vhost).status == 204
    assert user.delete("/api/exchanges/%s/cx" % vhost).status == 204


def test_publish_needs_write_and_answers_as_the_channel_would(limited):
    vhost, user, name = limited
    reply = user.post("/api/exchanges/%s/xx/publish" % vhost, PUBLISH)
    assert (reply.status, reply.body) == (400, {
        "error": "bad_request",
        "reason": "403 ACCESS_REFUSED - access to exchange 'xx' in vhost '%s' refused for user '%s'"
                  % (unquote(vhost), name)})
    assert user.post("/api/exchanges/%s/wx/publish" % vhost, PUBLISH).body == {"routed": False}


def test_get_and_purge_need_read(limited, api):
    vhost, user, name = limited
    reply = user.post("/api/queues/%s/xq/get" % vhost, GET)
    assert (reply.status, reply.body) == (401, {
        "error": "not_authorised",
        "reason": "ACCESS_REFUSED - access to queue 'xq' in vhost '%s' refused for user '%s'" % (unquote(vhost), name)})
    assert refused(user.delete("/api/queues/%s/xq/contents" % vhost), ACCESS_REFUSED)
    api.post("/api/exchanges/%s/amq.default/publish" % vhost, dict(PUBLISH, routing_key="rq"))
    assert [m["payload"] for m in user.post("/api/queues/%s/rq/get" % vhost, GET).body] == ["m"]
    assert user.delete("/api/queues/%s/rq/contents" % vhost).status == 204


def test_bindings_need_write_on_the_destination_and_read_on_the_source(limited, api):
    vhost, user, _name = limited
    assert refused(user.post("/api/bindings/%s/e/xx/q/wq" % vhost, {"routing_key": "k"}), ACCESS_REFUSED)
    assert refused(user.post("/api/bindings/%s/e/rx/q/xq" % vhost, {"routing_key": "k"}), ACCESS_REFUSED)
    assert user.post("/api/bindings/%s/e/rx/q/wq" % vhost, {"routing_key": "k"}).status == 201
    assert user.delete("/api/bindings/%s/e/rx/q/wq/k" % vhost).status == 204
    assert api.post("/api/bindings/%s/e/xx/q/wq" % vhost, {"routing_key": "k"}).status == 201
    assert refused(user.delete("/api/bindings/%s/e/xx/q/wq/k" % vhost), ACCESS_REFUSED)
    assert user.post("/api/bindings/%s/e/rx/e/wx" % vhost, {"routing_key": "k"}).status == 201
    assert refused(user.post("/api/bindings/%s/e/rx/e/xx" % vhost, {"routing_key": "k"}), ACCESS_REFUSED)


def test_topic_permissions_apply_to_http_publish_and_bind(limited, api):
    vhost, user, name = limited
    api.put("/api/topic-permissions/%s/%s" % (vhost, name), {"exchange": "wx", "write": "^ok", "read": ".*"})
    api.put("/api/topic-permissions/%s/%s" % (vhost, name), {"exchange": "rx", "write": ".*", "read": "^ok"})
    reply = user.post("/api/exchanges/%s/wx/publish" % vhost, dict(PUBLISH, routing_key="no"))
    assert reply.body["reason"] == ("403 ACCESS_REFUSED - access to topic 'no' in exchange 'wx' in vhost '%s' "
                                    "refused for user '%s'" % (unquote(vhost), name))
    assert user.post("/api/exchanges/%s/wx/publish" % vhost, dict(PUBLISH, routing_key="ok.1")).status == 200
    assert refused(user.post("/api/bindings/%s/e/rx/q/wq" % vhost, {"routing_key": "no"}), ACCESS_REFUSED)
    assert user.post("/api/bindings/%s/e/rx/q/wq" % vhost, {"routing_key": "ok.1"}).status == 201


def test_the_aliveness_test_runs_with_the_users_permissions(limited):
    vhost, user, name = limited
    reply = user.get("/api/aliveness-test/" + vhost)
    assert (reply.status, reply.body) == (401, {
        "error": "not_authorised",
        "reason": "ACCESS_REFUSED - access to queue 'aliveness-test' in vhost '%s' refused for user '%s'"
                  % (unquote(vhost), name)})
