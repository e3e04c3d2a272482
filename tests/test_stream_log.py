"""storage.stream_log / storage.log_segment: the log engine under stream
queues and the dead-letter log. Real files in tmp_path and a real group-commit
writer; a "restart" is a new writer and a new StreamLog over the same files."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import record
from storage.log_segment import HEAD, INDEX_INTERVAL, SCAN_CHUNK
from storage.stream_log import LogSettings, StreamLog, offset_at_time, read_records, segment_names
from storage.writer import GroupCommitWriter


@contextlib.asynccontextmanager
async def running_writer():
    writer = GroupCommitWriter(asyncio.get_running_loop())
    try:
        yield writer
    finally:
        writer.stop()


def open_log(directory, writer, clock=None, **limits) -> StreamLog:
    log = StreamLog(str(directory), writer, LogSettings(**limits), **({"clock": clock} if clock else {}))
    log.recover()
    return log


async def append_all(log: StreamLog, payloads, timestamps=None) -> list[int]:
    loop = asyncio.get_running_loop()
    futures, offsets = [], []
    for i, payload in enumerate(payloads):
        fut = loop.create_future()
        stamp = None if timestamps is None else timestamps[i]
        offsets.append(log.append(payload, stamp, lambda f=fut: f.set_result(None)))
        futures.append(fut)
    await asyncio.gather(*futures)
    return offsets


async def settle(writer: GroupCommitWriter) -> None:
    fut = asyncio.get_running_loop().create_future()
    writer.run(lambda: None, lambda _r: fut.set_result(None))
    await fut


def payload(i: int, size: int = 40) -> bytes:
    return (b"record-%d-" % i).ljust(size, b"x")


def read_all(log: StreamLog, start: int = 0, max_records: int = 10**9, max_bytes: int = 0):
    segments, limit = log.snapshot()
    return read_records(segments, start, max_records, limit, max_bytes)


async def test_offsets_count_from_zero_and_records_read_back_with_their_timestamps(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer)
        assert await append_all(log, [payload(i) for i in range(5)], [100.0 + i for i in range(5)]) == list(range(5))
        got = read_all(log)
        assert [(o, t, p) for o, t, p in got] == [(i, 100_000 + i * 1000, payload(i)) for i in range(5)]
        assert read_all(log, 3) == got[3:]
        assert log.next_offset == 5 and log.first_offset == 0


async def test_files_are_kafkas_log_index_and_timeindex_with_a_sparse_index(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=10**6)
        await append_all(log, [payload(i, 1000) for i in range(100)])
        await settle(writer)
        names = sorted(os.listdir(tmp_path / "s"))
        assert names == ["%020d.index" % 0, "%020d.log" % 0, "%020d.timeindex" % 0]
        index = open(tmp_path / "s" / names[0], "rb").read()
        entries = list(struct.iter_unpack(">II", index))
        # one entry for the first record, then one per INDEX_INTERVAL bytes
        assert entries[0] == (0, 0)
        assert 100 * 1000 // INDEX_INTERVAL - 2 <= len(entries) <= 100 * 1000 // INDEX_INTERVAL + 2
        log_size = os.path.getsize(tmp_path / "s" / names[1])
        assert all(p < log_size for _o, p in entries)


async def test_a_record_is_readable_only_once_durable(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer)
        log.append(b"a")
        assert read_all(log) == []  # not synced yet
        await settle(writer)
        assert [p for _o, _t, p in read_all(log)] == [b"a"]


async def test_segments_roll_and_reads_cross_them_with_limits(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=2048)
        await append_all(log, [payload(i) for i in range(300)])
        await settle(writer)
        names = segment_names(str(tmp_path / "s"))
        assert len(names) > 5 and names[0] == "%020d.log" % 0
        assert all(os.path.getsize(tmp_path / "s" / n) <= 2048 for n in names)
        assert [o for o, _t, _p in read_all(log, 37, 150)] == list(range(37, 187))
        assert len(read_all(log, 0, 1000, max_bytes=100)) == 3  # stops once past 100 bytes
        fut = asyncio.get_running_loop().create_future()
        log.read(290, 100, fut.set_result)
        assert [o for o, _t, _p in await fut] == list(range(290, 300))


async def test_look_up_by_timestamp(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=4096)
        await append_all(log, [payload(i) for i in range(400)], [1000.0 + i // 4 for i in range(400)])
        segments, limit = log.snapshot()
        assert offset_at_time(segments, 1000_000, limit) == 0
        assert offset_at_time(segments, 1050_000, limit) == 200
        assert offset_at_time(segments, 1050_500, limit) == 204
        assert offset_at_time(segments, 2000_000, limit) == 400
        fut = asyncio.get_running_loop().create_future()
        log.find_time(1099.0, fut.set_result)
        assert await fut == 396


async def test_offsets_continue_after_restart_loaded_from_the_indexes(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=2048)
        await append_all(log, [payload(i) for i in range(200)])
    async with running_writer() as writer:
        again = open_log(tmp_path / "s", writer, segment_bytes=2048)
        assert again.next_offset == 200
        assert await append_all(again, [b"more"]) == [200]
        got = read_all(again)
        assert [o for o, _t, _p in got] == list(range(201))
        assert got[57][2] == payload(57)


async def test_torn_tail_is_truncated_logged_and_offsets_continue(tmp_path, caplog):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer)
        await append_all(log, [payload(i) for i in range(10)])
    path = tmp_path / "s" / segment_names(str(tmp_path / "s"))[-1]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    async with running_writer() as writer:
        with caplog.at_level(logging.ERROR, logger="hutch.storage"):
            again = open_log(tmp_path / "s", writer)
        assert "torn tail" in caplog.text
        assert again.next_offset == 9
        assert await append_all(again, [b"after"]) == [9]
        await settle(writer)
        assert os.path.getsize(path) == size - len(payload(9)) + len(b"after")
        assert [p for _o, _t, p in read_all(again)][-2:] == [payload(8), b"after"]


async def test_a_corrupt_record_in_the_middle_is_skipped_and_logged(tmp_path, caplog):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer)
        await append_all(log, [payload(i) for i in range(5)])
    path = tmp_path / "s" / segment_names(str(tmp_path / "s"))[0]
    data = bytearray(path.read_bytes())
    record_size = len(data) // 5
    data[2 * record_size + 30] ^= 0xFF
    path.write_bytes(bytes(data))
    async with running_writer() as writer:
        with caplog.at_level(logging.ERROR, logger="hutch.storage"):
            again = open_log(tmp_path / "s", writer)
        assert "corrupt" in caplog.text
        assert again.next_offset == 5
        assert [o for o, _t, _p in read_all(again)] == [0, 1, 3, 4]
        assert [o for o, _t, _p in read_all(again, 2)] == [3, 4]


async def test_a_damaged_index_of_a_sealed_segment_is_rebuilt(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=2048)
        await append_all(log, [payload(i) for i in range(100)])
    (tmp_path / "s" / ("%020d.index" % 0)).write_bytes(b"\x00\x00\x00")
    async with running_writer() as writer:
        again = open_log(tmp_path / "s", writer, segment_bytes=2048)
        assert [o for o, _t, _p in read_all(again)] == list(range(100))
        await settle(writer)
    rebuilt = os.path.getsize(tmp_path / "s" / ("%020d.index" % 0))
    assert rebuilt and rebuilt % 8 == 0


async def test_retention_by_size_deletes_whole_oldest_segments(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=2048, max_bytes=6000)
        await append_all(log, [payload(i) for i in range(300)])
        await settle(writer)
        names = segment_names(str(tmp_path / "s"))
        assert sum(os.path.getsize(tmp_path / "s" / n) for n in names) <= 6000 + 2048
        assert log.deleted_segments > 0
        first = log.first_offset
        assert first > 0 and names[0] == "%020d.log" % first
        assert not os.path.exists(tmp_path / "s" / ("%020d.index" % 0))
        assert [o for o, _t, _p in read_all(log)] == list(range(first, 300))


async def test_retention_by_age_keeps_the_active_segment(tmp_path):
    now = [1_000_000.0]
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, clock=lambda: now[0], segment_bytes=2048, max_age=60)
        await append_all(log, [payload(i) for i in range(100)])
        assert log.segment_count > 1
        now[0] += 61
        log.retain()
        await settle(writer)
        assert segment_names(str(tmp_path / "s")) == ["%020d.log" % log.first_offset]
        assert await append_all(log, [b"x"]) == [100]


async def test_retention_then_restart_keeps_offsets_monotonic(tmp_path):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=1024, max_bytes=1)
        await append_all(log, [payload(i) for i in range(60)])
    async with running_writer() as writer:
        again = open_log(tmp_path / "s", writer, segment_bytes=1024, max_bytes=1)
        assert again.segment_count == 1
        assert again.next_offset == 60
        assert await append_all(again, [b"x"]) == [60]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 600), min_size=1, max_size=60),
       segment_bytes=st.integers(64, 3000), cut=st.integers(0, 400), start=st.integers(0, 70))
def test_property_whatever_was_durable_before_a_torn_write_survives_in_order(tmp_path_factory, sizes,
                                                                              segment_bytes, cut, start):
    """Appends of random sizes into random segment sizes, then a torn write
    (bytes past the newest record cut, or garbage appended), then a restart:
    exactly the records that were durable come back, in offset order, with
    their payloads, reads from any offset agree, and offsets go on."""
    directory = tmp_path_factory.mktemp("log")

    async def scenario() -> None:
        payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
        async with running_writer() as writer:
            log = open_log(directory, writer, segment_bytes=segment_bytes)
            await append_all(log, payloads)
        newest = directory / segment_names(str(directory))[-1]
        data = newest.read_bytes()
        if cut and data:  # a torn last record: only its prefix reached the disk
            lost = min(cut, len(data))
            newest.write_bytes(data[:-lost])
        else:
            newest.write_bytes(data + b"\x00\x00\x01\x00garbage")
        async with running_writer() as writer:
            again = open_log(directory, writer, segment_bytes=segment_bytes)
            got = read_all(again)
            offsets = [o for o, _t, _p in got]
            assert offsets == list(range(len(got)))  # in order, no gap, no duplicate
            assert len(got) >= len(payloads) - (1 + cut // 17 if cut else 0) - 1
            assert [p for _o, _t, p in got] == payloads[:len(got)]
            assert read_all(again, start) == got[start:]
            assert await append_all(again, [b"next"]) == [len(got)]

    asyncio.run(scenario())


async def test_damage_found_by_a_reader_costs_at_most_an_index_interval(tmp_path, caplog):
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=20000)
        await append_all(log, [payload(i) for i in range(600)])
        await settle(writer)
        sealed = tmp_path / "s" / segment_names(str(tmp_path / "s"))[0]
        data = bytearray(sealed.read_bytes())
        record_size = len(data) // (log.snapshot()[0][1].base)
        data[5 * record_size + 30] ^= 0xFF  # damage after recovery, in a segment no scan looks at
        sealed.write_bytes(bytes(data))
        with caplog.at_level(logging.ERROR, logger="hutch.storage"):
            offsets = [o for o, _t, _p in read_all(log)]
        assert "corrupt record" in caplog.text
        assert offsets[:5] == [0, 1, 2, 3, 4] and 5 not in offsets
        assert offsets == sorted(offsets) and offsets[-1] == 599
        assert 600 - len(offsets) <= INDEX_INTERVAL // record_size + 1


async def test_recovery_of_a_large_damaged_segment_holds_a_bounded_window(tmp_path, caplog):
    """A 40 MiB segment (1 KiB records and three of 3 MiB, longer than a
    recovery window) damaged three ways: 8 MiB zeroed in the middle (a lost
    extent), one byte flipped in a big record, garbage over the tail. Recovery
    keeps exactly the records outside the damage, with their payloads, and
    never holds more than a few windows of the file (tracemalloc peak), where
    reading the rest of the segment at the first damage holds tens of MiB."""
    sizes = [1024] * 36_000
    for i in (5_000, 20_000, 30_000):
        sizes[i] = 3 << 20
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    async with running_writer() as writer:
        log = open_log(tmp_path / "s", writer, segment_bytes=1 << 30)
        await append_all(log, payloads)
    path = tmp_path / "s" / segment_names(str(tmp_path / "s"))[0]
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + record.OVERHEAD + HEAD.size + n)
    assert os.path.getsize(path) == starts[-1]
    zeroed = (starts[12_000] + 100, starts[12_000] + 100 + (8 << 20))
    flipped = starts[20_000] + 2_000_000  # inside the big record 20,000
    torn = starts[len(sizes) - 3] + 10  # cuts the last three records off
    with open(path, "r+b") as f:
        f.seek(zeroed[0])
        f.write(bytes(zeroed[1] - zeroed[0]))
        f.seek(flipped)
        byte = f.read(1)
        f.seek(flipped)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.seek(torn)
        f.write(b"\x00\x00\x01\x00" + b"garbage" * 100)
        f.truncate()
    lost = {i for i in range(len(sizes)) if starts[i] < zeroed[1] and starts[i + 1] > zeroed[0]}
    lost |= {20_000, len(sizes) - 3, len(sizes) - 2, len(sizes) - 1}
    async with running_writer() as writer:
        tracemalloc.start()
        try:
            with caplog.at_level(logging.ERROR, logger="hutch.storage"):
                again = open_log(tmp_path / "s", writer, segment_bytes=1 << 30)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 3 * SCAN_CHUNK, "recovery held %d bytes" % peak
        assert "corrupt region" in caplog.text and "torn tail" in caplog.text
        segments, limit = again.snapshot()
        kept = [(o, len(p), p[:1]) for o, _t, p in read_records(segments, 0, 10**9, limit, 0)]
        assert [o for o, _n, _b in kept] == [i for i in range(len(sizes)) if i not in lost]
        assert all(n == sizes[o] and b == bytes([o % 251]) for o, n, b in kept)
        assert again.next_offset == len(sizes) - 3
        assert await append_all(again, [b"after"]) == [len(sizes) - 3]
