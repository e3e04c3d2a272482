"""Management API: policies, topic permissions, vhost and user limits, in
RabbitMQ 3.10's shapes and codes, and their effect on AMQP clients."""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from helpers import connect, unique, wait_for
from http_api import segment

ALL = {"configure": ".*", "write": ".*", "read": ".*"}
NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@pytest.fixture
def user(api):
    name = unique("u")
    assert api.put("/api/users/" + name, {"password": "pw", "tags": ""}).status == 201
    yield name
    api.delete("/api/users/" + name)


def amqp(broker, vhost: str, user=("guest", "guest")) -> pika.BlockingConnection:
    return connect(broker.port, virtual_host=vhost, credentials=pika.PlainCredentials(*user))


# -- policies ----------------------------------------------------------------------


def test_policy_put_get_list_delete(api, vhost):
    path = "/api/policies/%s/cap" % segment(vhost)
    body = {"pattern": "^work", "definition": {"max-length": 5}, "priority": 1, "apply-to": "queues"}
    assert api.put(path, body).status == 201
    assert api.put(path, body).status == 204
    expected = {"vhost": vhost, "name": "cap", "pattern": "^work", "apply-to": "queues",
                "definition": {"max-length": 5}, "priority": 1}
    assert api.get(path).body == expected
    assert api.get("/api/policies/" + segment(vhost)).body == [expected]
    assert expected in api.get("/api/policies").body
    assert api.delete(path).status == 204
    assert (api.delete(path).status, api.get(path).body) == (404, NOT_FOUND)
    assert api.get("/api/policies/" + segment(vhost)).body == []


def test_invalid_policies_get_rabbitmqs_400(api, vhost):
    path = "/api/policies/%s/p" % segment(vhost)
    reply = api.put(path, {"pattern": "^a", "definition": {"max-lengthx": 5}})
    assert (reply.status, reply.body) == (400, {
        "error": "bad_request",
        "reason": 'Validation failed\n\n[{&lt;&lt;"max-lengthx"&gt;&gt;,5}] are not recognised policy settings\n'})
    reply = api.put(path, {"pattern": "^a"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "[{key_missing,definition}]"})
    reply = api.put("/api/policies/%s/p" % unique("novhost"), {"pattern": "^a", "definition": {"max-length": 1}})
    assert (reply.status, reply.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api.get(path).status == 404


def test_the_policy_applying_to_a_queue_shows_in_listings(api, vhost):
    queue, other = unique("work"), unique("other")
    for name in (queue, other):
        assert api.put("/api/queues/%s/%s" % (segment(vhost), name), {"durable": False}).status == 201
    assert api.put("/api/policies/%s/cap" % segment(vhost),
                   {"pattern": "^work", "definition": {"max-length": 2}, "apply-to": "queues"}).status == 201
    shown = api.get("/api/queues/%s/%s" % (segment(vhost), queue)).body
    assert (shown["policy"], shown["effective_policy_definition"]) == ("cap", {"max-length": 2})
    listed = {q["name"]: q for q in api.get("/api/queues/" + segment(vhost)).body}
    assert (listed[queue]["policy"], listed[other]["policy"]) == ("cap", None)
    assert listed[other]["effective_policy_definition"] == {}
    assert api.delete("/api/policies/%s/cap" % segment(vhost)).status == 204
    shown = api.get("/api/queues/%s/%s" % (segment(vhost), queue)).body
    assert (shown["policy"], shown["effective_policy_definition"]) == (None, {})


def test_an_exchange_policy_set_over_http_applies_and_is_listed_where_it_applies(api, broker, vhost):
    x, caught = unique("alt"), unique("caught")
    assert api.put("/api/exchanges/%s/%s" % (segment(vhost), x), {"type": "direct"}).status == 201
    assert api.put("/api/queues/%s/%s" % (segment(vhost), caught), {}).status == 201
    assert api.post("/api/bindings/%s/e/amq.fanout/q/%s" % (segment(vhost), caught), {}).status == 201
    assert api.put("/api/policies/%s/ae" % segment(vhost),
                   {"pattern": "^alt", "definition": {"alternate-exchange": "amq.fanout"},
                    "apply-to": "exchanges"}).status == 201
    assert api.get("/api/exchanges/%s/%s" % (segment(vhost), x)).body["policy"] == "ae"
    listed = {e["name"]: e for e in api.get("/api/exchanges/" + segment(vhost)).body}
    assert listed[x]["policy"] == "ae"
    assert "policy" not in listed["amq.direct"]
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        channel.basic_publish(x, "unbound", b"m")
        wait_for(lambda: channel.queue_declare(caught, passive=True).method.message_count == 1)


def test_policymaker_rules(api, vhost):
    names = {}
    for tag in ("management", "policymaker"):
        names[tag] = unique(tag)
        api.put("/api/users/" + names[tag], {"password": "pw", "tags": tag})
        api.put("/api/permissions/%s/%s" % (segment(vhost), names[tag]), ALL)
    try:
        management, policymaker = (api.as_user(names[t], "pw") for t in ("management", "policymaker"))
        path = "/api/policies/%s/p" % segment(vhost)
        body = {"pattern": "^zz", "definition": {"max-length": 5}}
        denied = (401, {"error": "not_authorised", "reason": "User not authorised to access object"})
        reply = management.put(path, body)
        assert (reply.status, reply.body) == denied
        assert policymaker.put(path, body).status == 201
        assert management.get("/api/policies/" + segment(vhost)).body[0]["name"] == "p"
        reply = management.get(path)
        assert (reply.status, reply.body) == denied
        assert policymaker.get(path).status == 200
        reply = policymaker.put("/api/policies/%2F/p", body)  # no permission in "/"
        assert (reply.status, reply.body) == denied
        assert policymaker.get("/api/policies/%2F").status == 401
        assert policymaker.delete(path).status == 204
    finally:
        for name in names.values():
            api.delete("/api/users/" + name)


# -- topic permissions --------------------------------------------------------------


def test_topic_permissions_put_list_delete(api, vhost, user):
    path = "/api/topic-permissions/%s/%s" % (segment(vhost), user)
    assert api.put(path, {"exchange": "amq.topic", "write": "^a", "read": "^b"}).status == 201
    assert api.put(path, {"exchange": "amq.topic", "write": "^a", "read": "^b"}).status == 204
    row = {"user": user, "vhost": vhost, "exchange": "amq.topic", "write": "^a", "read": "^b"}
    assert api.get(path).body == [row]
    assert api.get("/api/users/%s/topic-permissions" % user).body == [row]
    assert api.get("/api/vhosts/%s/topic-permissions" % segment(vhost)).body == [row]
    assert row in api.get("/api/topic-permissions").body
    assert api.delete(path).status == 204
    assert (api.get(path).status, api.delete(path).status) == (404, 404)


def test_topic_permission_errors(api, vhost, user):
    path = "/api/topic-permissions/%s/%s" % (segment(vhost), user)
    reply = api.put(path, {"write": "^a", "read": "b"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "[{key_missing,exchange}]"})
    reply = api.put("/api/topic-permissions/%s/%s" % (segment(vhost), unique("nobody")),
                    {"exchange": "x", "write": "a", "read": "b"})
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "vhost_or_user_not_found"})
    reply = api.put(path, {"exchange": "x", "write": "(", "read": "b"})
    assert reply.status == 400 and reply.body["reason"][:2] == ["invalid_regexp", "("]
    api.put("/api/users/%s" % user, {"password": "pw", "tags": "management"})
    reply = api.as_user(user, "pw").get("/api/topic-permissions")
    assert (reply.status, reply.body["reason"]) == (401, "Not administrator user")


def test_topic_permissions_set_over_http_apply_to_amqp(api, broker, vhost, user):
    api.put("/api/permissions/%s/%s" % (segment(vhost), user), ALL)
    api.put("/api/topic-permissions/%s/%s" % (segment(vhost), user),
            {"exchange": "amq.topic", "write": "^allowed\\.", "read": ".*"})
    with amqp(broker, vhost, (user, "pw")) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", "allowed.key", b"m")
        with pytest.raises(ChannelClosedByBroker) as denied:
            channel.basic_publish("amq.topic", "other.key", b"m")
        assert denied.value.reply_code == 403
        assert denied.value.reply_text == (
            "ACCESS_REFUSED - access to topic 'other.key' in exchange 'amq.topic' in vhost '%s' refused for "
            "user '%s'" % (vhost, user))


# -- limits --------------------------------------------------------------------------


def test_vhost_limits(api, broker, vhost):
    base = "/api/vhost-limits/" + segment(vhost)
    assert api.put(base + "/max-queues", {"value": 1}).status == 204
    assert api.put(base + "/max-connections", {"value": 10}).status == 204
    assert api.get(base).body == [{"vhost": vhost, "value": {"max-queues": 1, "max-connections": 10}}]
    assert {"vhost": vhost, "value": {"max-queues": 1, "max-connections": 10}} in api.get("/api/vhost-limits").body
    with amqp(broker, vhost) as connection:
        channel = connection.channel()
        channel.queue_declare(unique("q"))
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(unique("q"))
        assert refused.value.reply_code == 406
    assert api.delete(base + "/max-queues").status == 204
    assert api.get(base).body == [{"vhost": vhost, "value": {"max-connections": 10}}]
    with amqp(broker, vhost) as connection:
        connection.channel().queue_declare(unique("q"))


def test_vhost_limit_errors(api, vhost):
    base = "/api/vhost-limits/" + segment(vhost)
    reply = api.put(base + "/max-foo", {"value": 5})
    assert (reply.status, reply.body["reason"]) == (
        400, 'Validation failed\n\nUnrecognised terms [{<<"max-foo">>,5}] in limits\n')
    reply = api.put(base + "/max-queues", {"value": "x"})
    assert reply.body["reason"] == 'Validation failed\n\nmax-queues should be a number, actually was <<"x">>\n'
    reply = api.put(base + "/max-queues", {})
    assert (reply.status, reply.body["reason"]) == (400, "[{key_missing,value}]")
    reply = api.put("/api/vhost-limits/%s/max-queues" % unique("nov"), {"value": 5})
    assert (reply.status, reply.body) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api.get(base).body == []


def test_user_limits(api, broker, vhost, user):
    api.put("/api/permissions/%s/%s" % (segment(vhost), user), ALL)
    base = "/api/user-limits/" + user
    assert api.put(base + "/max-channels", {"value": 1}).status == 204
    assert api.put(base + "/max-connections", {"value": 3}).status == 204
    assert api.get(base).body == [{"user": user, "value": {"max-channels": 1, "max-connections": 3}}]
    assert api.get("/api/users/" + user).body["limits"] == {"max-channels": 1, "max-connections": 3}
    with amqp(broker, vhost, (user, "pw")) as connection:
        connection.channel()
        with pytest.raises(ConnectionClosedByBroker) as refused:
            connection.channel()
        assert refused.value.reply_code == 530
    reply = api.put(base + "/max-foo", {"value": 4})
    assert (reply.status, reply.body["reason"]) == (400, 'Unrecognised terms [{<<"max-foo">>,4}] in user-limits')
    reply = api.put("/api/user-limits/%s/max-channels" % unique("nobody"), {"value": 4})
    assert reply.body["reason"][0] == "no_such_user"
    assert api.delete(base + "/max-channels").status == 204
    assert api.get(base).body == [{"user": user, "value": {"max-connections": 3}}]
    assert api.get("/api/user-limits/" + unique("nobody")).status == 404


def test_limits_are_listed_to_management_users_and_changed_by_administrators(api, vhost):
    name = unique("viewer")
    api.put("/api/users/" + name, {"password": "pw", "tags": "management"})
    api.put("/api/permissions/%s/%s" % (segment(vhost), name), ALL)
    other = unique("other")
    api.put("/api/vhosts/" + other)
    try:
        api.put("/api/vhost-limits/%s/max-queues" % segment(vhost), {"value": 3})
        api.put("/api/vhost-limits/%s/max-queues" % other, {"value": 4})
        viewer = api.as_user(name, "pw")
        assert viewer.get("/api/vhost-limits").body == [{"vhost": vhost, "value": {"max-queues": 3}}]
        assert viewer.get("/api/vhost-limits/" + other).status == 401
        for reply in (viewer.put("/api/vhost-limits/%s/max-queues" % segment(vhost), {"value": 9}),
                      viewer.put("/api/user-limits/%s/max-channels" % name, {"value": 9})):
            assert (reply.status, reply.body["reason"]) == (401, "Not administrator user")
        api.put("/api/user-limits/%s/max-channels" % name, {"value": 2})
        assert {"user": name, "value": {"max-channels": 2}} in viewer.get("/api/user-limits").body
    finally:
        api.delete("/api/vhosts/" + other)
        api.delete("/api/users/" + name)
