"""Policies acting on queues, end to end: a policy set over the management API
changes what AMQP clients see (length limits, TTL, dead-lettering, delivery
limits, queue expiry), with RabbitMQ's precedence between policy and queue
arguments, at once on existing queues, and no longer once cleared."""
from __future__ import annotations

import pika
import pytest

from helpers import connect, wait_for
from http_api import segment


@pytest.fixture
def ch(broker, vhost):
    connection = connect(broker.port, virtual_host=vhost)
    yield connection.channel()
    connection.close()


def set_policy(api, vhost: str, name: str, pattern: str, definition: dict, priority: int = 0) -> None:
    body = {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": "queues"}
    assert api.put("/api/policies/%s/%s" % (segment(vhost), name), body).status in (201, 204)


def clear_policy(api, vhost: str, name: str) -> None:
    assert api.delete("/api/policies/%s/%s" % (segment(vhost), name)).status == 204


def ready(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def publish(ch, queue: str, bodies, **properties) -> None:
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(**properties))


def bodies(ch, queue: str) -> list[bytes]:
    got = []
    while (reply := ch.basic_get(queue, auto_ack=True))[0] is not None:
        got.append(reply[2])
    return got


def test_max_length_policy_drops_the_head_and_trims_existing_queues(api, vhost, ch):
    ch.queue_declare("work.a")
    publish(ch, "work.a", [b"1", b"2", b"3", b"4"])
    set_policy(api, vhost, "cap", r"^work\.", {"max-length": 2})
    wait_for(lambda: ready(ch, "work.a") == 2)
    publish(ch, "work.a", [b"5"])
    assert bodies(ch, "work.a") == [b"4", b"5"]
    ch.queue_declare("work.b")  # declared after the policy: it applies too
    publish(ch, "work.b", [b"x", b"y", b"z"])
    assert bodies(ch, "work.b") == [b"y", b"z"]
    ch.queue_declare("other")  # not matched
    publish(ch, "other", [b"x", b"y", b"z"])
    assert ready(ch, "other") == 3


def test_clearing_the_policy_lifts_the_limit(api, vhost, ch):
    set_policy(api, vhost, "cap", "^q$", {"max-length": 1})
    ch.queue_declare("q")
    publish(ch, "q", [b"1", b"2"])
    assert ready(ch, "q") == 1
    clear_policy(api, vhost, "cap")
    publish(ch, "q", [b"3", b"4"])
    assert bodies(ch, "q") == [b"2", b"3", b"4"]


def test_the_smaller_limit_of_argument_and_policy_wins(api, vhost, ch):
    set_policy(api, vhost, "cap", "^q", {"max-length": 3})
    ch.queue_declare("q-arg-smaller", arguments={"x-max-length": 1})
    ch.queue_declare("q-policy-smaller", arguments={"x-max-length": 10})
    for queue in ("q-arg-smaller", "q-policy-smaller"):
        publish(ch, queue, [b"1", b"2", b"3", b"4", b"5"])
    assert ready(ch, "q-arg-smaller") == 1
    assert ready(ch, "q-policy-smaller") == 3


def test_message_ttl_and_dead_letter_exchange_from_a_policy(api, vhost, ch):
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx")
    set_policy(api, vhost, "ttl", "^short$", {"message-ttl": 50, "dead-letter-exchange": "dlx"})
    ch.queue_declare("short")
    publish(ch, "short", [b"gone"])
    wait_for(lambda: ready(ch, "dead") == 1)
    assert ready(ch, "short") == 0
    method, properties, body = ch.basic_get("dead", auto_ack=True)
    death = properties.headers["x-death"][0]
    assert (body, death["reason"], death["queue"], properties.headers["x-first-death-reason"]) == (
        b"gone", "expired", "short", "expired")


def test_a_dead_letter_exchange_argument_wins_over_the_policy(api, vhost, ch):
    for exchange, queue in (("from-policy", "dead-policy"), ("from-argument", "dead-argument")):
        ch.exchange_declare(exchange, "fanout")
        ch.queue_declare(queue)
        ch.queue_bind(queue, exchange)
    set_policy(api, vhost, "dl", "^src$", {"dead-letter-exchange": "from-policy"})
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "from-argument"})
    publish(ch, "src", [b"m"])
    method, _properties, _body = ch.basic_get("src")
    ch.basic_reject(method.delivery_tag, requeue=False)
    wait_for(lambda: ready(ch, "dead-argument") == 1)
    assert ready(ch, "dead-policy") == 0


def test_delivery_limit_policy_dead_letters_after_that_many_redeliveries(api, vhost, ch):
    ch.exchange_declare("dlx", "fanout")
    ch.queue_declare("dead")
    ch.queue_bind("dead", "dlx")
    set_policy(api, vhost, "limit", "^retry$", {"delivery-limit": 1, "dead-letter-exchange": "dlx"})
    ch.queue_declare("retry")
    publish(ch, "retry", [b"m"])
    for _ in range(2):
        method, _properties, _body = ch.basic_get("retry")
        ch.basic_nack(method.delivery_tag, requeue=True)
    wait_for(lambda: ready(ch, "dead") == 1)
    _method, properties, _body = ch.basic_get("dead", auto_ack=True)
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert ready(ch, "retry") == 0


def test_expires_policy_deletes_an_unused_queue(api, vhost, ch):
    set_policy(api, vhost, "exp", "^idle$", {"expires": 100})
    ch.queue_declare("idle")
    wait_for(lambda: api.get("/api/queues/%s/idle" % segment(vhost)).status == 404)
