"""A definitions export taken from the real RabbitMQ, at test time, imports
into hutch, and the user created on RabbitMQ logs in to hutch with the
password it was given there (its salted SHA-256 hash carried over)."""
from __future__ import annotations

import os
from urllib.parse import urlparse

import pika
import pytest

from helpers import unique
from http_api import call, segment

pytestmark = pytest.mark.differential


@pytest.fixture
def rabbitmq_api(rabbitmq_url):
    """(port, credentials) of the reference RabbitMQ's management API."""
    url = urlparse(os.environ.get("DIFFERENTIAL_RABBITMQ_API") or "http://127.0.0.1:15672")
    credentials = (urlparse(rabbitmq_url).username or "guest", urlparse(rabbitmq_url).password or "guest")
    if call(url.port, "GET", "/api/overview", auth=credentials).status != 200:
        pytest.skip("no RabbitMQ management API at %s" % url.geturl())
    return url.port, credentials


def test_rabbitmq_export_imports_into_hutch_and_users_log_in(rabbitmq_api, start_broker):
    port, credentials = rabbitmq_api
    user, vhost, queue = unique("diffuser"), unique("diffvh"), unique("diffq")
    created = [("/api/users/" + user, {"password": "from-rabbit", "tags": "management"}),
               ("/api/vhosts/" + vhost, {}),
               ("/api/permissions/%s/%s" % (vhost, user), {"configure": ".*", "write": ".*", "read": ".*"}),
               ("/api/queues/%s/%s" % (vhost, queue), {"durable": True, "arguments": {"x-max-length": 3}})]
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
    finally:
        call(port, "DELETE", "/api/vhosts/" + vhost, auth=credentials)
        call(port, "DELETE", "/api/users/" + user, auth=credentials)
