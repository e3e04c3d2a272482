"""Limits with RabbitMQ's errors: connection_max (node), consumer_max_per_channel
(RabbitMQ 3.12+), and nested/large field tables. (channel_max, frame_max,
max_message_size and the vhost/user limits are tested in test_raw_protocol,
test_framing, test_basic and test_admin.)"""
from __future__ import annotations

import struct

import pytest
from pamqp import commands, frame
from pika.exceptions import ConnectionClosedByBroker, ProbableAccessDeniedError

from amqp_raw import RawClient
from fuzz_session import PROTOCOL_HEADER, closes, run_case, valid_frames
from helpers import assert_serves, connect, unique, wait_for


def test_connection_max_refuses_the_next_connection_530(start_broker):
    broker = start_broker("--connection-max", "2")
    first, second = connect(broker.port), connect(broker.port)
    with pytest.raises(ProbableAccessDeniedError) as refused:
        connect(broker.port)
    assert "(530) 'NOT_ALLOWED - connection refused: node connection limit (2) is reached'" in str(refused.value)
    first.close()
    # A slot is free again once the broker has seen the close.
    third = wait_for(lambda: _try_connect(broker.port))
    assert third.is_open
    for connection in (second, third):
        connection.close()


def _try_connect(port: int):
    try:
        return connect(port)
    except ProbableAccessDeniedError:
        return None


def test_consumer_max_per_channel_530(start_broker):
    broker = start_broker("--consumer-max-per-channel", "2")
    connection = connect(broker.port)
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_consume(queue, lambda *a: None)
    channel.basic_consume(queue, lambda *a: None)
    other = connection.channel()  # the limit is per channel
    other.basic_consume(queue, lambda *a: None)
    with pytest.raises(ConnectionClosedByBroker) as refused:
        channel.basic_consume(queue, lambda *a: None)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        530, "NOT_ALLOWED - reached maximum (2) of consumers per channel")
    assert_serves(broker.port)


def test_a_cancelled_consumer_frees_its_place(start_broker):
    broker = start_broker("--consumer-max-per-channel", "1")
    with connect(broker.port) as connection:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        tag = channel.basic_consume(queue, lambda *a: None)
        channel.basic_cancel(tag)
        assert channel.basic_consume(queue, lambda *a: None)


def nested_table(depth: int) -> bytes:
    """A field table holding a table holding a table ... `depth` levels."""
    table = b""
    for _ in range(depth):
        table = b"\x01aF" + struct.pack(">I", len(table)) + table
    return struct.pack(">I", len(table)) + table


def declare_with_arguments(port: int, table: bytes) -> bytes:
    arguments = struct.pack(">HH", 50, 10) + b"\x00\x00\x00\x00" + table  # ticket, queue "", no bits
    return run_case(port, PROTOCOL_HEADER + b"".join(valid_frames()[:4])
                    + struct.pack(">BHI", 1, 1, len(arguments)) + arguments + b"\xce")


def test_nested_tables_rabbitmq_accepts_are_accepted(broker):
    # RabbitMQ 3.10 accepts any depth a frame can hold; 50 levels work here too. The client
    # waits for the answer before it closes (on a node of several shards a declaration is
    # answered once every shard made it: after a half-close it may never be).
    arguments = struct.pack(">HH", 50, 10) + b"\x00\x00\x00\x00" + nested_table(50)  # ticket, queue "", no bits
    with RawClient.connected(broker.port, channels=(1,)) as client:
        client.send(struct.pack(">BHI", 1, 1, len(arguments)) + arguments + b"\xce")
        client.expect(commands.Queue.DeclareOk, 1)


def test_a_table_nested_to_the_frame_limit_is_refused_501(broker, still_serving):
    """Beyond RabbitMQ: a table nested thousands of levels deep (as deep as a
    frame can carry) is refused as undecodable instead of exhausting the stack."""
    table = nested_table(18000)
    assert len(table) < 131072 - 100
    found = closes(declare_with_arguments(broker.port, table))
    assert [(code, text.split(" <<")[0]) for _, _, code, text in found] == [(501, "FRAME_ERROR - cannot decode")]


def test_deeply_nested_message_headers_on_a_headers_exchange(broker, still_serving):
    """Message headers are decoded only when routing needs them (headers
    exchange): too deep, and the connection closes as RabbitMQ closes it for
    undecodable properties (541 INTERNAL_ERROR); routed by key, the header is
    carried verbatim."""
    header = struct.pack(">HHQ", 60, 0, 1) + b"\x20\x00" + nested_table(18000)
    publish = (frame.marshal(commands.Basic.Publish(exchange="amq.match", routing_key=""), 1)
               + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce" + struct.pack(">BHI", 3, 1, 1) + b"x\xce")
    found = closes(run_case(broker.port, PROTOCOL_HEADER + b"".join(valid_frames()[:4]) + publish))
    assert found == [(0, 10, 541, "INTERNAL_ERROR")]


def test_a_header_table_larger_than_frame_max_is_refused_501(broker, still_serving):
    header = struct.pack(">HHQ", 60, 0, 1) + b"\x20\x00" + struct.pack(">I", 200000) + b"\x01aS" + struct.pack(
        ">I", 199993) + b"v" * 199993
    publish = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=unique("q")), 1)
               + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce")
    found = closes(run_case(broker.port, PROTOCOL_HEADER + b"".join(valid_frames()[:4]) + publish))
    assert len(found) == 1 and found[0][2] == 501 and "frame_too_large" in found[0][3]

