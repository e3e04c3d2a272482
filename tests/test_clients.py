"""Other standard clients against the broker: py-amqp (Celery's transport,
AMQPLAIN login by default) and kombu on top of it."""
from __future__ import annotations

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
