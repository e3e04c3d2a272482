"""A definitions export taken from the real RabbitMQ, at test time, imports
into hutch, and the user created on RabbitMQ logs in to hutch with the
password it was given there (its salted SHA-256 hash carried over)."""
from __future__ import annotations

import json

import pika
import pytest

from helpers import unique
from http_api import call, segment

pytestmark = pytest.mark.differential


def test_rabbitmq_export_imports_into_hutch_and_users_log_in(rabbitmq_api, start_broker):
    port, credentials = rabbitmq_api
    user, vhost, queue = unique("diffuser"), unique("diffvh"), unique("diffq")
    created = [("/api/users/" + user, {"password": "from-rabbit", "tags": "management"}),
               ("/api/vhosts/" + vhost, {}),
               ("/api/permissions/%s/%s" % (vhost, user), {"configure": ".*", "write": ".*", "read": ".*"}),
               ("/api/queues/%s/%s" % (vhost, queue), {"durable": True, "arguments": {"x-max-length": 3}}),
               # RabbitMQ exports an operator policy as a parameter of component "operator_policy"
               ("/api/operator-policies/%s/cap" % vhost, {"pattern": "^diffq", "definition": {"max-length": 2},
                                                        "apply-to": "queues"})]
    try:
        for path, body in created:
            assert call(port, "PUT", path, body, auth=credentials).status in (201, 204), path
        exported = call(port, "GET", "/api/definitions", auth=credentials).body
        broker = start_broker(expect=("AMQP", "HTTP"))
        assert call(broker.ports["HTTP"], "POST", "/api/definitions", exported).status == 204
        params = pika.ConnectionParameters("127.0.0.1", broker.port, vhost,
                                           pika.PlainCredentials(user, "from-rabbit"))
        connection = pika.BlockingConnection(params)
        ok = connection.channel().queue_declare(queue, passive=True)
        assert ok.method.queue == queue
        connection.close()
        shown = call(broker.ports["HTTP"], "GET", "/api/queues/%s/%s" % (segment(vhost), queue)).body
        assert shown["arguments"] == {"x-max-length": 3}
        assert shown["operator_policy"] == "cap" and shown["effective_policy_definition"] == {"max-length": 2}
        policies = call(broker.ports["HTTP"], "GET", "/api/operator-policies/" + vhost).body
        assert [(p["name"], p["definition"]) for p in policies] == [("cap", {"max-length": 2})]
        # and hutch's export of it is RabbitMQ's shape
        again = call(broker.ports["HTTP"], "GET", "/api/definitions").body
        assert [p for p in again["parameters"] if p["component"] == "operator_policy" and p["vhost"] == vhost] == \
            [p for p in exported["parameters"] if p["component"] == "operator_policy" and p["vhost"] == vhost]
    finally:
        call(port, "DELETE", "/api/vhosts/" + vhost, auth=credentials)
        call(port, "DELETE", "/api/users/" + user, auth=credentials)


def test_the_user_who_creates_a_vhost_gets_full_permissions_on_it(rabbitmq_api, broker):
    """RabbitMQ's put_vhost: the API's user gets configure/write/read ".*" on
    a vhost it creates (by PUT or by a definitions import), none on one that
    already existed, and no topic permissions. The same on both brokers."""
    rabbit_port, rabbit_credentials = rabbitmq_api

    def scenario(port: int, credentials: tuple) -> list:
        admin, put_made, imported = unique("creator"), unique("putvh"), unique("importvh")
        observed = []
        try:
            assert call(port, "PUT", "/api/users/" + admin, {"password": "pw", "tags": "administrator"},
                        auth=credentials).status == 201
            as_admin = (admin, "pw")
            observed.append(call(port, "PUT", "/api/vhosts/" + put_made, {"description": "d"}, auth=as_admin).status)
            observed.append(call(port, "POST", "/api/definitions", {"vhosts": [{"name": imported}]},
                                 auth=as_admin).status)
            for vhost in (put_made, imported):
                observed.append(call(port, "GET", "/api/vhosts/%s/permissions" % vhost, auth=as_admin).body)
                observed.append(call(port, "GET", "/api/vhosts/%s/topic-permissions" % vhost, auth=as_admin).body)
            observed.append(call(port, "DELETE", "/api/permissions/%s/%s" % (put_made, admin), auth=as_admin).status)
            observed.append(call(port, "PUT", "/api/vhosts/" + put_made, {"description": "e"}, auth=as_admin).status)
            observed.append(call(port, "GET", "/api/vhosts/%s/permissions" % put_made, auth=as_admin).body)
        finally:
            for vhost in (put_made, imported):
                call(port, "DELETE", "/api/vhosts/" + vhost, auth=credentials)
            call(port, "DELETE", "/api/users/" + admin, auth=credentials)
        return json.loads(json.dumps(observed).replace(admin, "ADMIN").replace(put_made, "PUT-MADE")
                          .replace(imported, "IMPORTED"))

    hutch = scenario(broker.ports["HTTP"], ("guest", "guest"))
    rabbit = scenario(rabbit_port, rabbit_credentials)
    assert hutch == rabbit
    full = {"user": "ADMIN", "configure": ".*", "write": ".*", "read": ".*"}
    assert hutch == [201, 204, [{"vhost": "PUT-MADE", **full}], [], [{"vhost": "IMPORTED", **full}], [], 204, 204, []]
