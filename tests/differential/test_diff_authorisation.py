"""The management API's authorisation matrix, differential: every route and
method of amqp_server/management/routes.py (one row each in
management_matrix.py, which must cover them all), asked by a user of each tag
(none, management, policymaker, monitoring, administrator), with and without
permissions in the vhost concerned, on hutch and on RabbitMQ 3.10: the same
status on both, except where a row says hutch differs on purpose. hutch's own
routes are checked against the tag rule their row states.

The world (a vhost, its queue, exchange, binding, policies, an upstream, a
target user, limits, an open connection) is made with the same names on both
brokers; what a successful delete removed is restored before the next user.
"""
from __future__ import annotations

import json

import pytest

from helpers import unique
from http_api import Api, call

from amqp_server.management.routes import ROUTES as TABLE

from .conftest import rabbitmq_management
from .management_matrix import ROWS, TAGS, USERS, World

pytestmark = pytest.mark.differential

ROUTES = {("/" + "/".join(pattern), method) for pattern, methods in TABLE for method in methods}
GRANTED = {"management": set(TAGS) - {"none"}, "policymaker": {"policymaker", "administrator"},
           "monitoring": {"monitoring", "administrator"}, "administrator": {"administrator"}}


def test_every_route_and_method_has_a_row():
    """A route cannot join routes.py without its row (nor a row outlive its route)."""
    assert sorted(ROUTES - set(ROWS)) == [], "routes without a row in management_matrix.ROWS"
    assert sorted(set(ROWS) - ROUTES) == [], "rows for routes that do not exist"


@pytest.fixture(scope="module")
def worlds(broker, rabbitmq_url):
    port, credentials = rabbitmq_management(rabbitmq_url)
    hutch_api, rabbit_api = Api(broker.ports["HTTP"]), Api(port, credentials)
    run = unique("m").split("-")[1]
    made = []
    try:
        for api, amqp_url in ((hutch_api, broker.url), (rabbit_api, rabbitmq_url)):
            world = World(api, run, api.get("/api/overview").body["node"], amqp_url)
            made.append(world)
            world.build()
        yield made
    finally:
        for world in made:
            world.destroy()


def request(world: World, row, method: str, user: str):
    path = row.path.format_map(_Fields(world))
    body = None if row.body is None else json.loads(json.dumps(row.body).replace("{nobody}", world.names["nobody"]))
    reply = call(world.api.port, method, path, body, auth=(user, "pw"))
    if 200 <= reply.status < 300 and row.restore:
        getattr(world, row.restore)()
    return reply


class _Fields(dict):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    def __missing__(self, key: str) -> str:
        return self.world.field(key)


def _short(body) -> str:
    return json.dumps(body)[:120]


def hutch_rule(row, tag: str, with_permissions: bool) -> bool:
    """Whether a user may use one of hutch's own routes, by its row's rule:
    the route's tag; for a vhost's objects a permission there or the
    administrator tag (RabbitMQ's rule for its own per-vhost routes); for
    its messages a permission there, as for basic.get."""
    needed, scope = row.hutch
    if tag not in GRANTED[needed] or tag not in GRANTED["management"]:
        return False
    return scope is None or with_permissions or (scope == "vhost" and tag == "administrator")


def test_every_route_answers_every_user_as_rabbitmq_does(worlds):
    hutch, rabbit = worlds
    differences = []
    for (route, method), row in sorted(ROWS.items()):
        for tag, with_permissions in USERS:
            who = "%s %s permissions" % (tag, "with" if with_permissions else "without")
            got = request(hutch, row, method, hutch.users[(tag, with_permissions)])
            if row.hutch is not None:
                allowed = hutch_rule(row, tag, with_permissions)
                if (got.status != 401) != allowed or (got.status >= 500):
                    differences.append("%s %s, %s: hutch %s, its rule: %s"
                                       % (method, route, who, got.status, "allowed" if allowed else "401"))
                continue
            reference = request(rabbit, row, method, rabbit.users[(tag, with_permissions)])
            want = reference.status
            if row.deviation is not None and (tag, with_permissions) in row.deviation[1]:
                want = row.deviation[1][(tag, with_permissions)]
            if got.status != want:
                differences.append("%s %s, %s: hutch %s %s, RabbitMQ %s %s"
                                   % (method, route, who, got.status, _short(got.body), want, _short(reference.body)))
    assert differences == [], "\n".join(differences)
