"""The firehose against RabbitMQ's: the same publishes, gets and deliveries
with tracing on give the same trace messages, routing keys, bodies and
headers with the same wire types and order (node, connection and vhost
names aside)."""
from __future__ import annotations

import pika
import pytest

import firehose_scenario

pytestmark = pytest.mark.differential


def test_trace_messages_are_rabbitmqs(rabbitmq_url, rabbitmq_api, broker):
    port, credentials = rabbitmq_api
    ours = firehose_scenario.run(broker.port, broker.ports["HTTP"])
    theirs = firehose_scenario.run(pika.URLParameters(rabbitmq_url).port, port, credentials)
    assert firehose_scenario.normalised(ours) == firehose_scenario.normalised(theirs)
