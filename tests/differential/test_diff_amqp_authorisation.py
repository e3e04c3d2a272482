"""AMQP permissions, a generated matrix, differential: every operation that
needs a permission (declare, delete, bind and unbind at both ends, publish,
consume, get, purge, and topic permissions on publish and on bind), run by
users whose permission patterns allow it or deny it, on hutch and on RabbitMQ
3.10: the same reply or the same channel error (code and text) on both.

Each user gets fresh objects made by the administrator (guest) in "/", and
each operation runs on its own connection, so an operation's outcome depends
only on the permissions. Besides agreeing with RabbitMQ, the outcomes must
follow the rule each operation states (`NEEDS`): a user denied a permission the
operation needs is refused with 403, any other user is not.
"""
from __future__ import annotations

import re

import pika
import pytest

from helpers import unique
from http_api import Api, segment

from .conftest import rabbitmq_management
from .diffkit import ScenarioRun, op

pytestmark = pytest.mark.differential

# operation, and what it needs: {(permission, object)}; the names are the
# scenario's words (made by `objects` before each user runs them)
OPERATIONS = [
    (op("exchange.declare", exchange="{nx}"), {("configure", "nx")}),
    (op("queue.declare", queue="{nq}"), {("configure", "nq")}),
    (op("exchange.delete", exchange="{dx}"), {("configure", "dx")}),
    (op("queue.delete", queue="{dq}"), {("configure", "dq")}),
    (op("queue.bind", queue="{q}", exchange="{x}", routing_key="k2"), {("write", "q"), ("read", "x")}),
    (op("queue.unbind", queue="{q}", exchange="{x}", routing_key="k"), {("write", "q"), ("read", "x")}),
    (op("exchange.bind", destination="{x2}", source="{x}", routing_key="k2"), {("write", "x2"), ("read", "x")}),
    (op("exchange.unbind", destination="{x2}", source="{x}", routing_key="k"), {("write", "x2"), ("read", "x")}),
    (op("basic.publish", exchange="{x}", routing_key="k", body="m"), {("write", "x")}),
    (op("basic.get", queue="{q}"), {("read", "q")}),
    (op("basic.consume", queue="{q}", consumer_tag="c"), {("read", "q")}),
    (op("queue.purge", queue="{q}"), {("read", "q")}),
    (op("basic.publish", exchange="amq.topic", routing_key="a.x", body="m"), {("write", "amq.topic"),
                                                                              ("topic-write", "a.x")}),
    (op("basic.publish", exchange="amq.topic", routing_key="b.x", body="m"), {("write", "amq.topic"),
                                                                              ("topic-write", "b.x")}),
    (op("queue.bind", queue="{q}", exchange="amq.topic", routing_key="a.x"), {("write", "q"), ("read", "amq.topic"),
                                                                             ("topic-read", "a.x")}),
    (op("queue.bind", queue="{q}", exchange="amq.topic", routing_key="b.x"), {("write", "q"), ("read", "amq.topic"),
                                                                             ("topic-read", "b.x")}),
]

# user: (configure, write, read) patterns, and topic permissions on amq.topic (write, read) or None.
# Patterns search names ("diff-<run>-<word>"); "[-]" keeps rabbitmqctl-style leading dashes out.
USERS = {
    "everything": ((".*", ".*", ".*"), None),
    "no configure": (("^$", ".*", ".*"), None),
    "no write": ((".*", "^$", ".*"), None),
    "no read": ((".*", ".*", "^$"), None),
    "reads queue q only": ((".*", ".*", "[-]q$"), None),
    "writes exchange x only": ((".*", "[-]x$", ".*"), None),
    "topic keys a.*": ((".*", ".*", ".*"), (r"^a\.", r"^a\.")),
}


WORDS = ("x", "x2", "dx", "q", "dq", "nx", "nq")


class _UserRun(ScenarioRun):
    """A scenario of run `run_id` on the objects the administrator made: it
    knows all their names (so a delivery from exchange x reads `{x}` even
    when the operation names only q) and leaves them for the administrator
    to delete."""

    def __init__(self, url: str, run_id: str) -> None:
        super().__init__(url)
        self.run_id = run_id
        for word in WORDS:
            self.name(word)

    def cleanup(self) -> None:
        pass


def _allowed(needs: set, patterns: tuple, topic: tuple | None, names: dict) -> bool:
    """The rule: every permission the operation needs matches its object's name."""
    configure, write, read = patterns
    for permission, obj in needs:
        if permission.startswith("topic-"):
            if topic is not None and not re.search(topic[0 if permission == "topic-write" else 1], obj):
                return False
            continue
        pattern = {"configure": configure, "write": write, "read": read}[permission]
        if not re.search(pattern, names.get(obj, obj)):
            return False
    return True


def _objects(url: str, run: _UserRun) -> list[str]:
    """The user's objects, made by the administrator: exchanges x, x2, dx,
    queues q, dq, bindings x -> q and x -> x2 with key k."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    n = run.name
    for exchange in ("x", "x2", "dx"):
        channel.exchange_declare(n(exchange), "direct")
    for queue in ("q", "dq"):
        channel.queue_declare(n(queue))
    channel.queue_bind(n("q"), n("x"), "k")
    channel.exchange_bind(n("x2"), n("x"), "k")
    connection.close()
    return [n(word) for word in WORDS]


def _delete(url: str, names: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for name in names:
        channel.queue_delete(name)
        channel.exchange_delete(name)
    connection.close()


@pytest.fixture
def users(api, broker, rabbitmq_url):
    """{label: (hutch AMQP URL, RabbitMQ AMQP URL)} of one new user per USERS entry on both brokers."""
    port, credentials = rabbitmq_management(rabbitmq_url)
    sides = [(api, "127.0.0.1:%d" % broker.port), (Api(port, credentials), rabbitmq_url.split("@", 1)[1].rstrip("/"))]
    made, urls = [], {}
    for label, (patterns, topic) in USERS.items():
        name = unique("amqpauthz")
        made.append(name)
        for side, _host in sides:
            assert side.put("/api/users/" + name, {"password": "pw", "tags": ""}).status in (201, 204)
            assert side.put("/api/permissions/%2F/" + name, dict(zip(("configure", "write", "read"), patterns))
                            ).status in (201, 204)
            if topic is not None:
                assert side.put("/api/topic-permissions/%2F/" + segment(name),
                                {"exchange": "amq.topic", "write": topic[0], "read": topic[1]}).status in (201, 204)
        urls[label] = tuple("amqp://%s:pw@%s/" % (name, host) for _side, host in sides)
    yield urls
    for name in made:
        for side, _host in sides:
            side.delete("/api/users/" + name)


def test_every_operation_is_allowed_and_denied_as_rabbitmq_does(users, broker, rabbitmq_url):
    differences, broken_rule = [], []
    for label, (patterns, topic) in USERS.items():
        observed = []
        for admin_url, user_url in zip((broker.url, rabbitmq_url), users[label]):
            run_id = unique("r").split("-")[1]
            setup = _UserRun(admin_url, run_id)
            made = _objects(admin_url, setup)
            outcomes = []
            try:
                for operation, _needs in OPERATIONS:
                    outcomes.append(_UserRun(user_url, run_id).run([operation]))
            finally:
                _delete(admin_url, made)
            observed.append((outcomes, dict(setup.names)))
        (hutch, names), (rabbit, _names) = observed
        for (operation, needs), got, want in zip(OPERATIONS, hutch, rabbit):
            what = "%s %s as a user with %s" % (operation[0], operation[1], label)
            if got != want:
                differences.append("%s: hutch %s, RabbitMQ %s" % (what, got, want))
            refused = [o for o in got if o[0] == "channel-error" and o[1] == 403]
            if _allowed(needs, patterns, topic, names) == bool(refused):
                broken_rule.append("%s: %s" % (what, got))
    assert differences == [], "\n".join(differences)
    assert broken_rule == [], "\n".join(broken_rule)
