"""Differential direct reply-to (`amq.rabbitmq.reply-to`): the requester's
consume and publish, the token a replier sees, replies (plain, mandatory,
confirmed, CC), the declares and the errors, compared between hutch and
RabbitMQ 3.10. Connection 1 is the requester, connection 2 the replier; the
token appears in observations as `amq.rabbitmq.reply-to.<N>` and the
scenarios reply to it by that placeholder."""
from __future__ import annotations

import time

import pika
import pytest
from pamqp import commands

from http_api import call

from .diffkit import RawClient, op

pytestmark = pytest.mark.differential

PSEUDO = "amq.rabbitmq.reply-to"
TOKEN = "amq.rabbitmq.reply-to.<1>"


def _same(differ, scenario):
    hutch, rabbit = differ(scenario)
    assert hutch == rabbit
    return rabbit


def _request(body: str, **properties) -> list:
    """The requester publishes to {requests} asking for a direct reply; the
    replier takes the request (its reply_to is recorded)."""
    return [
        op("basic.publish", exchange="", routing_key="{requests}", body=body,
           properties={"reply_to": PSEUDO, **properties}),
        op("basic.get", queue="{requests}", auto_ack=True, on="2.1"),
    ]


def test_request_and_replies(differ):
    rabbit = _same(differ, [
        op("queue.declare", queue="{requests}"),
        op("basic.consume", queue=PSEUDO, consumer_tag="replies", auto_ack=True),
        *_request("ping", correlation_id="c1", headers={"a": 1}),
        op("queue.declare", queue=TOKEN, passive=True, on="2.1"),
        op("queue.declare", queue=PSEUDO, passive=True, on="2.1"),
        op("queue.declare", queue=PSEUDO, on="2.1"),
        op("basic.publish", exchange="", routing_key=TOKEN, body="pong", properties={"correlation_id": "c1"},
           on="2.1"),
        op("deliveries", count=1),
        # The same channel keeps its token; replies need no queue and no ack.
        *_request("ping 2", correlation_id="c2"),
        op("basic.publish", exchange="", routing_key=TOKEN, body="pong 2", on="2.1"),
        op("basic.publish", exchange="", routing_key="{nowhere}", body="pong by CC",
           properties={"headers": {"CC": [TOKEN]}}, on="2.1"),
        op("deliveries", count=2),
        # Mandatory: delivered, and returned as unroutable (not a queue).
        op("basic.publish", exchange="", routing_key=TOKEN, body="mandatory", mandatory=True, on="2.1"),
        op("deliveries", count=1),
        op("confirm.select", on="2.2"),
        op("publish_confirmed", exchange="", routing_key=TOKEN, body="confirmed", on="2.2"),
        op("deliveries", count=1),
        # Only the default exchange routes to a token; the pseudo-queue's own name is no destination.
        op("basic.publish", exchange="amq.direct", routing_key=TOKEN, body="not via amq.direct", mandatory=True,
           on="2.1"),
        op("basic.publish", exchange="", routing_key=PSEUDO, body="not to the name", mandatory=True, on="2.1"),
        op("basic.publish", exchange="", routing_key="{requests}", body="other reply_to",
           properties={"reply_to": PSEUDO + ".x"}),
        op("basic.get", queue="{requests}", auto_ack=True),
        op("basic.get", queue="{requests}", auto_ack=True),
        # Nothing else arrived: the next delivery is this one.
        op("basic.publish", exchange="", routing_key=TOKEN, body="last", on="2.1"),
        op("deliveries", count=1),
    ])
    assert ("Basic.Deliver", "replies", 1, False, "", TOKEN, "pong", {"correlation_id": "c1"}) in rabbit


def test_wrong_uses(differ):
    _same(differ, [
        op("queue.declare", queue="{requests}"),
        # Publishing with that reply_to before consuming, also in a transaction.
        op("basic.publish", exchange="", routing_key="{requests}", body="x", properties={"reply_to": PSEUDO}),
        op("tx.select"),
        op("basic.publish", exchange="", routing_key="{requests}", body="x", properties={"reply_to": PSEUDO}),
        # Checked after the exchange, before user_id and expiration.
        op("basic.publish", exchange="{missing}", routing_key="k", body="x", properties={"reply_to": PSEUDO}),
        op("basic.publish", exchange="", routing_key="{requests}", body="x",
           properties={"reply_to": PSEUDO, "user_id": "someone-else", "expiration": "soon"}),
        # Consuming in ack mode, twice, twice in ack mode.
        op("basic.consume", queue=PSEUDO, consumer_tag="acking", auto_ack=False),
        op("basic.consume", queue=PSEUDO, consumer_tag="first", auto_ack=True),
        op("basic.consume", queue=PSEUDO, consumer_tag="second", auto_ack=True),
        op("basic.consume", queue=PSEUDO, consumer_tag="first", auto_ack=True),
        op("basic.consume", queue=PSEUDO, consumer_tag="third", auto_ack=False),
        op("queue.declare", queue="{requests}", passive=True),
        # The pseudo-queue is no queue for anything else.
        op("basic.get", queue=PSEUDO),
        op("queue.bind", queue=PSEUDO, exchange="amq.direct", routing_key="k"),
        op("queue.purge", queue=PSEUDO),
        op("queue.delete", queue=PSEUDO),
        op("queue.declare", queue=PSEUDO + "-not-quite", passive=True),
        op("queue.declare", queue=PSEUDO + ".not-a-token", passive=True),
        op("basic.publish", exchange="", routing_key=PSEUDO + ".not-a-token", body="x", mandatory=True),
    ])


def test_token_outlives_nothing(differ):
    """A token dies with its consumer: after basic.cancel, channel close and
    connection close it is 404 to declare, and a reply is dropped (returned
    when mandatory); each new consume has a new token."""
    _same(differ, [
        op("queue.declare", queue="{requests}"),
        op("basic.consume", queue=PSEUDO, consumer_tag="r1", auto_ack=True),
        *_request("one"),
        op("basic.get", queue=TOKEN, on="2.1"),
        op("basic.consume", queue=TOKEN, consumer_tag="c", auto_ack=True, on="2.1"),
        op("basic.cancel", consumer_tag="r1"),
        op("queue.declare", queue=TOKEN, passive=True, on="2.1"),
        op("basic.publish", exchange="", routing_key=TOKEN, body="after cancel", mandatory=True, on="2.1"),
        # Consuming again: a new token (<2>), the old one stays dead.
        op("basic.consume", queue=PSEUDO, consumer_tag="r2", auto_ack=True),
        *_request("two"),
        op("basic.publish", exchange="", routing_key="amq.rabbitmq.reply-to.<2>", body="to r2", on="2.1"),
        op("deliveries", count=1),
        op("channel.open"),  # closes the requester's channel
        op("queue.declare", queue="amq.rabbitmq.reply-to.<2>", passive=True, on="2.1"),
        op("basic.publish", exchange="", routing_key="amq.rabbitmq.reply-to.<2>", body="after close",
           mandatory=True, on="2.1"),
        op("basic.consume", queue=PSEUDO, consumer_tag="r3", auto_ack=True),
        *_request("three"),
        op("connection.close", on="1"),
        op("queue.declare", queue="amq.rabbitmq.reply-to.<3>", passive=True, on="2.1"),
        op("confirm.select", on="2.2"),
        op("publish_confirmed", exchange="", routing_key="amq.rabbitmq.reply-to.<3>", body="after connection",
           on="2.2"),
    ])


def _consumer_tags(host: str, port: int) -> list:
    """The reply consumer's tag beside queue consumers' tags (raw frames:
    pika refuses to reuse a tag client-side)."""
    observed = []
    client = RawClient(host, port)
    try:
        observed += client.handshake()
        client.open_channel(1)
        client.send_frame(commands.Queue.Declare(queue="", exclusive=True), 1)
        queue = client.expect(commands.Queue.DeclareOk, 1).queue
        steps = [
            commands.Basic.Consume(queue=PSEUDO, consumer_tag="X", no_ack=True),
            commands.Basic.Consume(queue=queue, consumer_tag="X", no_ack=True),
            commands.Basic.Cancel(consumer_tag="X"),  # the reply consumer
            commands.Basic.Cancel(consumer_tag="X"),  # the queue's
            commands.Basic.Consume(queue=PSEUDO, consumer_tag="", no_ack=True, nowait=True),
            commands.Basic.Consume(queue=queue, consumer_tag="Y", no_ack=True),
            commands.Queue.Declare(queue=PSEUDO, passive=True),
        ]
        for method in steps:
            client.send_frame(method, 1)
            if not getattr(method, "nowait", False):
                reply = client.read_frame()[1]
                observed.append((type(reply).__name__, getattr(reply, "consumer_tag", None)))
        # Reusing a queue consumer's tag for the reply consumer closes the connection.
        client.send_frame(commands.Basic.Consume(queue=PSEUDO, consumer_tag="Y", no_ack=True), 1)
        observed += client.observe_close()
    finally:
        client.sock.close()
    return observed


def test_consumer_tags(broker, rabbitmq_url):
    from urllib.parse import urlparse

    reference = urlparse(rabbitmq_url)
    hutch = _consumer_tags("127.0.0.1", broker.port)
    rabbit = _consumer_tags(reference.hostname, reference.port or 5672)
    assert hutch == rabbit
    assert rabbit[-1][:4] == ("Connection.Close", 0, 530, "NOT_ALLOWED - attempt to reuse consumer tag 'Y'")


def _api_publish(port: int, credentials: tuple, amqp_url: str) -> list:
    """The management API's publish: asking for a direct reply is refused
    (its channel has no reply consumer); publishing to a live token delivers
    the reply and says it was not routed."""
    observed = []
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        replies = []
        channel.basic_consume(PSEUDO, lambda _ch, method, _props, body: replies.append(body), auto_ack=True)
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"request", pika.BasicProperties(reply_to=PSEUDO))
        token = channel.basic_get(queue, auto_ack=True)[1].reply_to
        for properties, routing_key in (({"reply_to": PSEUDO}, queue), ({}, token)):
            reply = call(port, "POST", "/api/exchanges/%2F/amq.default/publish", auth=credentials, body={
                "properties": properties, "routing_key": routing_key, "payload": "via api",
                "payload_encoding": "string"})
            observed.append((reply.status, reply.body))
        deadline = time.monotonic() + 5
        while not replies and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.02)
        observed.append(replies)
    finally:
        connection.close()
    return observed


def test_management_api_publish(broker, rabbitmq_url, rabbitmq_api):
    port, credentials = rabbitmq_api
    hutch = _api_publish(broker.ports["HTTP"], ("guest", "guest"), broker.url)
    rabbit = _api_publish(port, credentials, rabbitmq_url)
    assert hutch == rabbit
    assert rabbit[0] == (400, {"error": "bad_request",
                               "reason": "406 PRECONDITION_FAILED - fast reply consumer does not exist"})
