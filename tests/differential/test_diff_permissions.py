"""Permission checks, differential: the same user (same name, same permission
patterns, same topic permissions) on hutch and on the reference RabbitMQ runs
the same scenario, and every reply and error text must be the same.

Patterns search names (RabbitMQ's semantics): scenario names are
"diff-<hex run id>-<word>", so "[-]w" finds words starting with w, and so on (no leading dash: rabbitmqctl
would read it as a flag).
Users are made with rabbitmqctl on RabbitMQ and through the domain on hutch's
`live` broker, and deleted from RabbitMQ afterwards.
"""
from __future__ import annotations

import subprocess

import pytest

from helpers import unique
from vhosts.users import Permission

from .diffkit import op, run_scenario

pytestmark = pytest.mark.differential


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def as_user(rabbitmq_url, live):
    """as_user(configure, write, read, topic=None)(scenario) -> (hutch, RabbitMQ)
    observations of the scenario run by a new user with those permissions."""
    made = []

    def make(configure: str, write: str, read: str, topic: tuple | None = None):
        name = unique("diffuser")
        made.append(name)
        rabbitmqctl("add_user", name, "pw")
        rabbitmqctl("set_permissions", "-p", "/", name, configure, write, read)
        live.admin(lambda b: b.add_user(name, "pw"))
        live.admin(lambda b: b.set_permissions(name, "/", Permission(configure, write, read)))
        if topic is not None:
            rabbitmqctl("set_topic_permissions", "-p", "/", name, *topic)
            live.admin(lambda b: b.set_topic_permissions(name, "/", *topic))
        host = rabbitmq_url.split("@", 1)[1]

        def run(scenario: list) -> tuple[list, list]:
            hutch = run_scenario("amqp://%s:pw@127.0.0.1:%d/" % (name, live.port), scenario)
            return hutch, run_scenario("amqp://%s:pw@%s" % (name, host), scenario)

        return run

    yield make
    for name in made:
        rabbitmqctl("delete_user", name)


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
