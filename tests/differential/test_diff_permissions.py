"""Permission checks, differential: the same user (same name, same permission
patterns, same topic permissions) on hutch and on the reference RabbitMQ runs
the same scenario, and every reply and error text must be the same.

Patterns search names (RabbitMQ's semantics): scenario names are
"diff-<hex run id>-<word>", so "[-]w" finds words starting with w, and so on (no leading dash: rabbitmqctl
would read it as a flag).
Users are made through the management API on RabbitMQ and on hutch's
session broker, and deleted from both afterwards.
"""
from __future__ import annotations

import pytest

from helpers import unique
from http_api import Api

from .diffkit import op, run_scenario

pytestmark = pytest.mark.differential


@pytest.fixture
def as_user(rabbitmq_url, rabbitmq_api, api, broker):
    """as_user(configure, write, read, topic=None)(scenario) -> (hutch, RabbitMQ)
    observations of the scenario run by a new user with those permissions."""
    made = []
    rabbit = Api(*rabbitmq_api)

    def make(configure: str, write: str, read: str, topic: tuple | None = None):
        name = unique("diffuser")
        made.append(name)
        for side in (rabbit, api):
            assert side.put("/api/users/" + name, {"password": "pw", "tags": ""}).status == 201
            assert side.put("/api/permissions/%2F/" + name,
                            {"configure": configure, "write": write, "read": read}).status in (201, 204)
            if topic is not None:
                exchange, write_keys, read_keys = topic
                assert side.put("/api/topic-permissions/%2F/" + name,
                                {"exchange": exchange, "write": write_keys, "read": read_keys}).status in (201, 204)
        host = rabbitmq_url.split("@", 1)[1]

        def run(scenario: list) -> tuple[list, list]:
            hutch = run_scenario("amqp://%s:pw@127.0.0.1:%d/" % (name, broker.port), scenario)
            return hutch, run_scenario("amqp://%s:pw@%s" % (name, host), scenario)

        return run

    yield make
    for name in made:
        for side in (rabbit, api):
            side.delete("/api/users/" + name)


def test_write_and_read_permissions(as_user):
    run = as_user(".*", "[-]w", "[-]r")
    hutch, rabbit = run([
        op("queue.declare", queue="{wq}"),
        op("queue.declare", queue="{rq}"),
        op("exchange.declare", exchange="{wx}"),
        op("exchange.declare", exchange="{rx}"),
        op("exchange.declare", exchange="{x}"),
        op("basic.publish", exchange="", routing_key="{wq}", body="m"),
        op("basic.publish", exchange="{wx}", routing_key="k", body="m"),
        op("basic.publish", exchange="{x}", routing_key="k", body="m"),
        op("basic.publish", exchange="{wnope}", routing_key="k", body="m"),
        op("basic.publish", exchange="{nope}", routing_key="k", body="m"),
        op("queue.bind", queue="{wq}", exchange="{rx}", routing_key="k"),
        op("queue.bind", queue="{rq}", exchange="{rx}", routing_key="k"),
        op("queue.bind", queue="{wq}", exchange="{x}", routing_key="k"),
        op("queue.bind", queue="{wq}", exchange="", routing_key="k"),
        op("queue.bind", queue="{wq}", exchange="{rnope}", routing_key="k"),
        op("queue.unbind", queue="{rq}", exchange="{rx}", routing_key="k"),
        op("queue.unbind", queue="{wq}", exchange="{rx}", routing_key="k"),
        op("exchange.bind", destination="{wx}", source="{rx}", routing_key="k"),
        op("exchange.bind", destination="{x}", source="{rx}", routing_key="k"),
        op("exchange.bind", destination="{wx}", source="{x}", routing_key="k"),
        op("exchange.unbind", destination="{wx}", source="{rx}", routing_key="k"),
        op("basic.get", queue="{rq}"),
        op("basic.get", queue="{wq}"),
        op("queue.purge", queue="{rq}"),
        op("queue.purge", queue="{wq}"),
        op("basic.consume", queue="{wq}", consumer_tag="c1"),
        op("basic.consume", queue="{rq}", consumer_tag="c2"),
        op("queue.declare", queue="{wq2}", arguments={"x-dead-letter-exchange": "{x}"}),
        op("queue.declare", queue="{rq2}", arguments={"x-dead-letter-exchange": "{x}"}),
        op("queue.declare", queue="{rq3}", arguments={"x-dead-letter-exchange": "{wx}"}),
        op("exchange.declare", exchange="{rx2}", arguments={"alternate-exchange": "{x}"}),
        op("exchange.declare", exchange="{x2}", arguments={"alternate-exchange": "{wx}"}),
        op("exchange.declare", exchange="{rx3}", arguments={"alternate-exchange": "{wx}"}),
        op("queue.delete", queue="{rq}"),
        op("exchange.delete", exchange="{x}"),
    ])
    assert hutch == rabbit


def test_configure_permission(as_user):
    run = as_user("[-]cfg", ".*", ".*")
    hutch, rabbit = run([
        op("exchange.declare", exchange="{cfgx}"),
        op("exchange.declare", exchange="{x}"),
        op("exchange.declare", exchange="amq.foo"),
        op("exchange.declare", exchange="amq.direct", passive=True),
        op("queue.declare", queue="{cfgq}"),
        op("queue.declare", queue="{q}"),
        op("queue.declare", queue="", exclusive=True),
        op("queue.declare", queue="amq.q"),
        op("queue.declare", queue="{q}", passive=True),
        op("queue.declare", queue="{cfgq}", passive=True),
        op("queue.delete", queue="{q}"),
        op("exchange.delete", exchange="{x}"),
        op("exchange.delete", exchange="amq.direct"),
        op("queue.delete", queue="{cfgq}"),
        op("exchange.delete", exchange="{cfgx}"),
    ])
    assert hutch == rabbit


def test_topic_permissions(as_user):
    run = as_user(".*", ".*", ".*", topic=("amq.topic", r"^a\.{username}|^{vhost}", r"^r\."))
    hutch, rabbit = run([
        op("queue.declare", queue="{q}"),
        op("exchange.declare", exchange="{t}", exchange_type="topic"),
        op("basic.publish", exchange="amq.topic", routing_key="b.x", body="m"),
        op("basic.publish", exchange="amq.topic", routing_key="/.x", body="m"),
        op("basic.publish", exchange="amq.direct", routing_key="b.x", body="m"),
        op("basic.publish", exchange="{t}", routing_key="b.x", body="m"),
        op("queue.bind", queue="{q}", exchange="amq.topic", routing_key="r.x"),
        op("queue.bind", queue="{q}", exchange="amq.topic", routing_key="zz"),
        op("queue.unbind", queue="{q}", exchange="amq.topic", routing_key="zz"),
        op("queue.unbind", queue="{q}", exchange="amq.topic", routing_key="r.x"),
        op("exchange.bind", destination="{t}", source="amq.topic", routing_key="zz"),
        op("exchange.bind", destination="{t}", source="amq.topic", routing_key="r.y"),
    ])
    assert hutch == rabbit
