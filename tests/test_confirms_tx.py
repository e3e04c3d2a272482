"""Publisher confirms and transactions (confirm.* and tx.*).

aio-pika and pika for the user's view; a raw-socket client (pamqp frames) to
see what the libraries hide: delivery tags, the `multiple` flag, and the order
of basic.return against basic.ack. Reply codes and texts are RabbitMQ 3.10's.
"""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest
from pamqp import commands
from pamqp.constants import FRAME_BODY, FRAME_HEADER

from amqp_raw import CLIENT_CAPABILITIES, RawClient
from helpers import channel_error, confirm_channel, declare, publish_n, ready, unique, wait_for


# -- helpers ------------------------------------------------------------------


@pytest.fixture
def raw(broker):
    """A raw-socket client through the handshake, with channel 1 open."""
    with RawClient.connected(broker.port, capabilities=CLIENT_CAPABILITIES, channels=(1,)) as client:
        yield client


# -- publisher confirms --------------------------------------------------------


def test_each_publish_is_confirmed_with_the_next_tag(raw):
    raw.confirm_select()
    q = raw.declare_queue()
    for tag in range(1, 6):
        raw.publish(q, b"m%d" % tag)
        ack = raw.expect(commands.Basic.Ack, 1)
        assert (ack.delivery_tag, ack.multiple) == (tag, False)


def test_confirms_for_a_burst_coalesce_with_multiple(raw):
    raw.confirm_select()
    q = raw.declare_queue()
    count = 200
    raw.send(b"".join(raw.publish_bytes(q, b"%d" % i) for i in range(count)))
    acks = []
    while not acks or acks[-1].delivery_tag < count:
        acks.append(raw.expect(commands.Basic.Ack, 1))
    assert acks[-1].delivery_tag == count
    assert len(acks) < count
    assert any(ack.multiple for ack in acks)
    previous = 0
    for ack in acks:  # together they cover 1..count exactly once, in order
        assert ack.delivery_tag > previous
        if not ack.multiple:
            assert ack.delivery_tag == previous + 1
        previous = ack.delivery_tag
    raw.send_frame(commands.Queue.Declare(queue=q, passive=True), 1)
    assert raw.expect(commands.Queue.DeclareOk, 1).message_count == count


def test_each_channel_numbers_its_own_confirms(raw):
    raw.confirm_select()
    q = raw.declare_queue()
    raw.open_channel(2)
    raw.confirm_select(2)
    on_two = raw.publish_bytes(q, b"two", channel=2)
    raw.send(raw.publish_bytes(q, b"a") + on_two + raw.publish_bytes(q, b"b") + on_two)
    upto = {1: 0, 2: 0}
    while upto != {1: 2, 2: 2}:
        channel, ack = raw.read_frame()
        assert isinstance(ack, commands.Basic.Ack)
        assert ack.delivery_tag == upto[channel] + 1 or (ack.multiple and ack.delivery_tag > upto[channel])
        upto[channel] = ack.delivery_tag


def test_unroutable_mandatory_is_returned_before_its_ack(raw):
    raw.confirm_select()
    q = raw.declare_queue()
    nowhere = unique("nowhere")
    raw.publish(nowhere, b"lost", mandatory=True)
    ret = raw.expect(commands.Basic.Return, 1)
    assert (ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key) == (312, "NO_ROUTE", "", nowhere)
    assert raw.read_raw_frame()[0] == FRAME_HEADER
    assert raw.read_raw_frame() == (FRAME_BODY, 1, b"lost")
    ack = raw.expect(commands.Basic.Ack, 1)
    assert (ack.delivery_tag, ack.multiple) == (1, False)
    # unroutable without mandatory: acked, nothing returned; then a routable one
    raw.publish(nowhere, b"dropped")
    assert raw.expect(commands.Basic.Ack, 1).delivery_tag == 2
    raw.publish(q, b"kept", mandatory=True)
    assert raw.expect(commands.Basic.Ack, 1).delivery_tag == 3


async def test_aio_pika_publishes_are_all_acked(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(unique("ctx"), exclusive=True)
        results = await asyncio.gather(*[
            channel.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=queue.name)
            for i in range(50)
        ])
        assert all(isinstance(result, commands.Basic.Ack) for result in results)
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.declaration_result.message_count == 50


async def test_aio_pika_mandatory_unroutable_raises_publish_error(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        nowhere = unique("nowhere")
        with pytest.raises(aiormq.exceptions.PublishError) as info:
            await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=nowhere, mandatory=True)
        returned = info.value.frame
        assert (returned.reply_code, returned.reply_text, returned.routing_key) == (312, "NO_ROUTE", nowhere)
        ack = await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=nowhere, mandatory=False)
        assert isinstance(ack, commands.Basic.Ack)


def test_confirm_select_on_a_tx_channel_is_406(conn):
    ch = conn.channel()
    ch.tx_select()
    assert channel_error(ch.confirm_delivery) == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_select_on_a_confirm_channel_is_406(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    assert channel_error(ch.tx_select) == (
        406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
    assert conn.is_open


def test_selecting_the_same_mode_twice_is_fine(raw):
    raw.confirm_select()
    raw.confirm_select()
    raw.open_channel(2)
    for _ in range(2):
        raw.send_frame(commands.Tx.Select(), 2)
        raw.expect(commands.Tx.SelectOk, 2)


# -- transactions: publishes -------------------------------------------------------


def test_tx_publishes_are_invisible_until_commit(conn):
    ch = conn.channel()
    q = declare(ch)
    observer = conn.channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    assert ready(ch, q) == 0
    assert ready(observer, q) == 0
    ch.tx_commit()
    assert ready(observer, q) == 3
    assert [observer.basic_get(q, auto_ack=True)[2] for _ in range(3)] == [b"0", b"1", b"2"]


def test_tx_rollback_discards_publishes(conn):
    ch = conn.channel()
    q = declare(ch)
    ch.tx_select()
    ch.basic_publish("", q, b"discarded-1")
    ch.basic_publish("", q, b"discarded-2")
    ch.tx_rollback()
    ch.tx_commit()  # nothing left to commit
    assert ready(ch, q) == 0
    ch.basic_publish("", q, b"kept")  # still transactional after a rollback
    assert ready(ch, q) == 0
    ch.tx_commit()
    assert ch.basic_get(q, auto_ack=True)[2] == b"kept"


def test_tx_mandatory_unroutable_is_returned_at_commit(raw):
    raw.send_frame(commands.Tx.Select(), 1)
    raw.expect(commands.Tx.SelectOk, 1)
    nowhere = unique("nowhere")
    raw.publish(nowhere, b"lost", mandatory=True)
    raw.send_frame(commands.Tx.Commit(), 1)
    ret = raw.expect(commands.Basic.Return, 1)
    assert (ret.reply_code, ret.routing_key) == (312, nowhere)
    assert raw.read_raw_frame()[0] == FRAME_HEADER
    assert raw.read_raw_frame() == (FRAME_BODY, 1, b"lost")
    raw.expect(commands.Tx.CommitOk, 1)


async def test_aio_pika_transaction_commit_and_rollback(broker):
    async with await aio_pika.connect(broker.url) as connection:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue(unique("ctx"), exclusive=True)
        with pytest.raises(RuntimeError):
            async with channel.transaction():
                await channel.default_exchange.publish(aio_pika.Message(b"rolled-back"), routing_key=queue.name)
                raise RuntimeError("abort")  # leaving with an error rolls back
        async with channel.transaction():
            await channel.default_exchange.publish(aio_pika.Message(b"committed"), routing_key=queue.name)
        message = await queue.get(no_ack=True, timeout=5)
        assert message.body == b"committed"
        assert await queue.get(fail=False, timeout=5) is None


# -- transactions: acks, nacks, rejects ---------------------------------------------


def publish_confirmed(conn, q: str, n: int) -> None:
    """n messages (b"0", b"1", ...) through a confirm channel of their own."""
    pub = confirm_channel(conn)
    publish_n(pub, q, n, prefix=b"")
    pub.close()


def test_tx_ack_takes_effect_only_on_commit(conn):
    ch = conn.channel()
    q = declare(ch)
    publish_confirmed(conn, q, 2)
    worker = conn.channel()
    worker.tx_select()
    tags = [worker.basic_get(q)[0].delivery_tag for _ in range(2)]
    worker.basic_ack(tags[0])
    worker.close()  # uncommitted: both messages go back
    wait_for(lambda: ready(ch, q) == 2)
    worker = conn.channel()
    worker.tx_select()
    got = [worker.basic_get(q) for _ in range(2)]
    assert [(m.redelivered, body) for m, _p, body in got] == [(True, b"0"), (True, b"1")]
    worker.basic_ack(got[1][0].delivery_tag, multiple=True)
    worker.tx_commit()
    worker.basic_recover(requeue=True)  # would give back anything still outstanding
    assert ready(ch, q) == 0


def test_tx_rollback_leaves_the_ack_undone(conn):
    ch = conn.channel()
    q = declare(ch)
    publish_confirmed(conn, q, 2)
    ch.tx_select()
    first = ch.basic_get(q)[0]
    ch.basic_ack(first.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(first.delivery_tag)  # still outstanding: acking it again is allowed
    ch.tx_commit()
    ch.basic_recover(requeue=True)  # nothing outstanding any more
    assert ready(ch, q) == 1
    assert ch.basic_get(q, auto_ack=True)[2] == b"1"


def test_tx_rolled_back_ack_is_requeued_when_the_channel_closes(conn):
    ch = conn.channel()
    q = declare(ch)
    publish_confirmed(conn, q, 1)
    worker = conn.channel()
    worker.tx_select()
    tag = worker.basic_get(q)[0].delivery_tag
    worker.basic_ack(tag)
    worker.tx_rollback()
    worker.close()
    wait_for(lambda: ready(ch, q) == 1)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)


def test_tx_reject_and_nack_apply_on_commit(conn):
    ch = conn.channel()
    q = declare(ch)
    publish_confirmed(conn, q, 3)
    ch.tx_select()
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_reject(tags[0], requeue=True)
    ch.basic_nack(tags[2], multiple=False, requeue=False)
    assert ready(ch, q) == 0
    ch.tx_commit()
    wait_for(lambda: ready(ch, q) == 1)
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"0", True)
    ch.basic_ack(tags[1])
    ch.tx_commit()
    ch.basic_recover(requeue=True)
    assert ready(ch, q) == 0


def test_tx_ack_of_unknown_tag_fails_at_once(conn):
    ch = conn.channel()
    q = declare(ch)
    ch.tx_select()
    ch.basic_ack(5)
    assert channel_error(ready, ch, q) == (406, "PRECONDITION_FAILED - unknown delivery tag 5")


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
def test_commit_or_rollback_without_select_is_406(conn, method):
    ch = conn.channel()
    assert channel_error(getattr(ch, method)) == (406, "PRECONDITION_FAILED - channel is not transactional")
    assert conn.is_open
