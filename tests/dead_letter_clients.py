"""Real AMQP clients (pika) that make messages die in known numbers, for the
Spark tests: rejections and nacks without requeue, expiry, a length limit,
a delivery limit. `Workload.run` returns how many died per (queue, reason)."""
from __future__ import annotations

import collections

import pika

from helpers import unique, wait_for
from http_api import Api, segment


def new_vhost(broker) -> str:
    api = Api(broker.ports["HTTP"])
    name = unique("spark")
    assert api.put("/api/vhosts/" + segment(name)).status == 201
    api.put("/api/permissions/%s/guest" % segment(name), {"configure": ".*", "write": ".*", "read": ".*"})
    return name


def delete_vhost(broker, name: str) -> None:
    Api(broker.ports["HTTP"]).delete("/api/vhosts/" + segment(name))


def next_offset(broker, vhost: str) -> int:
    reply = Api(broker.ports["HTTP"]).get("/api/hutch/dead-letters/%s?limit=0" % segment(vhost))
    return reply.body["next_offset"]


class Workload:
    """Queues in one vhost: orders (DLX "parked", rejected), payments
    (TTL 1 ms: expired), audit (max length 2: maxlen), retries (delivery
    limit 0: delivery_limit), all fed through the topic exchange "events"."""

    def __init__(self, broker, vhost: str) -> None:
        self.broker = broker
        self.vhost = vhost
        self.connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port, vhost))
        ch = self.ch = self.connection.channel()
        ch.exchange_declare("events", "topic")
        ch.exchange_declare("parked", "fanout")
        ch.queue_declare("parked")
        ch.queue_bind("parked", "parked")
        for queue, arguments in (("orders", {"x-dead-letter-exchange": "parked"}),
                                 ("payments", {"x-message-ttl": 1}),
                                 ("audit", {"x-max-length": 2}),
                                 ("retries", {"x-delivery-limit": 0})):
            ch.queue_declare(queue, arguments=arguments)
            ch.queue_bind(queue, "events", queue + ".#")
        ch.confirm_delivery()
        self.died: collections.Counter = collections.Counter()

    def publish(self, queue: str, n: int, tag: str = "") -> None:
        for i in range(n):
            self.ch.basic_publish("events", "%s.%s%d" % (queue, tag, i), b"%s %s%d" % (queue.encode(), tag.encode(), i),
                                  pika.BasicProperties(message_id=unique("m"), content_type="text/plain"))

    def run(self, rejected: int = 0, expired: int = 0, maxlen: int = 0, delivery_limit: int = 0,
            tag: str = "") -> collections.Counter:
        """Make that many messages die in each way; wait until the log has them."""
        before = next_offset(self.broker, self.vhost)
        ch = self.ch
        self.publish("orders", rejected, tag)
        for i in range(rejected):
            method = wait_for(lambda: ch.basic_get("orders")[0])
            if i % 2:
                ch.basic_nack(method.delivery_tag, requeue=False)
            else:
                ch.basic_reject(method.delivery_tag, requeue=False)
        # the rejections are in the log before anything else dies: the log's order is then the
        # clients' (a reject is asynchronous, and its record may come from another shard's queue
        # after the payments expired in shard 0's, seen with the suite on both cores)
        wait_for(lambda: next_offset(self.broker, self.vhost) == before + rejected, timeout=10,
                 what="the rejections in the log")
        self.publish("payments", expired, tag)
        if maxlen:
            self.publish("audit", maxlen + 2, tag)
            assert ch.queue_declare("audit", passive=True).method.message_count == 2
            ch.queue_purge("audit")
        self.publish("retries", delivery_limit, tag)
        for _ in range(delivery_limit):
            method = wait_for(lambda: ch.basic_get("retries")[0])
            ch.basic_nack(method.delivery_tag, requeue=True)
        made = collections.Counter({("orders", "rejected"): rejected, ("payments", "expired"): expired,
                                    ("audit", "maxlen"): maxlen, ("retries", "delivery_limit"): delivery_limit})
        made = +made
        total = sum(made.values())
        wait_for(lambda: next_offset(self.broker, self.vhost) == before + total, timeout=10)
        self.died.update(made)
        return made

    def close(self) -> None:
        self.connection.close()
