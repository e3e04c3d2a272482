"""Message TTL, queue expiry and length limits, seen by aio-pika clients of a
real broker (docs/queue-semantics.md). Texts and semantics are RabbitMQ
3.10's; "beyond" marks where hutch goes further (an expired message leaves
from anywhere in the queue, not only from its head).
"""
from __future__ import annotations

import asyncio
import time

import aio_pika
import aiormq
import pytest

from helpers import unique


async def until(predicate, timeout: float = 10.0):
    """Poll an async predicate until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within %.1fs" % timeout)
        await asyncio.sleep(0.02)


async def count(channel, name: str) -> int:
    queue = await channel.declare_queue(name, passive=True)
    return queue.declaration_result.message_count


async def bodies(queue) -> list[bytes]:
    """Get (auto-ack) until empty."""
    out = []
    while True:
        message = await queue.get(no_ack=True, fail=False)
        if message is None:
            return out
        out.append(message.body)


async def publish(channel, key: str, body: bytes, **properties):
    return await channel.default_exchange.publish(aio_pika.Message(body, **properties), routing_key=key)


@pytest.fixture
async def channel(aconn):
    return await aconn.channel()


async def dead_letter_pair(channel, **arguments):
    """A queue dead-lettering (via the default exchange) into a second one."""
    dead = await channel.declare_queue(unique("dead"), exclusive=True)
    source = await channel.declare_queue(unique("src"), exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead.name, **arguments})
    return source, dead


# -- argument validation ---------------------------------------------------------

INVALID = [
    ({"x-message-ttl": -1}, "x-message-ttl", "{value_negative,-1}"),
    ({"x-message-ttl": "10"}, "x-message-ttl", '"expected integer, got longstr"'),
    ({"x-message-ttl": True}, "x-message-ttl", '"expected integer, got bool"'),
    ({"x-message-ttl": 315360000001}, "x-message-ttl", "{value_too_large,315360000001}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -5}, "x-expires", "{value_negative,-5}"),
    ({"x-expires": "a"}, "x-expires", '"expected integer, got longstr"'),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length-bytes": "1"}, "x-max-length-bytes", '"expected integer, got longstr"'),
    ({"x-overflow": "foo"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-dead-letter-routing-key": "k"}, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ({"x-dead-letter-exchange": "x", "x-dead-letter-routing-key": 1}, "x-dead-letter-routing-key",
     "{unacceptable_type,signedint}"),
    ({"x-delivery-limit": -1}, "x-delivery-limit", "{value_negative,-1}"),
    # RabbitMQ checks x-expires before x-message-ttl
    ({"x-message-ttl": -1, "x-expires": 0}, "x-expires", "{value_zero,0}"),
]


@pytest.mark.parametrize("arguments,key,problem", INVALID)
async def test_invalid_arguments_close_the_channel_with_rabbitmq_text(aconn, arguments, key, problem):
    channel = await aconn.channel()
    name = unique("bad")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_queue(name, exclusive=True, arguments=arguments)
    assert info.value.args[0] == "PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/': %s" % (
        key, name, problem)


async def test_dead_letter_exchange_of_the_wrong_type(channel):
    name = unique("bad")
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as info:
        await channel.declare_queue(name, exclusive=True, arguments={"x-dead-letter-exchange": 1})
    assert info.value.args[0] == (
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '%s' "
        "in vhost '/'" % name)


async def test_valid_arguments_are_accepted(channel):
    await channel.declare_queue(unique("ok"), exclusive=True, arguments={
        "x-message-ttl": 0, "x-expires": 1, "x-max-length": 0, "x-max-length-bytes": 0,
        "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "no-such-exchange",
        "x-dead-letter-routing-key": "k", "x-delivery-limit": 0})


# -- message TTL -------------------------------------------------------------------


async def test_queue_ttl_expires_messages_and_dead_letters_them_in_order(channel):
    source, dead = await dead_letter_pair(channel, **{"x-message-ttl": 150})
    for i in range(5):
        await publish(channel, source.name, b"m%d" % i)
    await until(lambda: count(channel, dead.name))
    await until(lambda: _equals(count(channel, dead.name), 5))
    assert await count(channel, source.name) == 0
    assert await bodies(dead) == [b"m%d" % i for i in range(5)]


async def _equals(awaitable, value) -> bool:
    return await awaitable == value


async def test_per_message_expiration_removes_it_from_the_middle_of_the_queue(channel):
    """Beyond RabbitMQ: the short-lived message leaves while the ones before it
    wait; the count says so at once, and the others keep their order."""
    source, dead = await dead_letter_pair(channel)
    await publish(channel, source.name, b"first")
    await publish(channel, source.name, b"short", expiration=0.1)
    await publish(channel, source.name, b"last")
    await until(lambda: _equals(count(channel, source.name), 2))
    assert await bodies(source) == [b"first", b"last"]
    got = await dead.get(no_ack=True)
    assert got.body == b"short"
    assert got.expiration is None  # dropped when dead-lettered
    assert got.headers["x-death"][0]["original-expiration"] == "100"


async def test_the_smaller_of_queue_ttl_and_expiration_applies(channel):
    source, dead = await dead_letter_pair(channel, **{"x-message-ttl": 100})
    await publish(channel, source.name, b"long", expiration=3600)
    await until(lambda: _equals(count(channel, dead.name), 1))
    assert await count(channel, source.name) == 0


async def test_ttl_zero_without_a_consumer_expires_at_once(channel):
    source, dead = await dead_letter_pair(channel, **{"x-message-ttl": 0})
    await channel.set_qos(0)
    await publish(channel, source.name, b"now-or-never")
    # publish then a synchronous round trip on the same channel: already gone
    assert await count(channel, source.name) == 0
    assert await count(channel, dead.name) == 1
    got = await dead.get(no_ack=True)
    assert got.headers["x-death"][0]["reason"] == "expired"


async def test_expiration_zero_is_delivered_to_a_waiting_consumer(channel):
    queue = await channel.declare_queue(unique("ttl0"), exclusive=True)
    received = asyncio.Queue()
    await queue.consume(received.put, no_ack=True)
    await publish(channel, queue.name, b"now", expiration=0)
    message = await asyncio.wait_for(received.get(), 10)
    assert message.body == b"now"


async def test_expired_messages_are_never_delivered(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("ttl"), exclusive=True, arguments={"x-message-ttl": 100})
    await publish(channel, queue.name, b"old")
    await until(lambda: _equals(count(channel, queue.name), 0))
    await publish(channel, queue.name, b"fresh")
    received = asyncio.Queue()
    await queue.consume(received.put, no_ack=True)
    assert (await asyncio.wait_for(received.get(), 10)).body == b"fresh"


async def test_a_delivered_message_does_not_expire_and_keeps_its_expiry_when_requeued(aconn):
    channel = await aconn.channel()
    source, dead = await dead_letter_pair(channel, **{"x-message-ttl": 150})
    await publish(channel, source.name, b"held")
    message = await source.get(no_ack=False)
    # a later message with the same TTL expiring shows that the held one's TTL passed too
    await publish(channel, source.name, b"witness")
    await until(lambda: _equals(count(channel, dead.name), 1))
    assert [m.body for m in [await dead.get(no_ack=True)]] == [b"witness"]
    await message.nack(requeue=True)
    await until(lambda: _equals(count(channel, dead.name), 1))
    assert (await dead.get(no_ack=True)).body == b"held"
    assert await count(channel, source.name) == 0


# -- queue expiry ----------------------------------------------------------------


async def ignore(message) -> None:
    pass


async def gone(connection, name: str) -> bool:
    """Whether the queue no longer exists (a passive declare on a channel of its own)."""
    probe = await connection.channel()
    try:
        await probe.declare_queue(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return True
    await probe.close()
    return False



async def test_an_unused_queue_expires_but_one_with_a_consumer_stays(aconn):
    channel = await aconn.channel()
    idle = await channel.declare_queue(unique("idle"), arguments={"x-expires": 200})
    busy = await channel.declare_queue(unique("busy"), arguments={"x-expires": 200})
    await busy.consume(ignore)
    await until(lambda: gone(aconn, idle.name))
    probe = await aconn.channel()
    assert (await probe.declare_queue(busy.name, passive=True)).declaration_result.consumer_count == 1
    await busy.delete(if_unused=False)


async def test_a_queue_expires_once_its_last_consumer_leaves(aconn):
    channel = await aconn.channel()
    queue = await channel.declare_queue(unique("leave"), arguments={"x-expires": 100})
    tag = await queue.consume(ignore)
    await queue.cancel(tag)
    await until(lambda: gone(aconn, queue.name))


# -- length limits -----------------------------------------------------------------


async def test_max_length_drops_from_the_head_and_dead_letters_maxlen(channel):
    source, dead = await dead_letter_pair(channel, **{"x-max-length": 3})
    for i in range(5):
        await publish(channel, source.name, b"m%d" % i)
    assert await count(channel, source.name) == 3
    assert await bodies(source) == [b"m2", b"m3", b"m4"]
    dropped = [await dead.get(no_ack=True) for _ in range(2)]
    assert [m.body for m in dropped] == [b"m0", b"m1"]
    assert {m.headers["x-death"][0]["reason"] for m in dropped} == {"maxlen"}


async def test_max_length_bytes_counts_body_bytes(channel):
    queue = await channel.declare_queue(unique("bytes"), exclusive=True, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        await publish(channel, queue.name, body)
    assert await bodies(queue) == [b"bbbb", b"cccc"]


async def test_max_length_zero_still_delivers_to_a_waiting_consumer(channel):
    queue = await channel.declare_queue(unique("zero"), exclusive=True, arguments={"x-max-length": 0})
    received = asyncio.Queue()
    await queue.consume(received.put, no_ack=True)
    await publish(channel, queue.name, b"direct")
    assert (await asyncio.wait_for(received.get(), 10)).body == b"direct"


async def test_reject_publish_nacks_confirming_publishers(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    queue = await channel.declare_queue(unique("rp"), exclusive=True,
                                        arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    for i in range(2):
        await publish(channel, queue.name, b"m%d" % i)
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await publish(channel, queue.name, b"refused")
    assert await count(channel, queue.name) == 2
    await queue.get(no_ack=True)
    await publish(channel, queue.name, b"room again")  # confirmed (acked) again
    assert await bodies(queue) == [b"m1", b"room again"]


async def test_reject_publish_drops_silently_without_confirms(aconn):
    channel = await aconn.channel(publisher_confirms=False)
    queue = await channel.declare_queue(unique("rp"), exclusive=True,
                                        arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    await publish(channel, queue.name, b"kept")
    await publish(channel, queue.name, b"dropped")
    assert await bodies(queue) == [b"kept"]


async def test_reject_publish_dlx_nacks_and_dead_letters(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    source, dead = await dead_letter_pair(channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    await publish(channel, source.name, b"kept")
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await publish(channel, source.name, b"refused")
    got = await dead.get(no_ack=True)
    assert got.body == b"refused"
    assert got.headers["x-death"][0]["reason"] == "maxlen"
    assert await bodies(source) == [b"kept"]


async def test_a_nack_does_not_disturb_the_confirms_around_it(aconn):
    channel = await aconn.channel(publisher_confirms=True)
    full = await channel.declare_queue(unique("full"), exclusive=True,
                                       arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    other = await channel.declare_queue(unique("other"), exclusive=True)
    outcomes = await asyncio.gather(
        *(publish(channel, (full if i % 3 == 1 else other).name, b"%d" % i) for i in range(30)),
        return_exceptions=True)
    refused = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, Exception)]
    assert refused == [i for i in range(30) if i % 3 == 1]
    assert await count(channel, other.name) == 20


# -- expiry of messages on disk ------------------------------------------------------


async def test_messages_paged_to_disk_expire_with_truthful_counts(channel):
    """A queue keeps at most 2,048 messages in RAM: the others expire on disk,
    counted out as they do, without any consumer reading them back. (Those on
    disk are found by scans at most every 100 ms, so the dead letters of RAM
    and disk may interleave within that.)"""
    source, dead = await dead_letter_pair(channel, **{"x-message-ttl": 300})
    n = 5000
    await asyncio.gather(*(publish(channel, source.name, b"%d" % i) for i in range(n)))
    await until(lambda: _equals(count(channel, dead.name), n), timeout=30)
    assert await count(channel, source.name) == 0
    assert sorted(await bodies(dead)) == sorted(b"%d" % i for i in range(n))


def test_persistent_messages_expire_after_a_restart_without_a_consumer(start_broker):
    """The expiry is kept in the queue index: after a restart nothing reads the
    queue, and its messages still expire into the dead-letter queue."""
    import pika

    from conftest import launch
    from helpers import confirm_channel, connect, drain, ready, wait_for

    first = start_broker()
    channel = confirm_channel(connect(first.port))
    channel.queue_declare("dead", durable=True)
    channel.queue_declare("src", durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    for i in range(10):
        channel.basic_publish("", "src", b"%d" % i, pika.BasicProperties(delivery_mode=2, expiration="1500"))
    channel.basic_publish("", "src", b"stays", pika.BasicProperties(delivery_mode=2))
    first.stop()
    second = launch(first.data_dir.parent, "--data-dir", str(first.data_dir))
    try:
        channel = connect(second.port).channel()
        wait_for(lambda: ready(channel, "dead") == 10, timeout=20)
        assert ready(channel, "src") == 1
        got = drain(channel, "dead")
        assert [b for _m, _p, b in got] == [b"%d" % i for i in range(10)]
        assert got[0][1].headers["x-death"][0]["original-expiration"] == "1500"
    finally:
        second.stop()
