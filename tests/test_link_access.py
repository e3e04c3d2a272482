"""Who may point a shovel or a federation upstream at which vhost
(amqp_server.links.access, docs/security.md): the user who sets one must be
allowed to connect to every vhost of this broker its URIs name, host-less
("amqp:///b", which the link reaches as the default administrator) or naming
this broker's listener; the link checks that user again before every
session and while it runs, and stops with the reason when access is gone.
tests/differential/test_links_access.py compares the refusal with
RabbitMQ 3.10.8's."""
from __future__ import annotations

import json

import pytest

from amqp_server.links.access import names_this_broker
from amqp_server.links.client import LocalNode
from helpers import confirm_channel_in, unique, wait_for
from http_api import Api, segment
from hutchctl_targets import hutch_target

pytestmark = pytest.mark.timeout(120)

ALL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture
def policymaker(api):
    """(user name, its Api): a policymaker user with no permission yet,
    deleted after the test."""
    name = unique("pm")
    assert api.put("/api/users/" + name, {"password": "pw", "tags": "policymaker"}).status == 201
    yield name, api.as_user(name, "pw")
    api.delete("/api/users/" + name)


def ready_in(broker, vhost: str, queue: str) -> int:
    connection, channel = confirm_channel_in(broker, vhost)
    try:
        return channel.queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def fill(broker, vhost: str, queue: str, count: int) -> None:
    connection, channel = confirm_channel_in(broker, vhost)
    channel.queue_declare(queue, durable=True)
    for i in range(count):
        channel.basic_publish("", queue, b"%d" % i)
    connection.close()


def shovel_state(api, vhost: str, name: str, state: str) -> dict:
    def found():
        for status in api.get("/api/shovels/" + segment(vhost)).body:
            if status["name"] == name and status["state"] == state:
                return status
        return None
    return wait_for(found, 30, what="shovel %s %s" % (name, state))


def test_a_user_cannot_point_a_link_at_a_vhost_it_may_not_use(broker, api, make_vhost, policymaker):
    mine, theirs = make_vhost(), make_vhost()
    user, as_user = policymaker
    assert api.put("/api/permissions/%s/%s" % (segment(mine), user), ALL).status == 201
    fill(broker, theirs, "secret", 10)
    refused = 'Validation failed\n\nuser "%s" may not connect to vhost "%s"\n' % (user, theirs)
    here = "amqp://guest:guest@127.0.0.1:%d/%s" % (broker.port, segment(theirs))
    for src in ("amqp:///" + segment(theirs), ["amqp:///" + segment(mine), "amqp:///" + segment(theirs)], here,
                "amqp://guest:guest@localhost:%d/%s" % (broker.port, segment(theirs))):
        reply = as_user.put("/api/parameters/shovel/%s/steal" % segment(mine), {"value": {
            "src-uri": src, "src-queue": "secret", "dest-uri": "amqp:///" + segment(mine), "dest-queue": "loot"}})
        assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": refused}), src
    # the destination is checked too, and a missing vhost is refused like a forbidden one
    reply = as_user.put("/api/parameters/shovel/%s/push" % segment(mine), {"value": {
        "src-uri": "amqp:///" + segment(mine), "src-queue": "q", "dest-uri": "amqp:///nosuch-" + mine}})
    assert reply.body["reason"] == 'Validation failed\n\nuser "%s" may not connect to vhost "nosuch-%s"\n' % (
        user, mine)
    # beyond RabbitMQ, which accepts it: a federation upstream is checked the same way
    reply = as_user.put("/api/parameters/federation-upstream/%s/up" % segment(mine),
                        {"value": {"uri": "amqp:///" + segment(theirs)}})
    assert (reply.status, reply.body["reason"]) == (400, refused)
    assert api.get("/api/parameters/shovel/" + segment(mine)).body == []
    assert api.get("/api/parameters/federation-upstream/" + segment(mine)).body == []
    assert ready_in(broker, theirs, "secret") == 10
    # its own vhost, and another broker, are fine
    assert as_user.put("/api/parameters/federation-upstream/%s/up" % segment(mine),
                       {"value": {"uri": ["amqp:///" + segment(mine), "amqp://elsewhere.invalid/x"]}}).status == 201
    assert as_user.put("/api/parameters/shovel/%s/own" % segment(mine), {"value": {
        "src-uri": "amqp:///" + segment(mine), "src-queue": "a", "dest-uri": "amqp:///" + segment(mine),
        "dest-queue": "b"}}).status == 201
    shovel_state(api, mine, "own", "running")


def test_a_shovel_stops_when_its_user_loses_access_and_resumes_when_it_is_back(broker, api, make_vhost,
                                                                                policymaker):
    mine, theirs = make_vhost(), make_vhost()
    user, as_user = policymaker
    for vhost in (mine, theirs):
        assert api.put("/api/permissions/%s/%s" % (segment(vhost), user), ALL).status == 201
    fill(broker, theirs, "outbox", 0)
    assert as_user.put("/api/parameters/shovel/%s/pull" % segment(mine), {"value": {
        "src-uri": "amqp:///" + segment(theirs), "src-queue": "outbox", "dest-uri": "amqp:///" + segment(mine),
        "dest-queue": "inbox", "reconnect-delay": 0.2}}).status == 201
    shovel_state(api, mine, "pull", "running")
    fill(broker, theirs, "outbox", 5)
    wait_for(lambda: ready_in(broker, mine, "inbox") == 5, 30)

    assert api.delete("/api/permissions/%s/%s" % (segment(theirs), user)).status == 204
    status = shovel_state(api, mine, "pull", "terminated")
    assert status["reason"] == 'the user who set it lost access: user "%s" may not connect to vhost "%s"' % (
        user, theirs)
    fill(broker, theirs, "outbox", 3)  # stays where it is while the shovel is stopped
    listed = hutch_target(broker).run("shovel_status", "--formatter", "json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [row for row in json.loads(listed.stdout) if row["vhost"] == mine]
    assert row["state"] == "terminated" and "may not connect" in row["termination_reason"]
    assert ready_in(broker, theirs, "outbox") == 3 and ready_in(broker, mine, "inbox") == 5

    assert api.put("/api/permissions/%s/%s" % (segment(theirs), user), ALL).status == 201
    shovel_state(api, mine, "pull", "running")
    wait_for(lambda: ready_in(broker, mine, "inbox") == 8, 30)

    # restarted (a new session), it checks again: the user is gone
    assert api.delete("/api/users/" + user).status == 204
    assert api.delete("/api/shovels/vhost/%s/pull/restart" % segment(mine)).status == 204
    status = shovel_state(api, mine, "pull", "terminated")
    assert status["reason"] == 'the user who set it, "%s", no longer exists' % user


def test_a_federation_link_stops_when_the_upstreams_user_loses_access(broker, api, make_vhost, policymaker):
    mine, theirs = make_vhost(), make_vhost()
    user, as_user = policymaker
    for vhost in (mine, theirs):
        assert api.put("/api/permissions/%s/%s" % (segment(vhost), user), ALL).status == 201
    assert as_user.put("/api/parameters/federation-upstream/%s/up" % segment(mine),
                       {"value": {"uri": "amqp:///" + segment(theirs), "reconnect-delay": 0.2}}).status == 201
    assert as_user.put("/api/policies/%s/fed" % segment(mine), {
        "pattern": "^fed", "apply-to": "exchanges", "definition": {"federation-upstream": "up"}}).status == 201
    connection, channel = confirm_channel_in(broker, mine)
    channel.exchange_declare("fed-x", "fanout")
    connection.close()

    def link(state):
        return next((item for item in api.get("/api/federation-links/" + segment(mine)).body
                     if item["status"] == state), None)
    wait_for(lambda: link("running"), 30)
    # losing the link's own vhost counts too: the link writes there as the default user
    assert api.delete("/api/permissions/%s/%s" % (segment(mine), user)).status == 204
    failed = wait_for(lambda: link("error"), 30)
    reason = 'the user who set it lost access: user "%s" may not connect to vhost "%s"' % (user, mine)
    assert failed["error"] == reason
    listed = hutch_target(broker).run("federation_status", "--formatter", "json")
    assert listed.returncode == 0, listed.stderr
    assert [(row["status"], row["error"]) for row in json.loads(listed.stdout) if row["vhost"] == mine] == [
        ("error", reason)]


def test_the_owner_is_kept_across_a_restart_and_through_definitions(start_broker):
    node = start_broker(expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    for vhost in ("a", "b"):
        assert api.put("/api/vhosts/" + vhost).status == 201
    assert api.put("/api/users/pm", {"password": "pw", "tags": "policymaker"}).status == 201
    for vhost in ("a", "b"):
        assert api.put("/api/permissions/%s/pm" % vhost, ALL).status == 201
    value = {"src-uri": "amqp:///b", "src-queue": "q", "dest-uri": "amqp:///a", "dest-queue": "q",
             "reconnect-delay": 0.2}
    assert api.as_user("pm", "pw").put("/api/parameters/shovel/a/s", {"value": value}).status == 201
    shovel_state(api, "a", "s", "running")
    # RabbitMQ's listing shape (no owner); the export names the owner, as RabbitMQ names the acting user
    assert api.get("/api/parameters/shovel/a/s").body == {
        "value": dict(sorted(value.items())), "vhost": "a", "component": "shovel", "name": "s"}
    (exported,) = [item for item in api.get("/api/definitions").body["parameters"] if item["name"] == "s"]
    assert exported["user_who_performed_action"] == "pm"
    assert api.get("/api/definitions/a").body["parameters"] == [exported]

    node.stop()
    node = start_broker("--data-dir", str(node.data_dir), expect=("AMQP", "HTTP"))
    api = Api(node.ports["HTTP"])
    assert api.delete("/api/permissions/b/pm").status == 204
    status = shovel_state(api, "a", "s", "terminated")
    assert 'user "pm" may not connect to vhost "b"' in status["reason"]

    # imported by guest, a parameter keeps the owner it was exported with...
    assert api.delete("/api/parameters/shovel/a/s").status == 204
    assert api.post("/api/definitions", {"parameters": [exported]}).status == 204
    status = shovel_state(api, "a", "s", "terminated")
    assert 'user "pm" may not connect to vhost "b"' in status["reason"]
    # ...and one without becomes the importing user's (guest may use both vhosts)
    del exported["user_who_performed_action"]
    assert api.post("/api/definitions/a", {"parameters": [exported]}).status == 204
    shovel_state(api, "a", "s", "running")


def test_which_uris_name_this_broker():
    local = LocalNode("127.0.0.1", 5680, "guest", "guest", tls_port=5681)
    for uri in ("amqp://", "amqp:///b", "amqp://u:p@127.0.0.1:5680/b", "amqp://localhost:5680", "amqp://[::1]:5680/b",
                "amqp://127.1.2.3:5680/b", "amqps://localhost:5681/b", "amqp://0.0.0.0:5680/b"):
        assert names_this_broker(uri, local), uri
    for uri in ("amqp://127.0.0.1/b", "amqp://localhost:56810/b", "amqps://localhost/b",
                "amqp://example.invalid:5680/b", "amqp://10.1.2.3:5680/b"):
        assert not names_this_broker(uri, local), uri
    assert names_this_broker("amqp://localhost/b", LocalNode("127.0.0.1", 5672, "guest", "guest"))
