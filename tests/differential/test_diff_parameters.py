"""Runtime parameters, global parameters and operator policies over the
management API, differential: the same requests to hutch and to RabbitMQ
3.10 (with its shovel and federation plugins) answer with the same status
and body, valid values and refused ones alike.

Each test works in a vhost of its own on both brokers, deleted afterwards.
"""
from __future__ import annotations

import pytest

from helpers import unique
from http_api import segment

pytestmark = pytest.mark.differential

SHOVEL = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2"}


@pytest.fixture
def both(vhost_on_both):
    """(hutch Api, RabbitMQ Api, vhost path segment)."""
    hutch, rabbit, name = vhost_on_both
    return hutch, rabbit, segment(name)


def same(both, method: str, path: str, body=None):
    """Send to both; assert the same status and body; return hutch's reply."""
    hutch, rabbit, _vhost = both
    ours = getattr(hutch, method)(path, body)
    theirs = getattr(rabbit, method)(path, body)
    assert (ours.status, ours.body) == (theirs.status, theirs.body), path
    return ours


INVALID_SHOVELS = [
    {"src-uri": "amqp://"},
    {"src-uri": "amqp://", "src-queue": "q", "src-exchange": "x", "dest-uri": "amqp://"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-queue": "a", "dest-exchange": "x"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "ack-mode": "bad"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-prefetch-count": "x"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-delete-after": "bad"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-delete-after": -1},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-delete-after": 5, "ack-mode": "no-ack"},
    {"src-uri": "xx://", "src-queue": "q", "dest-uri": "amqp://"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "foo": 1},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-publish-properties": "x"},
    {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-publish-properties": {"foo": 1}},
    {"src-uri": 5, "src-exchange": 5, "src-exchange-key": 5, "src-prefetch-count": "a", "src-delete-after": "b",
     "dest-uri": 5, "dest-exchange": 5, "dest-exchange-key": 5, "dest-add-forward-headers": 5,
     "dest-add-timestamp-header": 5, "dest-publish-properties": 5, "ack-mode": 5, "reconnect-delay": "c"},
    {"dest-queue": 5, "src-queue": 5, "prefetch-count": "a", "delete-after": "x", "add-forward-headers": 1,
     "add-timestamp-header": 1, "publish-properties": 1},
]

INVALID_UPSTREAMS = [
    {"max-hops": 2},
    {"uri": 5},
    {"uri": "bad://"},
    {"uri": "amqp://", "foo": 1},
    {"uri": "amqp://", "ack-mode": "x", "trust-user-id": "y", "prefetch-count": "z", "queue": 5, "exchange": 5,
     "reconnect-delay": "a", "max-hops": "b", "expires": "c", "message-ttl": "d"},
]


@pytest.mark.parametrize("value", INVALID_SHOVELS)
def test_invalid_shovel(both, value):
    reply = same(both, "put", "/api/parameters/shovel/%s/p" % both[2], {"value": value})
    assert reply.status == 400


@pytest.mark.parametrize("value", INVALID_UPSTREAMS)
def test_invalid_upstream(both, value):
    reply = same(both, "put", "/api/parameters/federation-upstream/%s/u" % both[2], {"value": value})
    assert reply.status == 400


@pytest.mark.parametrize("value", [[{"x": "u1"}], [{"upstream": "u1", "foo": 1}],
                                   [{"upstream": 5, "exchange": 5}]])
def test_invalid_upstream_set(both, value):
    reply = same(both, "put", "/api/parameters/federation-upstream-set/%s/s" % both[2], {"value": value})
    assert reply.status == 400


def test_request_errors(both):
    vhost = both[2]
    same(both, "put", "/api/parameters/nosuch/%s/p" % vhost, {"value": {"a": 1}})
    same(both, "put", "/api/parameters/shovel/%s/p" % vhost, {"valu": {"a": 1}})
    same(both, "put", "/api/parameters/shovel/%s/p" % segment(unique("novhost")), {"value": SHOVEL})
    same(both, "get", "/api/parameters/shovel/%s/nosuch" % vhost)
    same(both, "delete", "/api/parameters/shovel/%s/nosuch" % vhost)
    same(both, "get", "/api/parameters/shovel/%s" % segment(unique("novhost")))
    same(both, "put", "/api/global-parameters/%s" % unique("g"), {"x": 1})
    same(both, "get", "/api/global-parameters/%s" % unique("g"))


def test_lifecycle(both):
    """Created, listed (by component and vhost), replaced, read, deleted: the
    same answers, with the value's keys in RabbitMQ's order."""
    vhost = both[2]
    upstream = {"uri": "amqp://localhost", "max-hops": 2, "trust-user-id": True, "expires": 1000}
    assert same(both, "put", "/api/parameters/shovel/%s/s1" % vhost, {"value": SHOVEL}).status == 201
    assert same(both, "put", "/api/parameters/federation-upstream/%s/u1" % vhost, {"value": upstream}).status == 201
    assert same(both, "put", "/api/parameters/federation-upstream-set/%s/set1" % vhost,
                {"value": [{"upstream": "u1"}]}).status == 201
    assert same(both, "put", "/api/parameters/federation-upstream/%s/u1" % vhost,
                {"value": dict(upstream, uri=["amqp://a", "amqp://b"])}).status == 204
    same(both, "get", "/api/parameters/shovel/%s" % vhost)
    same(both, "get", "/api/parameters/federation-upstream/%s/u1" % vhost)
    same(both, "get", "/api/parameters/federation-upstream-set/%s" % vhost)
    hutch, rabbit, _ = both
    mine = [p for p in hutch.get("/api/parameters").body if p["vhost"] == vhost.replace("%2F", "/")]
    theirs = [p for p in rabbit.get("/api/parameters").body if p["vhost"] == vhost.replace("%2F", "/")]
    assert mine == theirs and len(mine) == 3
    for component, name in (("shovel", "s1"), ("federation-upstream", "u1"), ("federation-upstream-set", "set1")):
        assert same(both, "delete", "/api/parameters/%s/%s/%s" % (component, vhost, name)).status == 204
    same(both, "get", "/api/parameters/shovel/%s" % vhost)


def test_vhost_limits_are_listed_as_parameters(both):
    vhost = both[2]
    assert same(both, "put", "/api/vhost-limits/%s/max-queues" % vhost, {"value": 5}).status == 204
    same(both, "get", "/api/parameters/vhost-limits/%s" % vhost)
    same(both, "get", "/api/parameters/vhost-limits/%s/limits" % vhost)


def test_global_parameters(both):
    name = unique("g")
    assert same(both, "put", "/api/global-parameters/" + name, {"value": {"b": [1, "x"], "a": None}}).status == 201
    assert same(both, "put", "/api/global-parameters/" + name, {"value": "text"}).status == 204
    same(both, "get", "/api/global-parameters/" + name)
    hutch, rabbit, _ = both
    listed = {g["name"] for g in hutch.get("/api/global-parameters").body}
    assert {name, "internal_cluster_id"} <= listed
    assert same(both, "delete", "/api/global-parameters/" + name).status == 204
    same(both, "delete", "/api/global-parameters/" + name)


@pytest.mark.parametrize("body", [
    {"pattern": "^a", "definition": {"max-length": 5, "dead-letter-exchange": "x"}},
    {"pattern": "^a", "definition": {"overflow": "reject-publish"}},
    {"pattern": "^a", "definition": {"max-length": "x"}},
    {"pattern": "^a", "definition": {}},
    {"pattern": "^a", "definition": {"max-length": 1}, "apply-to": "x"},
])
def test_invalid_operator_policies(both, body):
    assert same(both, "put", "/api/operator-policies/%s/op" % both[2], body).status == 400


def test_operator_policy_lifecycle(both):
    vhost = both[2]
    body = {"pattern": "^a", "apply-to": "queues", "priority": 3,
            "definition": {"max-length": 5, "message-ttl": 100, "expires": 1000, "max-length-bytes": 100,
                           "delivery-limit": 3, "max-in-memory-length": 3}}
    assert same(both, "put", "/api/operator-policies/%s/op" % vhost, body).status == 201
    same(both, "get", "/api/operator-policies/%s/op" % vhost)
    same(both, "get", "/api/operator-policies/%s" % vhost)
    assert same(both, "delete", "/api/operator-policies/%s/op" % vhost).status == 204
    same(both, "get", "/api/operator-policies/%s/op" % vhost)


def test_federation_policy_keys(both):
    vhost = both[2]
    for definition in ({"federation-upstream": 5}, {"federation-upstream-set": 5},
                       {"federation-upstream-set": "all", "federation-upstream": "x"}):
        reply = same(both, "put", "/api/policies/%s/p" % vhost, {"pattern": "^a", "definition": definition})
        assert reply.status == 400
