"""Policies: validation with rabbitmqctl's reasons, which single policy applies
to which queue or exchange (priority, pattern, apply-to), re-evaluation when
policies change and when queues and exchanges are declared, alternate-exchange
by policy end to end (the argument wins), and durability across a restart of
a broker process. (How a queue honours its policy's TTL, limits and DLX is
tested with that queue feature.)
"""
from __future__ import annotations

import re

import pytest

from helpers import connect, publish_sync, unique
from live_broker import LiveBroker
from storage.definitions import DefinitionStore
from vhosts import Broker


@pytest.fixture
def prefix(live):
    """A fresh name prefix; the policies set under it are cleared afterwards."""
    name = unique("p")
    yield name
    for policy in live.admin(lambda b: b.list_policies("/")):
        if policy.name.startswith(name):
            live.admin(lambda b: b.clear_policy("/", policy.name))


def queue_policy(live, name: str):
    return live.admin(lambda b: b.vhosts["/"].queues[name].policy)


def exchange_policy(live, name: str):
    return live.admin(lambda b: b.vhosts["/"].exchanges[name].policy)


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
def test_definitions_are_validated_with_rabbitmqctls_reasons(live, prefix, definition, reason):
    with pytest.raises(ValueError, match="^%s$" % re.escape(reason)):
        live.admin(lambda b: b.set_policy("/", prefix, "^x", definition))
    assert not [p for p in live.admin(lambda b: b.list_policies("/")) if p.name == prefix]


def test_rabbitmq_keys_without_effect_in_hutch_are_accepted(live, prefix):
    """So that RabbitMQ definitions with mirroring or lazy-queue policies import."""
    live.admin(lambda b: b.set_policy("/", prefix, "^" + prefix, {"ha-mode": "all", "queue-mode": "lazy"}))
    assert [p.definition for p in live.admin(lambda b: b.list_policies("/")) if p.name == prefix] == [
        {"ha-mode": "all", "queue-mode": "lazy"}]


def test_apply_to_and_pattern_are_validated(live, prefix):
    with pytest.raises(ValueError, match="apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'"):
        live.admin(lambda b: b.set_policy("/", prefix, "^x", {"max-length": 1}, apply_to="bogus"))
    with pytest.raises(ValueError, match="pattern should be regular expression but is invalid"):
        live.admin(lambda b: b.set_policy("/", prefix, "(", {"max-length": 1}))
    with pytest.raises(LookupError, match="Parameter does not exist"):
        live.admin(lambda b: b.clear_policy("/", prefix + "-missing"))


def test_the_highest_priority_matching_policy_applies_and_follows_changes(live, prefix):
    channel = connect(live.port).channel()
    q = prefix + "-q"
    channel.queue_declare(q, exclusive=True)
    assert queue_policy(live, q) is None
    live.admin(lambda b: b.set_policy("/", prefix + "-low", "^" + prefix, {"max-length": 1}, priority=1))
    assert queue_policy(live, q) == {"max-length": 1}  # an existing queue gets it at once
    live.admin(lambda b: b.set_policy("/", prefix + "-high", "q$", {"message-ttl": 5}, priority=2))
    assert queue_policy(live, q) == {"message-ttl": 5}  # one policy, not a merge
    other = prefix + "-other"
    channel.queue_declare(other, exclusive=True)
    assert queue_policy(live, other) == {"max-length": 1}  # a new queue gets its policy when declared
    live.admin(lambda b: b.set_policy("/", prefix + "-high", "q$", {"message-ttl": 5}, priority=0))
    assert queue_policy(live, q) == {"max-length": 1}
    live.admin(lambda b: b.clear_policy("/", prefix + "-low"))
    assert queue_policy(live, q) == {"message-ttl": 5}
    live.admin(lambda b: b.clear_policy("/", prefix + "-high"))
    assert queue_policy(live, q) is None


def test_apply_to_chooses_queues_or_exchanges(live, prefix):
    channel = connect(live.port).channel()
    channel.queue_declare(prefix, exclusive=True)
    channel.exchange_declare(prefix, "direct", auto_delete=True)
    live.admin(lambda b: b.set_policy("/", prefix + "-x", "^" + prefix, {"alternate-exchange": "ae"},
                                      priority=5, apply_to="exchanges"))
    live.admin(lambda b: b.set_policy("/", prefix + "-q", "^" + prefix, {"max-length": 3}, apply_to="queues"))
    assert exchange_policy(live, prefix) == {"alternate-exchange": "ae"}
    assert queue_policy(live, prefix) == {"max-length": 3}
    live.admin(lambda b: b.set_policy("/", prefix + "-all", "^" + prefix, {"message-ttl": 1}, priority=9))
    assert exchange_policy(live, prefix) == queue_policy(live, prefix) == {"message-ttl": 1}


def test_alternate_exchange_by_policy_and_the_argument_wins(live, prefix):
    channel = connect(live.port).channel()
    by_policy, by_argument = prefix + "-q1", prefix + "-q2"
    for q in (by_policy, by_argument):
        channel.queue_declare(q, exclusive=True)
        channel.exchange_declare(q + "-ae", "fanout", auto_delete=True)
        channel.queue_bind(q, q + "-ae")
    plain = prefix + "-x"
    channel.exchange_declare(plain, "direct")
    with_argument = prefix + "-xa"
    channel.exchange_declare(with_argument, "direct", arguments={"alternate-exchange": by_argument + "-ae"})
    live.admin(lambda b: b.set_policy("/", prefix, "^" + prefix + "-x", {"alternate-exchange": by_policy + "-ae"},
                                      apply_to="exchanges"))
    publish_sync(channel, plain, "unroutable")
    publish_sync(channel, with_argument, "unroutable")
    assert channel.queue_declare(by_policy, passive=True).method.message_count == 1
    assert channel.queue_declare(by_argument, passive=True).method.message_count == 1
    live.admin(lambda b: b.clear_policy("/", prefix))
    publish_sync(channel, plain, "unroutable")
    assert channel.queue_declare(by_policy, passive=True).method.message_count == 1
    channel.exchange_delete(plain)
    channel.exchange_delete(with_argument)


def test_policies_survive_a_restart(tmp_path, start_broker):
    live = LiveBroker(str(tmp_path / "data"))
    try:
        channel = connect(live.port).channel()
        channel.queue_declare("kept", durable=True)
        channel.exchange_declare("ae", "fanout", durable=True)
        channel.queue_bind("kept", "ae")
        live.admin(lambda b: b.set_policy("/", "ae-policy", "^x", {"alternate-exchange": "ae"}, 3, "exchanges"))
    finally:
        live.stop()
    proc = start_broker("--data-dir", str(tmp_path / "data"))
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
