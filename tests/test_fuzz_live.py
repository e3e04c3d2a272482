"""Mutated valid sessions against a real broker process (short CI run; the
long run is bench/fuzz_soak.py). See tests/fuzz_session.py for the mutation
operators and the checks: no hang, only legitimate close codes, no traceback
in the broker log, the broker serves a new client afterwards, and its file
descriptors and memory stay bounded."""
from __future__ import annotations

import random
import struct

import pytest
from pamqp import commands, frame

from fuzz_session import (
    PROTOCOL_HEADER,
    broker_resources,
    check_closes,
    closes,
    methods,
    mutate,
    run_case,
    valid_frames,
    valid_session,
)
from helpers import assert_serves, wait_for

CASES = 600


def test_the_valid_session_is_answered_in_full(fresh_broker):
    answered = [(channel, class_id, method_id) for channel, class_id, method_id, _ in
                methods(run_case(fresh_broker.port, valid_session()))]
    assert answered[-1] == (0, 10, 51)  # Connection.CloseOk
    assert closes(run_case(fresh_broker.port, valid_session())) == []


def test_confirms_due_go_out_before_channel_close_ok(fresh_broker):
    """Regression: confirms were coalesced to the end of the loop turn and lost
    when Channel.Close arrived in the same read (RabbitMQ sends them)."""
    answered = [(channel, class_id, method_id) for channel, class_id, method_id, _ in
                methods(run_case(fresh_broker.port, valid_session()))]
    assert (1, 60, 80) in answered  # Basic.Ack
    assert answered.index((1, 60, 80)) < answered.index((1, 20, 41))  # before Channel.CloseOk


def test_undecodable_content_properties_close_like_rabbitmq(fresh_broker):
    """Regression: a content header whose properties cannot be decoded raised
    out of the publish path (traceback, "internal error"); RabbitMQ closes the
    connection with 541 and the bare text INTERNAL_ERROR."""
    header = struct.pack(">HHQ", 60, 0, 3) + b"\x20\x00" + b"\x00\x00\x00\x30abc"  # headers table cut short
    data = (PROTOCOL_HEADER + b"".join(valid_frames()[:4])
            + frame.marshal(commands.Basic.Publish(exchange="amq.match", routing_key=""), 1)
            + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce"
            + struct.pack(">BHI", 3, 1, 3) + b"abc\xce")
    assert closes(run_case(fresh_broker.port, data)) == [(0, 10, 541, "INTERNAL_ERROR")]
    assert "Traceback" not in fresh_broker.log
    assert_serves(fresh_broker.port)


def test_mutated_sessions(fresh_broker):
    port, pid = fresh_broker.port, fresh_broker.process.pid
    rnd = random.Random(8)
    for _ in range(50):  # warm up caches and pools before the baseline
        run_case(port, mutate(rnd)[1])
    fds_before, rss_before = broker_resources(pid)
    for case in range(CASES):
        op, data = mutate(rnd)
        try:
            check_closes(closes(run_case(port, data)))
        except AssertionError as exc:
            raise AssertionError("case %d (%s): %s\n%r" % (case, op, exc, data)) from None
        if case % 100 == 0:
            assert_serves(port)
    assert_serves(port)
    assert "Traceback" not in fresh_broker.log
    # Every case's socket is closed by the broker: the fd count settles back.
    assert wait_for(lambda: broker_resources(pid)[0] <= fds_before + 2)
    assert broker_resources(pid)[1] < rss_before + 30 * 1024  # KiB: bounded, not growing per case


def _targeted() -> dict:
    """Targeted mutations of the valid session and RabbitMQ 3.10's answer to
    each (probed; the unknown method, which RabbitMQ answers by dropping the
    socket, gets 503 here)."""
    frames, head = valid_frames(), PROTOCOL_HEADER + b"".join(valid_frames()[:4])
    content = frames[7]
    return {
        "bad frame end": (PROTOCOL_HEADER + b"".join(frames[:3]) + frames[3][:-1] + b"\x00", 501, "FRAME_ERROR"),
        "unknown frame type": (head + b"\x09" + frames[4][1:], 501, "FRAME_ERROR"),
        "body without header": (head + struct.pack(">BHI", 3, 1, 3) + b"abc\xce", 505,
                                "UNEXPECTED_FRAME - expected method frame, got non method frame instead"),
        "header without publish": (head + content[:content.index(b"\xce\x03") + 1], 505,
                                   "UNEXPECTED_FRAME - expected method frame, got non method frame instead"),
        "second channel.open": (head + frames[3], 504, "CHANNEL_ERROR - second 'channel.open' seen"),
        "method on a closed channel": (head + frame.marshal(commands.Basic.Qos(), 3), 504,
                                       "CHANNEL_ERROR - expected 'channel.open'"),
        "unknown method": (head + struct.pack(">BHI", 1, 1, 4) + struct.pack(">HH", 60, 99) + b"\xce", 503,
                           "COMMAND_INVALID - unknown method class 60 method 99"),
        "truncated arguments": (head + struct.pack(">BHI", 1, 1, 6) + struct.pack(">HHH", 50, 10, 0) + b"\xce", 501,
                                "FRAME_ERROR - cannot decode <<0,0>>"),
        "method inside content": (head + frames[6] + frame.marshal(commands.Basic.Qos(), 1), 505,
                                  "UNEXPECTED_FRAME - expected content header for class 60"),
        "content on channel 0": (head + struct.pack(">BHI", 3, 0, 3) + b"abc\xce", 505,
                                 'UNEXPECTED_FRAME - type 3, all octets = <<"abc">>'),
        "heartbeat on channel 1": (head + struct.pack(">BHI", 8, 1, 0) + b"\xce", 505,
                                   "UNEXPECTED_FRAME - type 8, all octets = <<>>"),
    }


@pytest.mark.parametrize("case", list(_targeted()))
def test_targeted_mutations_get_rabbitmqs_close(broker, case):
    data, code, text = _targeted()[case]
    found = closes(run_case(broker.port, data))
    assert len(found) == 1 and found[0][:3] == (0, 10, code), found
    assert found[0][3].startswith(text), found
