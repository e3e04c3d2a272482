"""storage.queue_index: the per-queue index (segment files addressed by seq)."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import record
from storage.queue_index import MAX_OPEN_FILES, IndexEntry, QueueIndex
from storage.writer import GroupCommitWriter


def mid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def files(directory) -> list[str]:
    try:
        return sorted(os.listdir(directory), key=lambda name: int(name.split(".")[0]))
    except FileNotFoundError:
        return []


_opened: list[QueueIndex] = []  # by the running test: closed at its teardown (raw fds)


def open_index(directory, writer, **kw) -> QueueIndex:
    index = QueueIndex(str(directory), writer, **kw)
    _opened.append(index)
    return index


@pytest.fixture
async def writers():
    """Make GroupCommitWriters on the running loop; at teardown every index
    the test opened is closed and every writer stopped."""
    made: list[GroupCommitWriter] = []

    def make(durability: str = "fsync") -> GroupCommitWriter:
        writer = GroupCommitWriter(asyncio.get_running_loop(), durability)
        made.append(writer)
        return writer

    yield make
    while _opened:
        _opened.pop().close()
    for writer in made:
        writer.stop()


async def settle(writer: GroupCommitWriter) -> None:
    """Wait until every job queued so far has been committed."""
    fut = asyncio.get_running_loop().create_future()
    writer.run(lambda: None, fut.set_result)
    await fut


async def read(index: QueueIndex, segment: int) -> list[IndexEntry]:
    fut = asyncio.get_running_loop().create_future()
    index.read_segment(segment, fut.set_result)
    result = await fut
    assert not isinstance(result, Exception), result
    return result


def reopen(directory, writer, **kw):
    index = open_index(directory, writer, **kw)
    entries, report = index.recover()
    return index, entries, report


async def test_publish_deliver_ack_then_recover(tmp_path, writers):
    writer = writers()
    index, entries, report = reopen(tmp_path / "q", writer, embed_below=64)
    assert entries == [] and report.segments == 0 and report.next_seq == 0
    confirmed = []
    for seq in range(10):
        payload = bytes([seq]) * (10 if seq % 2 else 100)  # odd seqs embedded
        embedded = index.publish(seq, mid(seq), size=seq * 3, payload=payload,
                                 expiry=1000 + seq if seq == 3 else 0,
                                 done=lambda seq=seq: confirmed.append(seq))
        assert embedded == bool(seq % 2)
    index.deliver([1, 2, 3, 8])
    index.ack([0, 2, 5])
    index.deliver([7])
    assert index.stats()["entries"] == 7
    await settle(writer)
    assert confirmed == list(range(10))  # done in submission order, after the commit
    writer.stop()

    index2, entries, report = reopen(tmp_path / "q", writers(), embed_below=64)
    assert [e.seq for e in entries] == [1, 3, 4, 6, 7, 8, 9]
    by_seq = {e.seq: e for e in entries}
    assert {s for s, e in by_seq.items() if e.delivered} == {1, 3, 7, 8}
    for e in entries:
        assert e.msg_id == mid(e.seq) and e.size == e.seq * 3 and e.persistent
        assert e.payload == (bytes([e.seq]) * 10 if e.seq % 2 else None)
    assert by_seq[3].expiry == 1003 and by_seq[4].expiry == 0
    assert report.next_seq == index2.next_seq == 10
    assert report.entries == 7 and not report.damaged
    assert report.store_refs == {mid(4): 1, mid(6): 1, mid(8): 1}
    assert index2.segments() == [0]
    assert index2.stats()["entries"] == 7
    # the recovered index keeps working: ack the rest, publish on
    index2.ack([1, 3, 4, 6, 7, 8, 9])
    assert index2.segments() == []
    index2.publish(10, mid(10), 1, b"x")


async def test_embedding_threshold(tmp_path, writers):
    writer = writers()
    index, _, _ = reopen(tmp_path / "q", writer, embed_below=100)
    assert index.publish(0, mid(0), 99, b"a" * 99) is True
    assert index.publish(1, mid(1), 100, b"b" * 100) is False
    assert index.publish(2, mid(2), 0, b"") is True
    writer.stop()
    _, entries, report = reopen(tmp_path / "q", writers(), embed_below=100)
    assert [e.payload for e in entries] == [b"a" * 99, None, b""]
    assert report.store_refs == {mid(1): 1}


async def test_fully_acked_segments_are_deleted(tmp_path, writers):
    writer = writers()
    q = tmp_path / "q"
    index, _, _ = reopen(q, writer, segment_entries=4)
    for seq in range(12):
        index.publish(seq, mid(seq), 1, b"p")
    await settle(writer)
    assert files(q) == ["0.idx", "1.idx", "2.idx"]
    index.ack(range(4))
    await settle(writer)
    assert files(q) == ["1.idx", "2.idx"] and index.segments() == [1, 2]
    index.ack(range(4, 12))
    await settle(writer)
    # the head (segment being published into) is kept while it is the head
    assert files(q) == ["2.idx"] and index.segments() == []
    assert index.stats()["segments"] == 1 and index.stats()["entries"] == 0
    index.publish(12, mid(12), 1, b"p")  # head moves on: the empty old head goes
    await settle(writer)
    assert files(q) == ["3.idx"]
    index.ack([12])
    index.publish(13, mid(13), 1, b"p")  # same (head) segment, file still there
    await settle(writer)
    assert files(q) == ["3.idx"]
    # a deleted segment is recreated by a later publish into it
    index.publish(20, mid(20), 1, b"p")
    index.ack([13])
    index.publish(14, mid(14), 1, b"p")
    await settle(writer)
    assert files(q) == ["3.idx", "5.idx"]
    index.ack([14])
    await settle(writer)
    assert files(q) == ["5.idx"]
    index.publish(15, mid(15), 1, b"again")
    await settle(writer)
    assert files(q) == ["3.idx", "5.idx"]
    writer.stop()
    index2, entries, report = reopen(q, writers(), segment_entries=4)
    assert [(e.seq, e.payload) for e in entries] == [(15, b"again"), (20, b"p")]
    assert report.next_seq == 21 and report.deleted_segments == []


async def test_recovery_deletes_acked_segments_but_keeps_the_head(tmp_path, writers):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer, segment_entries=4)
    for seq in range(6):
        index.publish(seq, mid(seq), 1, b"p")
    index.ack([4, 5])  # head segment 1 fully acked, kept
    writer.stop()
    _, entries, report = reopen(q, writers(), segment_entries=4)
    assert [e.seq for e in entries] == [0, 1, 2, 3] and report.next_seq == 6
    assert files(q) == ["0.idx", "1.idx"]


async def test_read_segment(tmp_path, writers):
    writer = writers()
    index, _, _ = reopen(tmp_path / "q", writer, segment_entries=4, embed_below=8)
    for seq in range(10):
        index.publish(seq, mid(seq), seq, b"s%d" % seq if seq != 6 else b"large-payload")
    index.deliver([1, 5])
    index.ack([4])
    # no waiting for durability: the read is queued behind the writes
    entries = await read(index, 1)
    assert [(e.seq, e.delivered, e.payload) for e in entries] == [
        (5, True, b"s5"), (6, False, None), (7, False, b"s7")]
    assert entries[1].msg_id == mid(6) and entries[1].size == 6
    assert [e.seq for e in await read(index, 2)] == [8, 9]
    assert [e.seq for e in await read(index, 0)] == [0, 1, 2, 3]
    assert await read(index, 7) == []
    # only what was live at the call: a later ack does not matter, an earlier one does
    index.ack([8])
    fut = asyncio.get_running_loop().create_future()
    index.read_segment(2, fut.set_result)
    index.ack([9])
    assert [e.seq for e in await fut] == [9]
    assert await read(index, 2) == []


async def test_torn_tail_recovers_intact_entries(tmp_path, writers, caplog):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer)
    for seq in range(5):
        index.publish(seq, mid(seq), 100, b"m%d" % seq)
    writer.stop()
    path = q / "0.idx"
    size = path.stat().st_size
    os.truncate(path, size - 3)  # cut the last record short
    caplog.set_level(logging.INFO, logger="hutch.storage")
    _, entries, report = reopen(q, writers())
    assert [e.seq for e in entries] == [0, 1, 2, 3]
    assert report.truncated_bytes > 0 and report.damaged
    assert "torn tail" in caplog.text
    assert path.stat().st_size < size - 3  # truncated to the last complete record
    assert report.next_seq == 4


async def test_corrupt_middle_record_is_skipped(tmp_path, writers, caplog):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer)
    for seq in range(5):
        index.publish(seq, mid(seq), 100, b"message-%d" % seq)
    index.deliver([3])
    writer.stop()
    path = q / "0.idx"
    data = bytearray(path.read_bytes())
    records, _ = record.scan(bytes(data))
    offset = records[2][0]
    data[offset + 20] ^= 0x55  # inside the body of seq 2's publish record
    path.write_bytes(bytes(data))
    caplog.set_level(logging.INFO, logger="hutch.storage")
    index2, entries, report = reopen(q, writers())
    assert [(e.seq, e.delivered, e.payload) for e in entries] == [
        (0, False, b"message-0"), (1, False, b"message-1"), (3, True, b"message-3"),
        (4, False, b"message-4")]
    assert report.corrupt_regions == 1 and report.truncated_bytes == 0
    assert "corrupt" in caplog.text
    assert index2.stats()["entries"] == 4


async def test_invalid_records_are_counted_and_skipped(tmp_path, writers, caplog):
    q = tmp_path / "q"
    q.mkdir()
    # well framed, but not index records of segment 0 (seq 9 belongs to segment 2)
    (q / "0.idx").write_bytes(record.encode(b"\x09junk") + record.encode(b"\x03" + (9).to_bytes(8, "big")))
    (q / "notes.txt").write_text("x")
    (q / "01.idx").write_bytes(b"")  # not a name the index writes
    caplog.set_level(logging.INFO, logger="hutch.storage")
    _, entries, report = reopen(q, writers(), segment_entries=4)
    assert entries == [] and report.invalid_records == 2 and report.damaged
    assert "not index records" in caplog.text and "unexpected file" in caplog.text


async def test_transient_entries_do_not_survive_restart(tmp_path, writers):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer, segment_entries=4)
    for seq in range(6):
        index.publish(seq, mid(seq), 1, b"p", persistent=seq % 2 == 0)
    writer.stop()
    keep = open_index(q, writers("flush"), segment_entries=4)
    entries, report = keep.recover(drop_transient=False)
    assert [(e.seq, e.persistent) for e in entries] == [(s, s % 2 == 0) for s in range(6)]
    keep._writer.stop()
    writer = writers()
    index, entries, report = reopen(q, writer, segment_entries=4)
    assert [e.seq for e in entries] == [0, 2, 4] and report.dropped_transient == 3
    assert index.stats()["entries"] == 3
    index.ack([4])  # the head: nothing live, kept
    writer.stop()
    _, entries, report = reopen(q, writers(), segment_entries=4)
    assert [e.seq for e in entries] == [0, 2] and report.dropped_transient == 0


async def test_recover_max_entries_loads_whole_segments(tmp_path, writers):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer, segment_entries=4, embed_below=2)
    for seq in range(10):
        index.publish(seq, mid(seq), 1, b"pp")  # not embedded
    writer.stop()
    index = open_index(q, writers(), segment_entries=4)
    entries, report = index.recover(max_entries=5)
    assert [e.seq for e in entries] == list(range(8))
    assert report.unloaded_segments == [2] and report.entries == 10
    assert len(report.store_refs) == 10
    assert [e.seq for e in await read(index, 2)] == [8, 9]


async def test_delete_removes_every_file(tmp_path, writers):
    q = tmp_path / "q"
    writer = writers()
    index, _, _ = reopen(q, writer, segment_entries=4)
    for seq in range(10):
        index.publish(seq, mid(seq), 1, b"p")
    index.delete()
    await settle(writer)
    assert not q.exists()
    with pytest.raises(RuntimeError):
        index.publish(10, mid(10), 1, b"p")
    # a queue of the same name declared again starts empty
    index2 = open_index(q, writer, segment_entries=4)
    index2.publish(0, mid(0), 1, b"new")
    await settle(writer)
    assert files(q) == ["0.idx"]


async def test_bad_input(tmp_path, writers):
    index, _, _ = reopen(tmp_path / "q", writers("flush"))
    with pytest.raises(ValueError):
        index.publish(0, b"short", 1, b"p")
    with pytest.raises(ValueError):
        index.publish(-1, mid(0), 1, b"p")
    assert index.stats()["segments"] == 0
    index.publish(0, mid(0), 1, b"p")
    with pytest.raises(ValueError):
        index.publish(0, mid(0), 1, b"p")
    index.ack([0, 0, 7, 99999])  # unknown or already acked seqs are ignored
    assert index.ignored == 3 and index.stats()["entries"] == 0


async def test_open_files_are_bounded(tmp_path, writers):
    writer = writers()
    index, _, _ = reopen(tmp_path / "q", writer, segment_entries=2)
    for seq in range(40):
        index.publish(seq, mid(seq), 1, b"p")
    index.deliver(range(0, 40, 2))  # touches all 20 segments again
    await settle(writer)
    segs = index._segments.values()
    assert len(index._open) <= MAX_OPEN_FILES
    assert sum(seg.file._fd is not None for seg in segs) <= MAX_OPEN_FILES
    index.close()
    await settle(writer)
    assert all(seg.file._fd is None for seg in segs)
    writer.stop()
    _, entries, _ = reopen(tmp_path / "q", writers(), segment_entries=2)
    assert [(e.seq, e.delivered) for e in entries] == [(s, s % 2 == 0) for s in range(40)]


async def test_memory_stays_per_segment(tmp_path, writers):
    """200,000 publishes and acks: bookkeeping is per segment (a bitmap), not
    per message, and at most one (the head) segment file is left."""
    q = tmp_path / "q"
    writer = writers("flush")
    index, _, _ = reopen(q, writer, embed_below=0)
    msg_id = mid(1)
    peak = 0
    seq = 0
    for _ in range(200):
        start = seq
        for _ in range(1000):
            index.publish(seq, msg_id, 10, b"")
            seq += 1
        peak = max(peak, index.stats()["bookkeeping_bytes"])
        index.deliver(range(start, seq))
        index.ack(range(start, seq))
    stats = index.stats()
    assert stats["entries"] == 0 and index.segments() == []
    assert stats["segments"] <= 1
    assert peak < 3 * 4096  # two segments of 16384 slots at most: 2 KiB bitmaps each
    assert len(index._segments) <= 1 and len(index._open) <= MAX_OPEN_FILES
    await settle(writer)
    assert len(files(q)) <= 1
    writer.stop()
    _, entries, report = reopen(q, writers())
    assert entries == [] and report.next_seq == 200_000


# -- stateful: publish / deliver / ack / restart against a model --------------

SEG = 4
EMBED = 8


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="qi-")
        self.loop = asyncio.new_event_loop()
        self.writer = None
        self.model: dict[int, list] = {}  # seq -> [msg_id, size, payload|None, persistent, delivered]
        self.next = 0
        self.ever = False
        self.start()

    def start(self) -> None:
        self.writer = GroupCommitWriter(self.loop, "flush")
        self.index = QueueIndex(self.dir, self.writer, embed_below=EMBED, segment_entries=SEG)
        entries, report = self.index.recover()
        for seq in [s for s, m in self.model.items() if not m[3]]:
            del self.model[seq]
        assert [(e.seq, e.msg_id, e.size, e.payload, e.persistent, e.delivered) for e in entries] == [
            (seq, *self.model[seq]) for seq in sorted(self.model)]
        assert report.next_seq == (self.next if self.ever else 0)
        assert not report.damaged

    @rule(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6),
          gap=st.integers(0, 5), transient=st.booleans(), delivered=st.booleans())
    def publish(self, sizes, gap, transient, delivered):
        """`delivered`: published straight to a consumer (the record's flag)."""
        self.next += gap
        for size in sizes:
            seq = self.next
            payload = bytes([seq % 251]) * size
            persistent = not (transient and size % 2)
            embedded = self.index.publish(seq, mid(seq * 7), size, payload, persistent=persistent,
                                          delivered=delivered)
            assert embedded == (size < EMBED)
            self.model[seq] = [mid(seq * 7), size, payload if embedded else None, persistent, delivered]
            self.next += 1
            self.ever = True

    @precondition(lambda self: self.model)
    @rule(data=st.data(), bogus=st.integers(0, 60))
    def deliver(self, data, bogus):
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=6))
        self.index.deliver(seqs + [bogus])  # bogus: a seq that may or may not be live
        for seq in seqs + [bogus]:
            if seq in self.model:
                self.model[seq][4] = True

    @precondition(lambda self: self.model)
    @rule(data=st.data(), bogus=st.integers(0, 60))
    def ack(self, data, bogus):
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=8, unique=True))
        if bogus not in self.model:
            seqs.append(bogus)
        self.index.ack(seqs)
        for seq in seqs:
            self.model.pop(seq, None)

    @rule()
    def restart(self):
        self.index.close()
        self.writer.stop()
        head = (self.next - 1) // SEG if self.ever else None
        on_disk = {int(name.split(".")[0]) for name in os.listdir(self.dir)} if os.path.isdir(self.dir) else set()
        live = {seq // SEG for seq in self.model}
        assert live <= on_disk <= live | {head}
        self.start()

    @rule(segment=st.integers(0, 20))
    def read_segment(self, segment):
        fut = self.loop.create_future()
        self.index.read_segment(segment, fut.set_result)
        entries = self.loop.run_until_complete(fut)
        assert [(e.seq, e.msg_id, e.size, e.payload, e.persistent, e.delivered) for e in entries] == [
            (seq, *self.model[seq]) for seq in sorted(self.model) if seq // SEG == segment]

    @invariant()
    def counters(self):
        assert self.index.segments() == sorted({seq // SEG for seq in self.model})
        assert self.index.stats()["entries"] == len(self.model)

    def teardown(self):
        self.index.close()
        self.writer.stop()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


IndexMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_index_state_machine = IndexMachine.TestCase


# -- recovery summaries (clean stop and start) --------------------------------------


async def _index_with_history(directory, writer) -> QueueIndex:
    """Four segments of 8: persistent and transient entries, embedded and
    not, some delivered, some acked (segment 1 entirely)."""
    index, _, _ = reopen(directory, writer, embed_below=64, segment_entries=8)
    for seq in range(30):
        index.publish(seq, mid(seq), size=seq, payload=bytes(10 if seq % 3 else 100),
                      persistent=seq % 4 != 1)
    index.deliver([2, 3, 20, 21])
    index.ack([0, 5, 29] + list(range(8, 16)))
    await settle(writer)
    return index


async def test_a_summary_gives_what_the_scan_gives(tmp_path, writers):
    writer = writers()
    index = await _index_with_history(tmp_path / "q", writer)
    writer.stop()
    index.write_summary(entry_bytes=1234)
    shutil.copytree(tmp_path / "q", tmp_path / "copy")
    os.unlink(tmp_path / "copy" / "recovery.summary")

    fast = open_index(tmp_path / "q", writers(), embed_below=64, segment_entries=8)
    report = fast.recover_summary()
    assert report is not None and report.from_summary and report.records == 0
    assert not os.path.exists(tmp_path / "q" / "recovery.summary")  # used once
    scanned = open_index(tmp_path / "copy", writers(), embed_below=64, segment_entries=8)
    _, scan_report = scanned.recover(max_entries=0)
    for field_name in ("entries", "next_seq", "first_seq", "dropped_transient", "deleted_segments"):
        assert getattr(report, field_name) == getattr(scan_report, field_name), field_name
    assert report.entry_bytes == 1234  # the caller's count, kept
    assert fast.segments() == scanned.segments() == [0, 2, 3]
    for segment in fast.segments():
        assert await read(fast, segment) == await read(scanned, segment)
    assert fast.store_refs() == scan_report.store_refs != {}
    # both dropped the transient entries on disk: the next scans agree too
    fast._writer.stop()
    scanned._writer.stop()
    _, _, again = reopen(tmp_path / "q", writers(), embed_below=64, segment_entries=8)
    assert again.entries == report.entries and again.dropped_transient == 0


@pytest.mark.parametrize("change", ["append", "remove", "summary"])
async def test_a_summary_that_does_not_match_is_refused(tmp_path, writers, change, caplog):
    writer = writers()
    index = await _index_with_history(tmp_path / "q", writer)
    writer.stop()
    index.write_summary(entry_bytes=0)
    if change == "append":
        with open(tmp_path / "q" / "2.idx", "ab") as f:
            f.write(b"\x00")
    elif change == "remove":
        os.unlink(tmp_path / "q" / "3.idx")
    else:
        with open(tmp_path / "q" / "recovery.summary", "r+b") as f:
            f.seek(20)
            f.write(b"\xff")
    fast = open_index(tmp_path / "q", writers(), embed_below=64, segment_entries=8)
    with caplog.at_level(logging.INFO, "hutch.storage"):
        assert fast.recover_summary() is None
    assert "recovery summary not used" in caplog.text
    assert not os.path.exists(tmp_path / "q" / "recovery.summary")
    _, report = fast.recover(max_entries=0)  # the fallback
    assert report.entries > 0


async def test_a_non_durable_index_is_never_fsynced(tmp_path, writers, monkeypatch):
    """Its files only hold paged-out messages of a queue no restart
    recovers: the group commit skips their fsync (files and directory)."""
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink("/proc/self/fd/%d" % fd))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    writer = writers("fsync")
    durable = open_index(tmp_path / "durable", writer, segment_entries=4)
    transient = open_index(tmp_path / "transient", writer, segment_entries=4, durable=False)
    confirmed = []
    for index in (durable, transient):
        for seq in range(10):
            index.publish(seq, mid(seq), 1, b"p", done=lambda: confirmed.append(1))
        index.ack(range(6))
    await settle(writer)
    assert len(confirmed) == 20
    assert any(path.startswith(str(tmp_path / "durable")) for path in synced)
    assert not any(path.startswith(str(tmp_path / "transient")) for path in synced), synced
