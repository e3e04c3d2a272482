"""storage.dead_letter_log: the per-vhost, offset-addressed log of dead messages.

Each async test runs its own GroupCommitWriter on the test's loop and stops
it at the end; a "restart" is a new writer and a new DeadLetterLog over the
same directory, recovered as the broker does at start.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import time

import pytest
from pamqp import commands, header

from storage import Message, record
from storage.dead_letter_log import DeadLetter, DeadLetterLog, DeadLetterLogSettings, from_message, json_value
from storage.writer import GroupCommitWriter


@pytest.fixture
async def writer():
    w = GroupCommitWriter(asyncio.get_running_loop())
    yield w
    w.stop()


def dead(i: int, reason: str = "rejected", when: float | None = None, body: bytes | None = None) -> DeadLetter:
    when = float(int(time.time())) if when is None else when
    payload = b"body-%d" % i if body is None else body
    return DeadLetter(time=when, vhost="/", queue="q%d" % (i % 3), reason=reason, exchange="ex",
                      routing_keys=["rk%d" % i], dead_letter_exchange="dlx", dead_letter_routing_key=None,
                      death_count=1 + i % 2, message_id="m%d" % i, headers={"n": i}, body_size=len(payload),
                      body=payload)


def open_log(tmp_path, writer, clock=None, **settings) -> DeadLetterLog:
    log = DeadLetterLog(str(tmp_path / "dead_letters"), writer, DeadLetterLogSettings(**settings),
                        **({"clock": clock} if clock else {}))
    log.recover()
    return log


async def append_all(log: DeadLetterLog, records) -> list[int]:
    """Append and wait until every one is durable (on_durable called)."""
    loop = asyncio.get_running_loop()
    futures, offsets = [], []
    for rec in records:
        fut = loop.create_future()
        offsets.append(log.append(rec, lambda f=fut: f.set_result(None)))
        futures.append(fut)
    await asyncio.gather(*futures)
    return offsets


async def read(log: DeadLetterLog, start: int, max_records: int = 1000) -> list[DeadLetter]:
    fut = asyncio.get_running_loop().create_future()
    log.read(start, max_records, fut.set_result)
    result = await fut
    assert not isinstance(result, Exception), result
    return result


@contextlib.contextmanager
def restarted():
    """The writer of a broker started again over the same files."""
    writer = GroupCommitWriter(asyncio.get_running_loop())
    try:
        yield writer
    finally:
        writer.stop()


async def settle(writer: GroupCommitWriter) -> None:
    fut = asyncio.get_running_loop().create_future()
    writer.run(lambda: None, lambda _r: fut.set_result(None))
    await fut


def segment_files(log: DeadLetterLog) -> list[str]:
    return sorted(n for n in os.listdir(log.directory) if n.endswith(".log"))


async def test_offsets_start_at_zero_and_records_read_back_whole(tmp_path, writer):
    log = open_log(tmp_path, writer)
    assert (log.first_offset, log.next_offset) == (0, 0)
    offsets = await append_all(log, [dead(i) for i in range(5)])
    assert offsets == [0, 1, 2, 3, 4]
    assert (log.first_offset, log.next_offset) == (0, 5)
    got = await read(log, 0)
    assert [r.offset for r in got] == offsets
    assert got[3].to_json() == {**dead(3).to_json(), "offset": 3}


async def test_read_from_an_offset_with_a_limit(tmp_path, writer):
    log = open_log(tmp_path, writer)
    await append_all(log, [dead(i) for i in range(300)])  # several sparse-index marks
    got = await read(log, 130, 25)
    assert [r.offset for r in got] == list(range(130, 155))
    assert [r.message_id for r in got] == ["m%d" % i for i in range(130, 155)]
    assert await read(log, 300) == []
    assert [r.offset for r in await read(log, 295, 100)] == list(range(295, 300))


async def test_a_record_is_readable_only_once_durable(tmp_path, writer):
    """next_offset advances in the writer's callbacks, with on_durable."""
    log = open_log(tmp_path, writer)
    seen = []
    offset = log.append(dead(0), lambda: seen.append(log.next_offset))
    assert (offset, log.next_offset, seen) == (0, 0, [])  # the commit's callback needs a loop turn
    await settle(writer)
    assert seen == [1] and log.next_offset == 1


async def test_bodies_can_be_left_out(tmp_path, writer):
    log = open_log(tmp_path, writer, include_bodies=False)
    await append_all(log, [dead(7, body=b"x" * 1000)])
    (got,) = await read(log, 0)
    assert got.body is None and got.body_size == 1000 and got.to_json()["body"] is None


async def test_offsets_continue_after_restart(tmp_path, writer):
    log = open_log(tmp_path, writer, segment_bytes=4096)
    await append_all(log, [dead(i) for i in range(100)])
    assert len(segment_files(log)) > 1
    await settle(writer)
    with restarted() as writer2:
        again = open_log(tmp_path, writer2, segment_bytes=4096)
        assert (again.first_offset, again.next_offset) == (0, 100)
        assert await append_all(again, [dead(100), dead(101)]) == [100, 101]
        got = await read(again, 0, 1000)
        assert [r.offset for r in got] == list(range(102))


async def test_segments_roll_and_reads_cross_them(tmp_path, writer):
    log = open_log(tmp_path, writer, segment_bytes=2048)
    await append_all(log, [dead(i) for i in range(200)])
    files = segment_files(log)
    assert len(files) > 5
    assert files[0] == "%020d.log" % 0
    assert all(os.path.getsize(os.path.join(log.directory, f)) <= 2048 for f in files)
    assert [r.offset for r in await read(log, 37, 150)] == list(range(37, 187))


async def test_torn_tail_is_truncated_logged_and_offsets_continue(tmp_path, writer, caplog):
    log = open_log(tmp_path, writer)
    await append_all(log, [dead(i) for i in range(10)])
    await settle(writer)
    path = os.path.join(log.directory, segment_files(log)[-1])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)  # the last record is cut short
    with restarted() as writer2:
        with caplog.at_level(logging.ERROR, logger="hutch.storage"):
            again = open_log(tmp_path, writer2)
        assert "torn tail" in caplog.text
        assert again.next_offset == 9
        await settle(writer2)  # the truncation is a writer job
        assert os.path.getsize(path) < size - 7
        assert await append_all(again, [dead(42)]) == [9]
        got = await read(again, 0)
        assert [r.offset for r in got] == list(range(10))
        assert got[-1].message_id == "m42"


async def test_a_corrupt_record_in_the_middle_is_skipped(tmp_path, writer, caplog):
    log = open_log(tmp_path, writer)
    await append_all(log, [dead(i) for i in range(5)])
    await settle(writer)
    path = os.path.join(log.directory, segment_files(log)[0])
    data = bytearray(open(path, "rb").read())
    records, _ = record.scan(bytes(data))
    data[records[2][0] + 10] ^= 0xFF  # flip a byte inside record 2's body
    open(path, "wb").write(bytes(data))
    with restarted() as writer2:
        with caplog.at_level(logging.ERROR, logger="hutch.storage"):
            again = open_log(tmp_path, writer2)
        assert "corrupt" in caplog.text
        assert again.next_offset == 5
        assert [r.offset for r in await read(again, 0)] == [0, 1, 3, 4]
        assert [r.offset for r in await read(again, 2)] == [3, 4]


async def test_retention_by_size_deletes_whole_old_segments(tmp_path, writer):
    log = open_log(tmp_path, writer, segment_bytes=2048, retention_bytes=6000)
    await append_all(log, [dead(i) for i in range(300)])
    await settle(writer)
    files = segment_files(log)
    assert sum(os.path.getsize(os.path.join(log.directory, f)) for f in files) <= 6000 + 2048
    assert log.deleted_segments > 0
    first = log.first_offset
    assert first > 0 and files[0] == "%020d.log" % first
    got = await read(log, 0, 1000)
    assert [r.offset for r in got] == list(range(first, 300))


async def test_retention_by_age_keeps_the_active_segment(tmp_path, writer):
    now = [time.time()]
    log = open_log(tmp_path, writer, clock=lambda: now[0], segment_bytes=2048, retention_seconds=60)
    await append_all(log, [dead(i, when=now[0]) for i in range(50)])
    assert len(segment_files(log)) > 1
    now[0] += 61
    await read(log, 0)  # a read applies retention
    await settle(writer)
    assert len(segment_files(log)) == 1  # the active segment is never deleted
    assert log.first_offset == int(segment_files(log)[0][:20])
    assert await append_all(log, [dead(50, when=now[0])]) == [50]


async def test_retention_then_restart_keeps_offsets_monotonic(tmp_path, writer):
    log = open_log(tmp_path, writer, segment_bytes=1024, retention_bytes=1)
    await append_all(log, [dead(i) for i in range(60)])
    await settle(writer)
    assert len(segment_files(log)) == 1
    with restarted() as writer2:
        again = open_log(tmp_path, writer2, segment_bytes=1024, retention_bytes=1)
        assert again.next_offset == 60
        assert await append_all(again, [dead(60)]) == [60]


def test_from_message_takes_properties_and_headers():
    props = commands.Basic.Properties(
        content_type="application/json", message_id="id-1", correlation_id="c-1", app_id="billing",
        timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        headers={"CC": ["other"], "n": 1, "raw": bytearray(b"\xff"), "when": datetime.datetime(2024, 1, 1)})
    message = Message("amq.direct", "key", _content_header(props, 5), b"hello")
    rec = from_message(message, "/", "orders", "expired", 1.5, ["key", "other"], "dlx", None, 2)
    j = rec.to_json()
    assert j["routing_keys"] == ["key", "other"]
    assert j["properties"] == {
        "content_type": "application/json", "message_id": "id-1", "correlation_id": "c-1", "app_id": "billing",
        "timestamp": 1704164645, "headers": {"CC": ["other"], "n": 1, "raw": "\ufffd", "when": 1704067200}}
    assert (j["reason"], j["queue"], j["exchange"], j["dead_letter_exchange"], j["death_count"]) == \
        ("expired", "orders", "amq.direct", "dlx", 2)
    assert j["body"] == "aGVsbG8=" and j["body_size"] == 5


def _content_header(props: commands.Basic.Properties, size: int) -> bytes:
    """The content-header frame payload, as the broker keeps it."""
    return header.ContentHeader(0, size, props).marshal()


def test_json_value_of_nested_tables():
    assert json_value({"a": [b"x", {"b": datetime.datetime(1970, 1, 1, 0, 1)}]}) == {"a": ["x", {"b": 60}]}


async def test_a_read_stops_after_max_bytes_but_returns_at_least_one(tmp_path, writer):
    log = open_log(tmp_path, writer)
    await append_all(log, [dead(i, body=b"x" * 10_000) for i in range(10)])
    fut = asyncio.get_running_loop().create_future()
    log.read(2, 100, fut.set_result, max_bytes=25_000)
    assert [r.offset for r in await fut] == [2, 3, 4]
    fut = asyncio.get_running_loop().create_future()
    log.read(0, 100, fut.set_result, max_bytes=1)
    assert [r.offset for r in await fut] == [0]


async def test_segments_of_the_first_format_are_taken_over(tmp_path, writer):
    """Before the log engine, segments were `<offset>.dlog` files of records
    (offset, time ms, death count, body size, metadata length, flags, JSON, body)."""
    import json
    import struct
    directory = tmp_path / "dead_letters"
    directory.mkdir()
    meta = json.dumps({"vhost": "/", "queue": "q", "reason": "expired", "exchange": "ex", "routing_keys": ["k"],
                       "dead_letter_exchange": None, "dead_letter_routing_key": None, "delivery_count": 0,
                       "content_type": None, "message_id": "old", "correlation_id": None, "app_id": None,
                       "timestamp": None, "headers": None}).encode()
    old = b"".join(record.encode(struct.pack(">QQIIIB", offset, 1700000000000 + offset, 1, 4, len(meta), 1)
                                 + meta + b"body") for offset in (7, 8))
    (directory / ("%020d.dlog" % 7)).write_bytes(old)
    log = open_log(tmp_path, writer)
    assert (log.first_offset, log.next_offset) == (7, 9)
    got = await read(log, 0)
    assert [(r.offset, r.message_id, r.reason, r.body, r.time) for r in got] == [
        (7, "old", "expired", b"body", 1700000000.007), (8, "old", "expired", b"body", 1700000000.008)]
    assert await append_all(log, [dead(9)]) == [9]
    assert segment_files(log) == ["%020d.log" % 7]
