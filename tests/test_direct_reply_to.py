"""Direct reply-to end to end: RabbitMQ tutorial six (RPC) with two real
clients. The RPC server is pika (a BlockingConnection in a thread, consuming
the request queue with manual acks and replying to each request's reply_to
with its correlation_id, as the tutorial's rpc_server.py); the clients are
aio-pika, consuming `amq.rabbitmq.reply-to` and publishing requests with
that reply_to, no reply queue declared. The protocol details and the error
cases are compared with RabbitMQ in differential/test_diff_direct_reply_to.py.
"""
from __future__ import annotations

import asyncio
import threading
import uuid

import aio_pika
import pika
import pytest

from helpers import unique, wait_for

PSEUDO = "amq.rabbitmq.reply-to"


def fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class RpcServer:
    """The tutorial's server, in a thread; `stop` ends it."""

    def __init__(self, url: str, queue: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.queue_declare(queue)
        self.channel.basic_qos(prefetch_count=1)
        self.channel.basic_consume(queue, self._on_request)
        self.served = 0
        self.thread = threading.Thread(target=self.channel.start_consuming, daemon=True)
        self.thread.start()

    def _on_request(self, channel, method, properties, body) -> None:
        channel.basic_publish("", properties.reply_to, str(fib(int(body))).encode(),
                              pika.BasicProperties(correlation_id=properties.correlation_id))
        channel.basic_ack(method.delivery_tag)
        self.served += 1

    def stop(self) -> None:
        self.connection.add_callback_threadsafe(self.channel.stop_consuming)
        self.thread.join(10)
        self.connection.close()


@pytest.fixture
def rpc_server(broker):
    queue = unique("rpc_queue")
    server = RpcServer(broker.url, queue)
    yield queue, server
    server.stop()


async def ignore(message) -> None:
    """A reply consumer that never reads its replies."""


class RpcClient:
    """The tutorial's client with direct reply-to (aio-pika)."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection, queue: str) -> None:
        self.connection = connection
        self.queue = queue
        self.pending: dict[str, asyncio.Future] = {}
        self.reply_tos: set[str] = set()

    async def start(self) -> "RpcClient":
        self.channel = await self.connection.channel()
        replies = await self.channel.get_queue(PSEUDO, ensure=False)
        await replies.consume(self._on_reply, no_ack=True)
        return self

    async def _on_reply(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.reply_tos.add(message.routing_key)
        future = self.pending.pop(message.correlation_id, None)
        if future is not None:
            future.set_result(int(message.body))

    async def call(self, n: int) -> int:
        correlation_id = uuid.uuid4().hex
        future = self.pending[correlation_id] = asyncio.get_running_loop().create_future()
        await self.channel.default_exchange.publish(
            aio_pika.Message(str(n).encode(), correlation_id=correlation_id, reply_to=PSEUDO),
            routing_key=self.queue,
        )
        return await asyncio.wait_for(future, 10)


async def test_rpc_with_direct_reply_to(broker, rpc_server):
    queue, server = rpc_server
    async with await aio_pika.connect(broker.url) as connection:
        client = await RpcClient(connection, queue).start()
        assert await client.call(30) == 832040
        # Concurrent calls, answered by correlation id.
        assert await asyncio.gather(*(client.call(n) for n in range(15))) == [fib(n) for n in range(15)]
    wait_for(lambda: server.served == 16)
    # Every reply came to one token, and it is not the name asked for.
    (token,) = client.reply_tos
    assert token.startswith(PSEUDO + ".")


async def test_replies_reach_only_their_requester(broker, rpc_server):
    """Two clients share the server: each gets its own replies, with no
    queue declared for either (the server's queue is the only one)."""
    queue, _server = rpc_server
    async with await aio_pika.connect(broker.url) as first, await aio_pika.connect(broker.url) as second:
        a = await RpcClient(first, queue).start()
        b = await RpcClient(second, queue).start()
        results = await asyncio.gather(*(client.call(n) for n in range(10) for client in (a, b)))
        assert results == [fib(n) for n in range(10) for _ in (a, b)]
        assert len(a.reply_tos | b.reply_tos) == 2
        assert not a.pending and not b.pending


async def test_reply_to_a_closed_requester_is_dropped(broker, rpc_server):
    """The server's reply to a requester that went away is dropped; the
    server carries on serving the next client."""
    queue, server = rpc_server
    async with await aio_pika.connect(broker.url) as gone:
        channel = await gone.channel()
        replies = await channel.get_queue(PSEUDO, ensure=False)
        await replies.consume(ignore, no_ack=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"10", correlation_id="lost", reply_to=PSEUDO), routing_key=queue)
    async with await aio_pika.connect(broker.url) as connection:
        client = await RpcClient(connection, queue).start()
        assert await client.call(20) == 6765
    wait_for(lambda: server.served == 2)
    assert server.channel.is_open


def test_requester_declares_its_own_token(conn):
    """A passive declare of the channel's own token on that channel answers
    declare-ok (RabbitMQ 3.10's channel calls itself there and the connection
    closes with 541; hutch answers as from any other channel). pika: aio-pika
    refuses such a name client-side (pamqp's name pattern has no '/', '+', '=')."""
    channel = conn.channel()
    channel.basic_consume(PSEUDO, lambda *delivery: None, auto_ack=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"x", pika.BasicProperties(reply_to=PSEUDO))
    token = channel.basic_get(queue, auto_ack=True)[1].reply_to
    assert token.startswith(PSEUDO + ".")
    declared = channel.queue_declare(token, passive=True).method
    assert (declared.queue, declared.message_count, declared.consumer_count) == (token, 0, 1)
