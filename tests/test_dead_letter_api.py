"""GET /api/hutch/dead-letters/{vhost}: the dead-letter log over HTTP, for
a real broker and real clients, authorised like the rest of the API."""
from __future__ import annotations

import pytest

from dead_letter_clients import delete_vhost, new_vhost
from helpers import unique
from http_api import Api, segment

PATH = "/api/hutch/dead-letters/"


@pytest.fixture
def api(broker) -> Api:
    return Api(broker.ports["HTTP"])


@pytest.fixture
def vhost(broker):
    name = new_vhost(broker)
    yield name
    delete_vhost(broker, name)


@pytest.fixture
def user(api):
    """Make a user with the given tags and (optionally) permissions in a vhost."""
    made = []

    def make(tags: str, vhost: str | None = None) -> Api:
        name = unique("dlu")
        api.put("/api/users/" + name, {"password": "pw", "tags": tags})
        if vhost is not None:
            api.put("/api/permissions/%s/%s" % (segment(vhost), name), {"configure": "", "write": "", "read": ".*"})
        made.append(name)
        return api.as_user(name, "pw")

    yield make
    for name in made:
        api.delete("/api/users/" + name)


def test_an_empty_log_answers_its_bounds(api, vhost):
    reply = api.get(PATH + segment(vhost))
    assert (reply.status, reply.body) == (200, {"first_offset": 0, "next_offset": 0, "records": []})
    assert api.get(PATH + segment(vhost) + "?start=5&limit=0").body["records"] == []


def test_unknown_vhost_is_404_in_rabbitmq_shape(api):
    reply = api.get(PATH + segment(unique("nope")))
    assert (reply.status, reply.body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_bad_offsets_are_400(api, vhost):
    for query in ("?start=x", "?start=-1", "?limit=many"):
        reply = api.get(PATH + segment(vhost) + query)
        assert reply.status == 400 and reply.body["error"] == "bad_request", query


def test_authorised_like_the_rest_of_the_api(api, vhost, user, broker):
    assert Api(broker.ports["HTTP"], auth=None).get(PATH + segment(vhost)).status == 401
    assert user("", vhost).get(PATH + segment(vhost)).body == {
        "error": "not_authorised", "reason": "Not management user"}
    assert user("management").get(PATH + segment(vhost)).body == {
        "error": "not_authorised", "reason": "User not authorised to access virtual host"}
    assert user("management", vhost).get(PATH + segment(vhost)).status == 200
    # a vhost's own routes need a permission there or the administrator tag (RabbitMQ's rule)
    assert user("monitoring").get(PATH + segment(vhost)).body == {
        "error": "not_authorised", "reason": "User not authorised to access virtual host"}
    assert user("monitoring", vhost).get(PATH + segment(vhost)).status == 200
    assert user("administrator").get(PATH + segment(vhost)).status == 200


def test_disabled_log_is_404_with_a_reason(start_broker):
    broker = start_broker("--dead-letter-log-enabled", "false", expect=("AMQP", "HTTP"))
    reply = Api(broker.ports["HTTP"]).get(PATH + segment("/"))
    assert (reply.status, reply.body["error"]) == (404, "not_found")
    assert "disabled" in reply.body["reason"]
