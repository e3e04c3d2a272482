"""Who may point a shovel at which vhost, differential against RabbitMQ
3.10.8: a policymaker with permissions in one vhost sets shovels whose
host-less URIs name another; both brokers answer with the same status and
JSON reason. Federation upstreams are where hutch goes beyond RabbitMQ
(docs/security.md): RabbitMQ accepts the same URI in an upstream, hutch
refuses it with the shovel's text."""
from __future__ import annotations

import pytest

from helpers import unique
from http_api import Api, segment

pytestmark = pytest.mark.differential

ALL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture
def sides(api, rabbitmq_api):
    """[(admin Api, policymaker Api)] for hutch and RabbitMQ, and the names
    (user, its vhost, another vhost), the same on both; removed afterwards."""
    rabbit = Api(*rabbitmq_api)
    user, mine, theirs = unique("pm"), unique("mine"), unique("theirs")
    for side in (api, rabbit):
        for vhost in (mine, theirs):
            assert side.put("/api/vhosts/" + vhost).status == 201
        assert side.put("/api/users/" + user, {"password": "pw", "tags": "policymaker"}).status == 201
        assert side.put("/api/permissions/%s/%s" % (mine, user), ALL).status == 201
    yield [(api, api.as_user(user, "pw")), (rabbit, rabbit.as_user(user, "pw"))], (user, mine, theirs)
    for side in (api, rabbit):
        side.delete("/api/users/" + user)
        for vhost in (mine, theirs):
            side.delete("/api/vhosts/" + vhost)


def test_shovel_uris_naming_a_vhost_the_user_may_not_use(sides):
    both, (user, mine, theirs) = sides
    cases = [
        ("amqp:///" + theirs, "amqp:///" + mine),
        (["amqp:///" + mine, "amqp:///" + theirs], "amqp:///" + mine),
        ("amqp:///" + mine, "amqp:///nosuch"),
        ("amqp://", "amqp:///%2f"),  # the default vhost, where the user has no permission
        ("amqp:///" + theirs, "amqp:///" + theirs),  # one line per URI key, destination first
        ("amqp:///" + mine, "amqp:///" + mine),
    ]
    for n, (src, dest) in enumerate(cases):
        value = {"src-uri": src, "src-queue": "q", "dest-uri": dest, "dest-queue": "q"}
        replies = [as_user.put("/api/parameters/shovel/%s/s%d" % (mine, n), {"value": value})
                   for _admin, as_user in both]
        assert (replies[0].status, replies[0].body) == (replies[1].status, replies[1].body), value
    assert replies[0].status == 201
    assert both[0][1].put("/api/parameters/shovel/%s/s0" % mine, {"value": {
        "src-uri": "amqp:///" + theirs, "src-queue": "q", "dest-uri": "amqp:///" + mine}}).body == {
        "error": "bad_request", "reason": 'Validation failed\n\nuser "%s" may not connect to vhost "%s"\n' % (
            user, theirs)}
    for admin, _as_user in both:
        assert [item["name"] for item in admin.get("/api/parameters/shovel/" + mine).body] == ["s5"]


def test_federation_upstreams_are_checked_beyond_rabbitmq(sides):
    (hutch, hutch_user), (_rabbit, rabbit_user) = sides[0]
    _user, mine, theirs = sides[1]
    value = {"value": {"uri": "amqp:///" + theirs}}
    path = "/api/parameters/federation-upstream/%s/up" % segment(mine)
    assert rabbit_user.put(path, value).status == 201
    reply = hutch_user.put(path, value)
    assert reply.status == 400 and "may not connect to vhost" in reply.body["reason"]


def test_the_owner_in_an_export_is_ignored_by_rabbitmqs_import(sides):
    (hutch, hutch_user), (rabbit, _rabbit_user) = sides[0]
    user, mine, _theirs = sides[1]
    value = {"src-uri": "amqp:///" + mine, "src-queue": "q", "dest-uri": "amqp:///" + mine, "dest-queue": "q2"}
    assert hutch_user.put("/api/parameters/shovel/%s/s" % mine, {"value": value}).status == 201
    exported = hutch.get("/api/definitions/" + mine).body
    assert [item["user_who_performed_action"] for item in exported["parameters"]] == [user]
    assert rabbit.post("/api/definitions/" + mine, {"parameters": exported["parameters"]}).status == 204
    assert rabbit.get("/api/parameters/shovel/%s/s" % mine).body == hutch.get(
        "/api/parameters/shovel/%s/s" % mine).body
