"""Other standard clients against the broker: py-amqp (Celery's transport,
AMQPLAIN login by default) and kombu on top of it."""
from __future__ import annotations

import socket
import time

import amqp
import kombu

from helpers import unique


def test_py_amqp_amqplain_publish_consume_ack(broker):
    with amqp.Connection("127.0.0.1:%d" % broker.port, userid="guest", password="guest",
                         login_method="AMQPLAIN") as connection:
        channel = connection.channel()
        queue = unique("pyamqp")
        channel.queue_declare(queue, auto_delete=True)
        channel.confirm_select()
        channel.basic_publish(amqp.Message("hello", content_type="text/plain", application_headers={"n": 1}),
                              routing_key=queue)
        received = []
        channel.basic_consume(queue, callback=received.append)
        while not received:
            connection.drain_events(timeout=5)
        message = received[0]
        assert message.body == b"hello" or message.body == "hello"
        assert message.properties["content_type"] == "text/plain"
        assert message.properties["application_headers"] == {"n": 1}
        channel.basic_ack(message.delivery_tag)


def test_kombu_simple_queue_round_trip(broker):
    with kombu.Connection("amqp://guest:guest@127.0.0.1:%d//" % broker.port) as connection:
        queue = connection.SimpleQueue(unique("kombu"))
        queue.put({"task": "add", "args": [2, 3]})
        message = queue.get(timeout=5)
        assert message.payload == {"task": "add", "args": [2, 3]}
        message.ack()
        queue.close()


def test_kombu_topic_exchange_and_an_rpc_round_trip(broker):
    """kombu's own patterns: a consumer on a topic exchange answers requests
    on the reply_to queue with their correlation_id (kombu's RPC example)."""
    url = "amqp://guest:guest@127.0.0.1:%d//" % broker.port
    exchange = kombu.Exchange(unique("rpc"), type="topic", auto_delete=True)
    requests = kombu.Queue(unique("requests"), exchange, routing_key="math.*", auto_delete=True)
    replies = kombu.Queue(unique("replies"), exclusive=True, auto_delete=True)
    with kombu.Connection(url) as server, kombu.Connection(url) as client:
        def answer(body, message):
            with kombu.Producer(server.channel()) as producer:
                producer.publish({"sum": sum(body["args"])}, routing_key=message.properties["reply_to"],
                                 correlation_id=message.properties["correlation_id"])
            message.ack()

        answered = {}

        def on_reply(body, message):
            answered[message.properties["correlation_id"]] = body
            message.ack()

        with kombu.Consumer(server, [requests], callbacks=[answer]), \
                kombu.Consumer(client, [replies], callbacks=[on_reply]):
            producer = kombu.Producer(client)
            for n in range(3):
                producer.publish({"args": [n, 10]}, exchange=exchange, routing_key="math.add", declare=[exchange],
                                 reply_to=replies.name, correlation_id="c%d" % n)
            producer.publish({"args": [0]}, exchange=exchange, routing_key="other.add")  # routed nowhere
            deadline = time.monotonic() + 10
            while len(answered) < 3 and time.monotonic() < deadline:
                for connection in (server, client):
                    try:
                        connection.drain_events(timeout=0.05)
                    except socket.timeout:
                        pass
    assert answered == {"c0": {"sum": 10}, "c1": {"sum": 11}, "c2": {"sum": 12}}
