"""Policies: validation with rabbitmqctl's reasons, which single policy applies
to which queue or exchange (priority, pattern, apply-to), re-evaluation when
policies change and when queues and exchanges are declared, alternate-exchange
by policy end to end (the argument wins), and durability across a restart of
a broker process, all through the management API of a broker process. (How
a queue honours its policy's TTL, limits and DLX is tested with that queue
feature.)
"""
from __future__ import annotations

import html

import pytest

from helpers import connect, publish_sync, unique
from http_api import Api
from storage.definitions import DefinitionStore
from vhosts import Broker


def set_policy(api, name: str, pattern: str, definition, priority: int = 0, apply_to: str = "all"):
    return api.put("/api/policies/%2F/" + name, {"pattern": pattern, "definition": definition,
                                                 "priority": priority, "apply-to": apply_to})


def put_policy(api, *args, **kwargs) -> None:
    assert set_policy(api, *args, **kwargs).status in (201, 204)


@pytest.fixture
def prefix(api):
    """A fresh name prefix; the policies set under it are cleared afterwards."""
    name = unique("p")
    yield name
    for policy in api.get("/api/policies/%2F").body:
        if policy["name"].startswith(name):
            api.delete("/api/policies/%2F/" + policy["name"])


def queue_policy(api, name: str):
    """The definition of the policy that applies to queue `name` (None: none)."""
    return api.get("/api/queues/%2F/" + name).body["effective_policy_definition"] or None


def exchange_policy(api, name: str):
    policy = api.get("/api/exchanges/%2F/" + name).body.get("policy")
    return api.get("/api/policies/%2F/" + policy).body["definition"] if policy else None


def validation_failed(reply, reason: str) -> bool:
    """RabbitMQ's answer to an invalid policy (its reason escaped for HTML)."""
    return (reply.status, reply.body) == (
        400, {"error": "bad_request", "reason": "Validation failed\n\n%s\n" % html.escape(reason, quote=False)})


@pytest.mark.parametrize("definition, reason", [
    ({}, "no policy provided"),
    ({"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
    ({"message-ttl": "x"}, '<<"x">> is not a valid message TTL'),
    ({"message-ttl": -1}, "-1 is not a valid message TTL"),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"max-length-bytes": 1.5}, "1.5 is not a valid maximum length in bytes"),
    ({"overflow": "bad"}, '<<"bad">> is not a valid overflow value'),
    ({"dead-letter-exchange": 1}, "1 is not a valid dead letter exchange name"),
    ({"alternate-exchange": 1}, "1 is not a valid alternate exchange name"),
    ({"delivery-limit": "x"}, '<<"x">> is not a valid delivery limit'),
    ({"delivery-limit": True}, "true is not a valid delivery limit"),
])
def test_definitions_are_validated_with_rabbitmqctls_reasons(api, prefix, definition, reason):
    assert validation_failed(set_policy(api, prefix, "^x", definition), reason)
    assert api.get("/api/policies/%2F/" + prefix).status == 404


def test_rabbitmq_keys_without_effect_in_hutch_are_accepted(api, prefix):
    """So that RabbitMQ definitions with mirroring or lazy-queue policies import."""
    put_policy(api, prefix, "^" + prefix, {"ha-mode": "all", "queue-mode": "lazy"})
    assert api.get("/api/policies/%2F/" + prefix).body["definition"] == {"ha-mode": "all", "queue-mode": "lazy"}


def test_apply_to_and_pattern_are_validated(api, prefix):
    assert validation_failed(set_policy(api, prefix, "^x", {"max-length": 1}, apply_to="bogus"),
                             "apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'")
    reply = set_policy(api, prefix, "(", {"max-length": 1})
    assert reply.status == 400 and "pattern should be regular expression but is invalid" in reply.body["reason"]
    assert api.delete("/api/policies/%2F/" + prefix + "-missing").status == 404


def test_the_highest_priority_matching_policy_applies_and_follows_changes(api, broker, prefix):
    channel = connect(broker.port).channel()
    q = prefix + "-q"
    channel.queue_declare(q, exclusive=True)
    assert queue_policy(api, q) is None
    put_policy(api, prefix + "-low", "^" + prefix, {"max-length": 1}, priority=1)
    assert queue_policy(api, q) == {"max-length": 1}  # an existing queue gets it at once
    put_policy(api, prefix + "-high", "q$", {"message-ttl": 5}, priority=2)
    assert queue_policy(api, q) == {"message-ttl": 5}  # one policy, not a merge
    other = prefix + "-other"
    channel.queue_declare(other, exclusive=True)
    assert queue_policy(api, other) == {"max-length": 1}  # a new queue gets its policy when declared
    put_policy(api, prefix + "-high", "q$", {"message-ttl": 5}, priority=0)
    assert queue_policy(api, q) == {"max-length": 1}
    api.delete("/api/policies/%2F/" + prefix + "-low")
    assert queue_policy(api, q) == {"message-ttl": 5}
    api.delete("/api/policies/%2F/" + prefix + "-high")
    assert queue_policy(api, q) is None


def test_apply_to_chooses_queues_or_exchanges(api, broker, prefix):
    channel = connect(broker.port).channel()
    channel.queue_declare(prefix, exclusive=True)
    channel.exchange_declare(prefix, "direct", auto_delete=True)
    put_policy(api, prefix + "-x", "^" + prefix, {"alternate-exchange": "ae"}, priority=5, apply_to="exchanges")
    put_policy(api, prefix + "-q", "^" + prefix, {"max-length": 3}, apply_to="queues")
    assert exchange_policy(api, prefix) == {"alternate-exchange": "ae"}
    assert queue_policy(api, prefix) == {"max-length": 3}
    put_policy(api, prefix + "-all", "^" + prefix, {"message-ttl": 1}, priority=9)
    assert exchange_policy(api, prefix) == queue_policy(api, prefix) == {"message-ttl": 1}


def test_alternate_exchange_by_policy_and_the_argument_wins(api, broker, prefix):
    channel = connect(broker.port).channel()
    by_policy, by_argument = prefix + "-q1", prefix + "-q2"
    for q in (by_policy, by_argument):
        channel.queue_declare(q, exclusive=True)
        channel.exchange_declare(q + "-ae", "fanout", auto_delete=True)
        channel.queue_bind(q, q + "-ae")
    plain = prefix + "-x"
    channel.exchange_declare(plain, "direct")
    with_argument = prefix + "-xa"
    channel.exchange_declare(with_argument, "direct", arguments={"alternate-exchange": by_argument + "-ae"})
    put_policy(api, prefix, "^" + prefix + "-x", {"alternate-exchange": by_policy + "-ae"}, apply_to="exchanges")
    publish_sync(channel, plain, "unroutable")
    publish_sync(channel, with_argument, "unroutable")
    assert channel.queue_declare(by_policy, passive=True).method.message_count == 1
    assert channel.queue_declare(by_argument, passive=True).method.message_count == 1
    api.delete("/api/policies/%2F/" + prefix)
    publish_sync(channel, plain, "unroutable")
    assert channel.queue_declare(by_policy, passive=True).method.message_count == 1
    channel.exchange_delete(plain)
    channel.exchange_delete(with_argument)


def test_policies_survive_a_restart(start_broker):
    first = start_broker(expect=("AMQP", "HTTP"))
    channel = connect(first.port).channel()
    channel.queue_declare("kept", durable=True)
    channel.exchange_declare("ae", "fanout", durable=True)
    channel.queue_bind("kept", "ae")
    put_policy(Api(first.ports["HTTP"]), "ae-policy", "^x", {"alternate-exchange": "ae"}, 3, "exchanges")
    first.stop()
    proc = start_broker("--data-dir", str(first.data_dir))
    channel = connect(proc.port).channel()
    channel.exchange_declare("x", "direct")  # declared after the restart: the stored policy applies
    publish_sync(channel, "x", "unroutable")
    assert channel.queue_declare("kept", passive=True).method.message_count == 1


def test_restored_queues_and_exchanges_get_their_policies(tmp_path):
    path = str(tmp_path / "definitions.db")
    store = DefinitionStore(path)
    broker = Broker("guest", "guest", "/", [], definitions=store)
    broker.vhosts["/"].declare_queue("kept", None, durable=True)
    broker.vhosts["/"].declare_exchange("kept-x", "topic", durable=True)
    broker.set_policy("/", "queues", "^kept$", {"max-length": 10}, apply_to="queues")
    broker.set_policy("/", "all", "^kept", {"alternate-exchange": "ae"}, priority=-1)
    store.close()
    store = DefinitionStore(path)
    restored = Broker("guest", "guest", "/", [], definitions=store)
    vhost = restored.vhosts["/"]
    assert vhost.queues["kept"].policy == {"max-length": 10}
    assert vhost.exchanges["kept-x"].alternate_exchange == "ae"
    assert sorted(p.name for p in restored.list_policies()) == ["all", "queues"]
    restored.delete_vhost("/")
    assert store.load().policies == []
    store.close()
