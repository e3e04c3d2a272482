"""Definitions export and import: hutch's own export imports into a fresh
broker (and survives its restart), a RabbitMQ 3.10 export imports and its
users log in with their RabbitMQ passwords, bad documents change nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pika
import pytest
from pika.exceptions import ProbableAuthenticationError

from helpers import unique
from http_api import Api, segment

RABBITMQ_EXPORT = Path(__file__).parent / "data" / "rabbitmq-3.10-definitions.json"
# Users in that export and their passwords on the RabbitMQ it came from.
RABBITMQ_USERS = {"hutch-import-user": "s3cret", "mprobe": "pw", "guest": "guest"}


def http(broker) -> Api:
    return Api(broker.ports["HTTP"])


def login(broker, user: str, password: str, vhost: str = "/") -> None:
    params = pika.ConnectionParameters("127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, password))
    pika.BlockingConnection(params).close()


def populate(api: Api) -> str:
    """A vhost with a user, a queue with arguments, exchanges and bindings."""
    vhost = unique("defs")
    v = segment(vhost)
    api.put("/api/vhosts/" + v, {"description": "populated", "tags": "defs,test"})
    api.put("/api/permissions/%s/guest" % v, {"configure": ".*", "write": ".*", "read": ".*"})
    api.put("/api/users/alice", {"password": "alice-pw", "tags": "management"})
    api.put("/api/permissions/%s/alice" % v, {"configure": "^a", "write": ".*", "read": "^r"})
    api.put("/api/queues/%s/orders" % v, {"durable": True, "arguments": {"x-max-length": 5}})
    api.put("/api/queues/%s/scratch" % v, {"durable": False})
    api.put("/api/exchanges/%s/events" % v, {"type": "topic", "durable": True})
    api.put("/api/exchanges/%s/fan" % v, {"type": "fanout", "durable": True})
    api.post("/api/bindings/%s/e/events/q/orders" % v, {"routing_key": "order.*", "arguments": {"k": "v"}})
    api.post("/api/bindings/%s/e/events/e/fan" % v, {"routing_key": "#"})
    api.put("/api/topic-permissions/%s/alice" % v, {"exchange": "events", "write": "^alice\\.", "read": ".*"})
    api.put("/api/vhost-limits/%s/max-queues" % v, {"value": 50})
    api.put("/api/user-limits/alice/max-channels", {"value": 7})
    api.put("/api/policies/%s/cap" % v, {"pattern": "^ord", "definition": {"max-length": 9}, "priority": 2,
                                         "apply-to": "queues"})
    return vhost


def test_export_imports_into_a_fresh_broker(start_broker):
    first = start_broker(expect=("AMQP", "HTTP"))
    vhost = populate(http(first))
    exported = http(first).get("/api/definitions").body
    assert {"name": vhost, "metadata": {"description": "populated", "tags": ["defs", "test"]}} in exported["vhosts"]
    assert {"user": "alice", "vhost": vhost, "configure": "^a", "write": ".*", "read": "^r"} in exported["permissions"]
    assert {"name": "orders", "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": {"x-max-length": 5}} in exported["queues"]
    assert not [x for x in exported["exchanges"] if x["name"].startswith("amq.")]
    assert {"user": "alice", "vhost": vhost, "exchange": "events", "write": "^alice\\.", "read": ".*"} in \
        exported["topic_permissions"]
    assert {"value": {"max-queues": 50}, "vhost": vhost, "component": "vhost-limits", "name": "limits"} in \
        exported["parameters"]
    assert {"vhost": vhost, "name": "cap", "pattern": "^ord", "apply-to": "queues", "definition": {"max-length": 9},
            "priority": 2} in exported["policies"]
    assert {u["name"]: u["limits"] for u in exported["users"]}["alice"] == {"max-channels": 7}
    second = start_broker(expect=("AMQP", "HTTP"))
    assert http(second).post("/api/definitions", exported).status == 204
    again = http(second).get("/api/definitions").body
    for section in ("vhosts", "permissions", "topic_permissions", "parameters", "policies", "queues", "exchanges",
                    "bindings"):
        assert sorted(map(json.dumps, again[section])) == sorted(map(json.dumps, exported[section])), section
    assert {u["name"]: u["password_hash"] for u in again["users"]}["alice"] == \
        {u["name"]: u["password_hash"] for u in exported["users"]}["alice"]
    login(second, "alice", "alice-pw", vhost)
    # the import is durable: a restart keeps it
    second.stop()
    third = start_broker("--data-dir", str(second.data_dir), expect=("AMQP", "HTTP"))
    assert http(third).get("/api/queues/%s/orders" % segment(vhost)).body["arguments"] == {"x-max-length": 5}
    assert http(third).get("/api/queues/%s/orders" % segment(vhost)).body["policy"] == "cap"
    assert http(third).get("/api/user-limits/alice").body == [{"user": "alice", "value": {"max-channels": 7}}]
    assert http(third).get("/api/vhosts/" + segment(vhost)).body["metadata"] == {
        "description": "populated", "tags": ["defs", "test"]}
    login(third, "alice", "alice-pw", vhost)


def test_vhost_metadata_imports_from_top_level_keys_or_a_metadata_object(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = http(broker)
    document = {"vhosts": [{"name": "flat", "description": "top", "tags": "t1,t2"},
                           {"name": "nested", "metadata": {"description": "meta", "tags": ["m1"]}}]}
    assert api.post("/api/definitions", document).status == 204
    shown = {v["name"]: (v["description"], v["tags"]) for v in api.get("/api/vhosts").body}
    assert (shown["flat"], shown["nested"]) == (("top", ["t1", "t2"]), ("meta", ["m1"]))
    bad = {"vhosts": [{"name": "bad", "metadata": {"tags": 3}}]}
    assert api.post("/api/definitions", bad).status == 400
    assert api.get("/api/vhosts/bad").status == 404


def test_vhost_export_and_import(start_broker):
    first = start_broker(expect=("AMQP", "HTTP"))
    vhost = populate(http(first))
    exported = http(first).get("/api/definitions/" + segment(vhost)).body
    assert set(exported) >= {"queues", "exchanges", "bindings"} and "users" not in exported
    assert all("vhost" not in item for item in exported["queues"])
    second = start_broker(expect=("AMQP", "HTTP"))
    target = unique("target")
    http(second).put("/api/vhosts/" + target)
    http(second).put("/api/permissions/%s/guest" % target, {"configure": ".*", "write": ".*", "read": ".*"})
    assert http(second).post("/api/definitions/" + target, exported).status == 204
    assert exported["policies"][0]["name"] == "cap" and exported["parameters"][0]["value"] == {"max-queues": 50}
    names = sorted(q["name"] for q in http(second).get("/api/queues/" + target).body)
    assert names == ["orders", "scratch"]
    assert [(p["vhost"], p["name"]) for p in http(second).get("/api/policies/" + target).body] == [(target, "cap")]
    assert http(second).get("/api/vhost-limits/" + target).body == [{"vhost": target, "value": {"max-queues": 50}}]
    bindings = http(second).get("/api/bindings/" + target).body
    assert {"events"} == {b["source"] for b in bindings if b["source"]}


def test_rabbitmq_export_imports_and_its_users_log_in(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    document = json.loads(RABBITMQ_EXPORT.read_text())
    api = http(broker)
    assert api.post("/api/definitions", document).status == 204
    for user, password in RABBITMQ_USERS.items():
        vhost = "mgmtprobe"
        login(broker, user, password, vhost)
    with pytest.raises(ProbableAuthenticationError):
        login(broker, "hutch-import-user", "wrong", "mgmtprobe")
    assert api.get("/api/users/hutch-import-user").body["tags"] == ["management"]
    assert api.get("/api/permissions/mgmtprobe/hutch-import-user").body["configure"] == "^imp"
    queue = api.get("/api/queues/mgmtprobe/imp.q").body
    assert (queue["durable"], queue["arguments"]) == (True, {"x-message-ttl": 60000})
    bindings = api.get("/api/exchanges/mgmtprobe/imp.x/bindings/source").body
    assert {(b["destination_type"], b["destination"], b["routing_key"], json.dumps(b["arguments"]))
            for b in bindings} == {("queue", "imp.q", "k", '{"a": "b"}'), ("exchange", "amq.topic", "k2", "{}")}
    policy = api.get("/api/policies/probe-hc/pol1").body
    assert (policy["pattern"], policy["apply-to"], policy["priority"], policy["definition"]) == (
        "^q", "queues", 3, {"dead-letter-exchange": "x", "max-length": 5})
    assert api.get("/api/policies/mgmtprobe/p1").body["definition"] == {"max-length": 100}
    # a queue name with a space and a tab survives the trip
    assert api.get("/api/queues/probe-hc/" + segment("q 2\ttab")).status == 200


def test_bad_documents_change_nothing(start_broker):
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = http(broker)
    before = api.get("/api/definitions").body
    reply = api.post("/api/definitions", raw=b"[1]")
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "failed_to_parse_json"})
    reply = api.post("/api/definitions", {"users": [{"name": "eve", "password": "x", "tags": ""}],
                                          "queues": [{"name": "q", "vhost": "nowhere"}]})
    assert (reply.status, reply.body["error"]) == (400, "bad_request")
    assert "no_such_vhost" in reply.body["reason"]
    reply = api.post("/api/definitions", {"users": [{"name": "eve", "password_hash": "x", "tags": "",
                                                     "hashing_algorithm": "rabbit_password_hashing_md5"}]})
    assert reply.status == 400
    for bad in ({"policies": [{"vhost": "/", "name": "p", "pattern": "x", "definition": {"bogus": 1}}]},
                {"parameters": [{"vhost": "/", "component": "vhost-limits", "name": "limits",
                                 "value": {"max-bogus": 1}}]},
                {"topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "x", "write": "(", "read": ""}]},
                {"users": [{"name": "eve", "password": "x", "tags": "", "limits": {"max-channels": "x"}}]}):
        reply = api.post("/api/definitions", dict(bad, vhosts=[{"name": "new"}]))
        assert reply.status == 400, bad
    assert api.get("/api/definitions").body == before


def test_cleared_limits_and_runtime_parameters_import(start_broker):
    """RabbitMQ exports limits all cleared as []; runtime parameters (here a
    federation upstream) and global parameters are kept, exported and
    durable, as are operator policies; a parameter of a component hutch does not know is refused with
    RabbitMQ's reason and changes nothing."""
    broker = start_broker(expect=("AMQP", "HTTP"))
    api = http(broker)
    api.put("/api/vhost-limits/%2F/max-queues", {"value": 10})
    upstream = {"value": {"uri": "amqp://elsewhere"}, "vhost": "/", "component": "federation-upstream", "name": "up"}
    document = {"parameters": [{"value": [], "vhost": "/", "component": "vhost-limits", "name": "limits"}, upstream],
                "global_parameters": [{"name": "site", "value": {"region": "eu"}},
                                      {"name": "internal_cluster_id", "value": "another-node"}]}
    assert api.post("/api/definitions", document).status == 204
    assert api.get("/api/vhost-limits/%2F").body == []
    before = api.get("/api/definitions").body
    assert before["parameters"] == [dict(upstream, user_who_performed_action="guest")]  # the importer owns it
    assert {"name": "site", "value": {"region": "eu"}} in before["global_parameters"]
    own_id = api.get("/api/global-parameters/internal_cluster_id").body["value"]
    assert own_id.startswith("hutch-cluster-id-")  # the node's own identity is not imported
    refused = api.post("/api/definitions", {"parameters": [dict(upstream, component="nosuch", name="x")]})
    assert (refused.status, refused.body["reason"]) == (400, "Validation failed\n\ncomponent nosuch not found\n")
    operator_policy = {"pattern": "^q", "definition": {"max-length": 3}, "apply-to": "queues", "priority": 1}
    assert api.put("/api/operator-policies/%2F/cap", operator_policy).status == 201
    broker.stop()
    again = http(start_broker("--data-dir", str(broker.data_dir), expect=("AMQP", "HTTP")))
    assert again.get("/api/operator-policies/%2F/cap").body == dict(operator_policy, vhost="/", name="cap")
    # the owner kept too; the operator policy exported as RabbitMQ 3.10 exports one: a parameter
    assert again.get("/api/definitions").body["parameters"] == before["parameters"] + [
        {"value": operator_policy, "vhost": "/", "component": "operator_policy", "name": "cap"}]
    assert again.get("/api/global-parameters/site").body == {"value": {"region": "eu"}, "name": "site"}
