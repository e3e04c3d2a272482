"""storage.msg_store.MessageStore: the shared message store of a vhost.

Each async test runs its own GroupCommitWriter on the test's loop (fixture
`writer`) and stops it at the end. Thread interleavings that matter (a read
racing a compaction, a remove during one) are forced with gates that park the
reader or the writer thread, not left to chance.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import tempfile
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import record
from storage.msg_store import MessageStore, StoreError, _encode
from storage.writer import GroupCommitWriter

REC = record.OVERHEAD + 16  # record size of an empty payload


def mid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def body(i: int, size: int = 100) -> bytes:
    return bytes([i % 251]) * size


@pytest.fixture
async def writer():
    w = GroupCommitWriter(asyncio.get_running_loop())
    yield w
    w.stop()


def rdq_files(directory) -> dict[int, int]:
    """N -> size of every N.rdq on disk."""
    out = {}
    for name in os.listdir(directory):
        if name.endswith(".rdq"):
            out[int(name[:-4])] = os.path.getsize(os.path.join(directory, name))
    return out


async def drain(writer: GroupCommitWriter) -> None:
    fut = asyncio.get_running_loop().create_future()
    writer.run(lambda: None, lambda _r: fut.set_result(None))
    await fut


async def settle(store: MessageStore, writer: GroupCommitWriter) -> None:
    """Until every write is durable and no compaction/deletion is in flight."""
    for _ in range(1000):
        await drain(writer)
        if store.stats()["jobs_in_flight"] == 0:
            await drain(writer)
            return
    raise AssertionError("store never settled")


async def read(store: MessageStore, msg_id: bytes):
    fut = asyncio.get_running_loop().create_future()
    store.read(msg_id, fut.set_result)
    return await fut


def new_store(tmp_path, writer, limit=16 * 1024 * 1024, wipe=True) -> MessageStore:
    store = MessageStore(str(tmp_path / "store"), writer, file_size_limit=limit)
    if wipe:
        store.wipe()
    return store


def check_accounting(store: MessageStore) -> None:
    """Invariant 2 of the module, and index <-> file entries."""
    live = 0
    for f in store._files.values():
        assert f.live == sum(e.size for e in f.entries)
        assert f.live <= f.total
        live += f.live
    assert live == sum(e.size for e in store._index.values())
    assert store.stats()["live_bytes"] == live


# -- basics ------------------------------------------------------------------

def test_encode_is_record_encode():
    for payload in (b"", b"x", os.urandom(1000)):
        assert _encode(mid(7), payload) == record.encode(mid(7) + payload)


async def test_round_trip_pending_cache_then_disk(tmp_path, writer):
    store = new_store(tmp_path, writer)
    done = asyncio.Event()
    store.write(mid(1), b"hello", done.set)
    assert store._index[mid(1)].payload == b"hello"  # pending: served from memory
    assert await read(store, mid(1)) == b"hello"
    await done.wait()
    assert store._index[mid(1)].payload is None  # dropped from the cache once written
    reads_before = []
    real_read = writer.read
    writer.read = lambda fn, cb: (reads_before.append(1), real_read(fn, cb))
    assert await read(store, mid(1)) == b"hello"  # from disk, on the reader thread
    assert reads_before == [1]
    assert store.contains(mid(1)) and store.refcount(mid(1)) == 1
    assert not store.contains(mid(2)) and store.refcount(mid(2)) == 0


async def test_empty_and_large_payloads(tmp_path, writer):
    store = new_store(tmp_path, writer)
    big = os.urandom(3 * 1024 * 1024)
    store.write(mid(1), b"")
    store.write(mid(2), big)
    await settle(store, writer)
    assert await read(store, mid(1)) == b""
    assert await read(store, mid(2)) == big


async def test_done_fires_after_the_batch_with_bytes_in_file(tmp_path, writer):
    store = new_store(tmp_path, writer)
    seen = []
    path = tmp_path / "store" / "0.rdq"

    def done(i):
        def check():
            assert threading.current_thread() is threading.main_thread()
            seen.append((i, record.encode(mid(i) + body(i)) in path.read_bytes()))
        return check

    batches = writer.batches
    for i in range(20):
        store.write(mid(i), body(i), done(i))
    assert seen == []  # never synchronously
    await settle(store, writer)
    assert seen == [(i, True) for i in range(20)]  # in submission order, bytes present
    assert writer.batches > batches


async def test_read_unknown_or_removed(tmp_path, writer):
    store = new_store(tmp_path, writer)
    assert isinstance(await read(store, mid(9)), StoreError)
    store.write(mid(1), b"a")
    await settle(store, writer)
    store.write(mid(2), b"keep")
    # a read queued on the reader thread, then the message removed before it runs
    gate = threading.Event()
    writer.read(lambda: gate.wait(5), lambda _r: None)
    fut = asyncio.get_running_loop().create_future()
    store.read(mid(1), fut.set_result)
    store.remove(mid(1))
    gate.set()
    assert isinstance(await fut, StoreError)
    assert isinstance(await read(store, mid(1)), StoreError)
    store.remove(mid(1))  # unknown: ignored
    assert await read(store, mid(2)) == b"keep"


# -- reference counts ----------------------------------------------------------

async def test_dedup_refcount(tmp_path, writer):
    store = new_store(tmp_path, writer)
    fired = []
    store.write(mid(1), body(1), lambda: fired.append("a"))
    store.write(mid(1), body(1), lambda: fired.append("b"))  # pending: waits for the original
    store.write(mid(1), body(1), lambda: fired.append("c"))
    assert store.refcount(mid(1)) == 3 and fired == []
    await settle(store, writer)
    assert fired == ["a", "b", "c"]
    store.write(mid(1), body(1), lambda: fired.append("d"))  # durable: after the next batch
    assert fired == ["a", "b", "c"]
    await drain(writer)
    assert fired == ["a", "b", "c", "d"]
    assert store.refcount(mid(1)) == 4
    assert rdq_files(tmp_path / "store") == {0: REC + 100}  # one copy on disk
    for left in (3, 2, 1):
        store.remove(mid(1))
        assert store.refcount(mid(1)) == left and await read(store, mid(1)) == body(1)
    store.remove(mid(1))
    assert not store.contains(mid(1))
    assert store.stats()["messages"] == 0 and store.stats()["live_bytes"] == 0


async def test_remove_while_pending_still_confirms(tmp_path, writer):
    store = new_store(tmp_path, writer, limit=4 * (REC + 100))
    fired = []
    for i in range(8):
        store.write(mid(i), body(i), lambda i=i: fired.append(i))
    for i in range(4):
        store.remove(mid(i))  # before the writer has written them
    await settle(store, writer)
    assert fired == list(range(8))
    assert rdq_files(tmp_path / "store") == {1: 4 * (REC + 100)}  # file 0 was all dead
    for i in range(4, 8):
        assert await read(store, mid(i)) == body(i)


# -- files: roll, delete, compact ------------------------------------------------

async def test_roll_and_oversize_record(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=3 * size)
    for i in range(7):
        store.write(mid(i), body(i))
    store.write(mid(100), os.urandom(10 * size))  # bigger than the limit: a file of its own
    store.write(mid(101), body(101))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {0: 3 * size, 1: 3 * size, 2: size,
                                             3: 10 * size + size - 100, 4: size}
    assert [store._index[mid(i)].file.num for i in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert store.stats()["files"] == 5


async def test_remove_deletes_empty_files(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=2 * size)
    for i in range(10):
        store.write(mid(i), body(i))
    await settle(store, writer)
    assert sorted(rdq_files(tmp_path / "store")) == [0, 1, 2, 3, 4]
    for i in range(4):
        store.remove(mid(i))
    store.remove(mid(8))  # half of the current file: not touched
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {2: 2 * size, 3: 2 * size, 4: 2 * size}
    assert store.stats()["file_deletions"] == 2
    for i in range(4, 8):
        assert await read(store, mid(i)) == body(i)
    assert await read(store, mid(9)) == body(9)
    check_accounting(store)


async def test_compaction_under_half_live(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    for i in range(40):
        store.write(mid(i), body(i))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {n: 8 * size for n in range(5)}
    # file 0: half exactly (4 of 8 live) does not compact, 3 of 8 does
    for i in (0, 2, 3, 4):
        store.remove(mid(i))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store")[0] == 8 * size and store.stats()["compactions"] == 0
    store.remove(mid(5))
    await settle(store, writer)
    files = rdq_files(tmp_path / "store")
    assert files[0] == 3 * size and store.stats()["compactions"] == 1
    data = (tmp_path / "store" / "0.rdq").read_bytes()
    for i, offset in ((1, 0), (6, size), (7, 2 * size)):
        entry = store._index[mid(i)]
        assert entry.offset == offset
        assert data[offset:offset + size] == record.encode(mid(i) + body(i))
        assert await read(store, mid(i)) == body(i)
    assert not os.path.exists(tmp_path / "store" / "0.rdq.compact")
    check_accounting(store)
    assert store.stats()["bytes_on_disk"] == sum(files.values())
    # every other message still readable
    for i in range(8, 40):
        assert await read(store, mid(i)) == body(i)
    # the compacted file becomes empty: deleted
    for i in (1, 6, 7):
        store.remove(mid(i))
    await settle(store, writer)
    assert 0 not in rdq_files(tmp_path / "store")


def _fill(store, n):
    for i in range(n):
        store.write(mid(i), body(i))


async def test_read_queued_before_compaction_runs_after_it(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    _fill(store, 16)
    await settle(store, writer)
    gate = threading.Event()
    writer.read(lambda: gate.wait(5), lambda _r: None)  # park the reader thread
    loop = asyncio.get_running_loop()
    futs = {}
    for i in (3, 7):
        futs[i] = loop.create_future()
        store.read(mid(i), futs[i].set_result)
    for i in (0, 1, 2, 4, 5):  # 3 of 8 left: compacted
        store.remove(mid(i))
    await settle(store, writer)  # compaction done while the reads wait
    assert rdq_files(tmp_path / "store")[0] == 3 * size
    gate.set()
    assert await futs[3] == body(3) and await futs[7] == body(7)


async def test_read_while_writer_is_busy_reads_old_file(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    _fill(store, 16)
    await settle(store, writer)
    gate = threading.Event()
    writer.run(lambda: gate.wait(5))  # park the writer thread: compaction queued behind
    for i in (0, 1, 2, 4, 5):  # 3 of 8 left: compacted
        store.remove(mid(i))
    assert store._files[0].compacting
    assert await read(store, mid(3)) == body(3)  # reader thread is free: old layout
    gate.set()
    await settle(store, writer)
    assert rdq_files(tmp_path / "store")[0] == 3 * size
    assert await read(store, mid(3)) == body(3) and await read(store, mid(7)) == body(7)


async def test_read_opened_before_rename_preads_after_it(tmp_path, writer):
    """The reader has resolved the offset and opened the file; compaction then
    renames the new file over it; the pread still reads the old inode."""
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    _fill(store, 16)
    await settle(store, writer)
    opened, gate = threading.Event(), threading.Event()

    class GatedLock:
        def __init__(self, real):
            self.real = real
            self.parked = False

        def __enter__(self):
            self.real.acquire()

        def __exit__(self, *exc):
            self.real.release()
            if threading.current_thread().name == "hutch-reader" and not self.parked:
                self.parked = True
                opened.set()
                gate.wait(5)

    store._lock = GatedLock(store._lock)
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    store.read(mid(7), fut.set_result)
    assert await asyncio.to_thread(opened.wait, 5)
    old_offset = store._index[mid(7)].offset
    for i in (0, 1, 2, 4, 5):  # 3 of 8 left: compacted
        store.remove(mid(i))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store")[0] == 3 * size
    assert store._index[mid(7)].offset == 2 * size != old_offset
    gate.set()
    assert await fut == body(7)


async def test_remove_during_compaction(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    _fill(store, 24)
    await settle(store, writer)
    gate = threading.Event()
    writer.run(lambda: gate.wait(5))
    for i in (0, 1, 2, 3, 4):  # file 0 compaction scheduled with 5, 6, 7 live
        store.remove(mid(i))
    for i in (8, 9, 10, 11, 12):  # file 1 compaction scheduled with 13, 14, 15 live
        store.remove(mid(i))
    store.remove(mid(5))  # removed while file 0 is being compacted
    for i in (13, 14, 15):  # file 1: everything gone during its compaction
        store.remove(mid(i))
    check_accounting(store)
    gate.set()
    await settle(store, writer)
    files = rdq_files(tmp_path / "store")
    assert 1 not in files  # emptied during compaction: deleted after
    # file 0: 5 was copied (snapshot), counted dead; 2 of 3 live is not under half
    assert files[0] == 3 * size
    assert store._files[0].live == 2 * size
    assert [store._index[mid(i)].offset for i in (6, 7)] == [size, 2 * size]
    assert await read(store, mid(6)) == body(6) and await read(store, mid(7)) == body(7)
    assert isinstance(await read(store, mid(5)), StoreError)
    check_accounting(store)
    store.remove(mid(6))  # 1 of 3: compacted again
    await settle(store, writer)
    assert rdq_files(tmp_path / "store")[0] == size
    assert await read(store, mid(7)) == body(7)
    assert store.stats()["compactions"] == 3


async def test_reads_hammering_compactions(tmp_path, writer):
    """Real threads, no gates: many reads in flight while files get compacted."""
    size = REC + 100
    store = new_store(tmp_path, writer, limit=10 * size)
    rng = random.Random(5)
    live = set(range(300))
    _fill(store, 300)
    await settle(store, writer)
    loop = asyncio.get_running_loop()
    for _round in range(6):
        futs = []
        for i in rng.sample(sorted(live), min(60, len(live))):
            fut = loop.create_future()
            store.read(mid(i), fut.set_result)
            futs.append((i, fut))
        for i in rng.sample(sorted(live), len(live) // 4):
            live.discard(i)
            store.remove(mid(i))
        for i, fut in futs:
            result = await fut
            assert result == body(i) or (i not in live and isinstance(result, StoreError))
    await settle(store, writer)
    assert store.stats()["compactions"] > 0
    for i in live:
        assert await read(store, mid(i)) == body(i)
    check_accounting(store)


async def test_current_file_all_dead_is_retired(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=8 * size)
    _fill(store, 4)
    await settle(store, writer)
    for i in range(4):
        store.remove(mid(i))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {}
    store.write(mid(50), body(50))
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {1: size}
    store.remove(mid(50))  # small current file all dead: kept (no churn)
    await settle(store, writer)
    assert rdq_files(tmp_path / "store") == {1: size}


# -- recovery --------------------------------------------------------------------

async def test_recover_after_restart(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=4 * size)
    _fill(store, 14)
    store.write(mid(3), body(3))
    for i in (1, 2):
        store.remove(mid(i))
    await settle(store, writer)
    refs = {mid(i): store.refcount(mid(i)) for i in range(14) if store.contains(mid(i))}
    before = store.stats()

    again = new_store(tmp_path, writer, limit=4 * size, wipe=False)
    report = again.recover(refs)
    await settle(again, writer)
    assert report.files_scanned == 4 and report.missing == set()
    assert report.corrupt_regions == 0 and report.truncated_bytes == 0
    assert report.records == 14 and report.garbage_records == 2
    for i in range(14):
        assert again.refcount(mid(i)) == refs.get(mid(i), 0)
        if i not in (1, 2):
            assert await read(again, mid(i)) == body(i)
    after = again.stats()
    assert after["messages"] == before["messages"] == 12
    assert after["live_bytes"] == before["live_bytes"]
    # appends continue in the last file (it has room) and then roll
    again.write(mid(20), body(20))
    again.write(mid(21), body(21))
    again.write(mid(22), body(22))
    await settle(again, writer)
    assert [again._index[mid(i)].file.num for i in (20, 21, 22)] == [3, 3, 4]
    check_accounting(again)


async def test_recover_torn_tail(tmp_path, writer, caplog):
    store = new_store(tmp_path, writer)
    _fill(store, 5)
    await settle(store, writer)
    path = tmp_path / "store" / "0.rdq"
    whole = path.stat().st_size
    torn = record.encode(mid(5) + body(5))[:-30]
    with open(path, "ab") as f:
        f.write(torn)
    refs = {mid(i): 1 for i in range(6)}
    again = new_store(tmp_path, writer, wipe=False)
    with caplog.at_level(logging.ERROR, logger="hutch.storage"):
        report = again.recover(refs)
    assert report.truncated_bytes == len(torn)
    assert report.missing == {mid(5)}
    assert "torn tail" in caplog.text and "missing" in caplog.text
    assert path.stat().st_size == whole
    for i in range(5):
        assert await read(again, mid(i)) == body(i)
    again.write(mid(6), body(6))  # appending after the cut is clean
    await settle(again, writer)
    third = new_store(tmp_path, writer, wipe=False)
    report = third.recover({mid(i): 1 for i in (0, 1, 2, 3, 4, 6)})
    assert report.truncated_bytes == 0 and report.missing == set() and report.records == 6
    assert await read(third, mid(6)) == body(6)


async def test_recover_corrupt_middle_record(tmp_path, writer, caplog):
    size = REC + 100
    store = new_store(tmp_path, writer)
    _fill(store, 5)
    await settle(store, writer)
    path = tmp_path / "store" / "0.rdq"
    data = bytearray(path.read_bytes())
    data[2 * size + 40] ^= 0x55  # payload of message 2
    path.write_bytes(bytes(data))
    # the running store detects it on read
    with caplog.at_level(logging.ERROR, logger="hutch.storage"):
        assert isinstance(await read(store, mid(2)), StoreError)
    assert "corrupt" in caplog.text
    caplog.clear()
    again = new_store(tmp_path, writer, wipe=False)
    with caplog.at_level(logging.ERROR, logger="hutch.storage"):
        report = again.recover({mid(i): 1 for i in range(5)})
    assert report.corrupt_regions == 1 and report.missing == {mid(2)}
    assert report.records == 4 and report.truncated_bytes == 0
    assert "corrupt record" in caplog.text
    for i in (0, 1, 3, 4):
        assert await read(again, mid(i)) == body(i)
    assert isinstance(await read(again, mid(2)), StoreError)
    check_accounting(again)
    assert again._files[0].total == 5 * size  # corrupt region counted as dead bytes


async def test_recover_reports_missing_and_reclaims_garbage(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=4 * size)
    _fill(store, 16)  # files 0..3, 4 records each
    await settle(store, writer)
    (tmp_path / "store" / "0.rdq.compact").write_bytes(b"half a compaction")
    keep = {mid(1): 2, mid(5): 1, mid(6): 1, mid(7): 1, mid(12): 1}
    refs = {**keep, mid(99): 1, mid(98): 0}  # 99 never written; 0 = no reference
    again = new_store(tmp_path, writer, limit=4 * size, wipe=False)
    report = again.recover(refs)
    assert report.missing == {mid(99)}
    assert report.garbage_records == 11 and report.records == 16
    assert report.files_deleted == 1  # file 2: nothing referenced
    await settle(again, writer)
    files = rdq_files(tmp_path / "store")
    # file 0 (1 of 4 live) compacted, 1 (3 of 4) kept, 2 deleted,
    # 3 (1 of 4) compacted: the last file, but full, so not kept as the current one
    assert files == {0: size, 1: 4 * size, 3: size}
    assert not os.path.exists(tmp_path / "store" / "0.rdq.compact")
    assert again.refcount(mid(1)) == 2
    for i in keep:
        assert await read(again, i) == body(int.from_bytes(i, "big"))
    check_accounting(again)
    again.write(mid(40), body(40))  # new writes go to a new file
    await settle(again, writer)
    assert again._index[mid(40)].file.num == 4


async def test_recover_duplicate_ids_keep_first(tmp_path, writer):
    directory = tmp_path / "store"
    directory.mkdir()
    (directory / "0.rdq").write_bytes(record.encode(mid(1) + b"first") + record.encode(mid(2) + b"x"))
    (directory / "1.rdq").write_bytes(record.encode(mid(1) + b"first"))
    store = MessageStore(str(directory), writer)
    report = store.recover({mid(1): 1, mid(2): 1})
    assert report.duplicates == 1
    assert store._index[mid(1)].file.num == 0
    await settle(store, writer)
    assert rdq_files(directory) == {0: 2 * REC + 6}  # file 1: only the duplicate, deleted
    assert await read(store, mid(1)) == b"first"


async def test_wipe(tmp_path, writer):
    store = new_store(tmp_path, writer, limit=2 * (REC + 100))
    _fill(store, 5)
    await settle(store, writer)
    again = new_store(tmp_path, writer)  # wipes
    assert os.listdir(tmp_path / "store") == []
    assert again.stats()["messages"] == 0
    again.write(mid(1), b"x")
    await settle(again, writer)
    assert rdq_files(tmp_path / "store") == {0: REC + 1}


async def test_use_before_recover_is_an_error(tmp_path, writer):
    store = MessageStore(str(tmp_path / "s"), writer)
    with pytest.raises(RuntimeError):
        store.write(mid(1), b"x")


async def test_disk_reclaim(tmp_path, writer):
    limit = 1024 * 1024
    store = new_store(tmp_path, writer, limit=limit)
    payload = os.urandom(100 * 1024)
    for i in range(200):  # ~20 MB over ~20 files
        store.write(mid(i), payload)
    await settle(store, writer)
    assert len(rdq_files(tmp_path / "store")) >= 19
    order = list(range(200))
    random.Random(1).shuffle(order)
    for i in order:
        store.remove(mid(i))
    await settle(store, writer)
    files = rdq_files(tmp_path / "store")
    assert len(os.listdir(tmp_path / "store")) <= 1
    assert sum(files.values()) < limit
    assert store.stats()["live_bytes"] == 0 and store.stats()["messages"] == 0


# -- model-based -----------------------------------------------------------------

IDS = st.integers(0, 29).map(lambda i: bytes([i + 1]) * 16)
LIMIT = 300


class StoreMachine(RuleBasedStateMachine):
    """write / remove / read / restart against a dict model; a small file
    limit so rolls, compactions and deletions happen all the time."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="msgstore-")
        self.loop = asyncio.new_event_loop()
        self.writer = GroupCommitWriter(self.loop, "flush")
        self.store = MessageStore(self.dir, self.writer, LIMIT)
        self.store.wipe()
        self.model: dict[bytes, list] = {}  # id -> [payload, refs]
        self.payloads: dict[bytes, bytes] = {}
        self.issued = 0
        self.confirmed = 0

    def _confirm(self) -> None:
        self.confirmed += 1

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def _settle(self) -> None:
        self._run(settle(self.store, self.writer))
        assert self.confirmed == self.issued

    @rule(msg_id=IDS, payload=st.one_of(st.binary(max_size=60), st.binary(min_size=300, max_size=400)))
    def write(self, msg_id, payload):
        # an id names one message for ever (ids are random per message in the
        # broker; one can be written again after removal, e.g. paged out again)
        payload = self.payloads.setdefault(msg_id, payload)
        if msg_id in self.model:
            self.model[msg_id][1] += 1
        else:
            self.model[msg_id] = [payload, 1]
        self.issued += 1
        self.store.write(msg_id, payload, self._confirm)

    @rule(msg_ids=st.lists(IDS, min_size=2, max_size=8), size=st.integers(0, 60))
    def write_many(self, msg_ids, size):
        for msg_id in msg_ids:
            self.write(msg_id, bytes([msg_id[0]]) * size)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        msg_id = data.draw(st.sampled_from(sorted(self.model)))
        self.store.remove(msg_id)
        self.model[msg_id][1] -= 1
        if not self.model[msg_id][1]:
            del self.model[msg_id]

    @rule(msg_id=IDS)
    def read(self, msg_id):
        result = self._run(read(self.store, msg_id))
        if msg_id in self.model:
            assert result == self.model[msg_id][0]
        else:
            assert isinstance(result, StoreError)

    @rule()
    def settle_and_check_disk(self):
        self._settle()
        on_disk = rdq_files(self.dir)
        assert on_disk == {n: f.total for n, f in self.store._files.items()}
        assert not any(name.endswith(".compact") for name in os.listdir(self.dir))
        # a file that is not current is never left under half live
        for f in self.store._files.values():
            if f is not self.store._cur:
                assert f.live * 2 >= f.total > 0

    @rule(torn=st.booleans())
    def restart(self, torn):
        self._settle()
        self.store.close()
        self.writer.stop()
        self._run(asyncio.sleep(0))
        files = rdq_files(self.dir)
        garbage = b"\x00\x00\x01\x00" + b"torn" * 5
        if torn and files:
            with open(os.path.join(self.dir, "%d.rdq" % max(files)), "ab") as f:
                f.write(garbage)
        self.writer = GroupCommitWriter(self.loop, "flush")
        self.store = MessageStore(self.dir, self.writer, LIMIT)
        report = self.store.recover({i: refs for i, (_p, refs) in self.model.items()})
        assert report.missing == set()
        assert report.corrupt_regions == 0
        assert report.truncated_bytes == (len(garbage) if torn and files else 0)

    @invariant()
    def index_matches_model(self):
        for i in range(30):
            msg_id = bytes([i + 1]) * 16
            assert self.store.refcount(msg_id) == (self.model[msg_id][1] if msg_id in self.model else 0)
        check_accounting(self.store)

    def teardown(self):
        try:
            self._settle()
            for msg_id, (payload, _refs) in self.model.items():
                assert self._run(read(self.store, msg_id)) == payload
        finally:
            self.store.close()
            self.writer.stop()
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestStoreMachine = StoreMachine.TestCase


# -- recovery summaries (clean stop and start) --------------------------------------

REFERRER = "0123456789abcdef0123456789abcdef"


async def test_a_summary_gives_what_the_scan_gives(tmp_path, writer):
    size = REC + 100
    store = new_store(tmp_path, writer, limit=4 * size)
    _fill(store, 14)
    store.write(mid(3), body(3))  # two references
    for i in (1, 2, 9):
        store.remove(mid(i))
    await settle(store, writer)
    refs = {mid(i): store.refcount(mid(i)) for i in range(14) if store.contains(mid(i))}
    writer.stop()
    store.write_summary([REFERRER])
    shutil.copytree(tmp_path / "store", tmp_path / "copy")
    os.unlink(tmp_path / "copy" / "recovery.summary")

    loop = asyncio.get_running_loop()
    fast_writer, scan_writer = GroupCommitWriter(loop), GroupCommitWriter(loop)
    try:
        fast = MessageStore(str(tmp_path / "store"), fast_writer, file_size_limit=4 * size)
        assert fast.recover_summary({REFERRER}) is not None
        assert not os.path.exists(tmp_path / "store" / "recovery.summary")  # used once
        scanned = MessageStore(str(tmp_path / "copy"), scan_writer, file_size_limit=4 * size)
        scanned.recover(refs)
        await settle(fast, fast_writer)
        await settle(scanned, scan_writer)
        assert fast.stats() == scanned.stats()
        for i in range(14):
            assert fast.refcount(mid(i)) == scanned.refcount(mid(i)) == refs.get(mid(i), 0)
            if mid(i) in refs:
                assert await read(fast, mid(i)) == body(i)
        fast.write(mid(20), body(20))  # appends continue where the scan would continue them
        scanned.write(mid(20), body(20))
        assert fast._index[mid(20)].file.num == scanned._index[mid(20)].file.num
        await settle(fast, fast_writer)
        check_accounting(fast)
    finally:
        fast_writer.stop()
        scan_writer.stop()


@pytest.mark.parametrize("change", ["referrers", "touch", "extra file"])
async def test_a_summary_that_does_not_match_is_refused(tmp_path, writer, change, caplog):
    store = new_store(tmp_path, writer, limit=4 * (REC + 100))
    _fill(store, 6)
    await settle(store, writer)
    writer.stop()
    store.write_summary([REFERRER])
    referrers = {REFERRER}
    if change == "referrers":
        referrers = {REFERRER, "f" * 32}
    elif change == "touch":
        path = tmp_path / "store" / "0.rdq"
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1))
    else:
        (tmp_path / "store" / "7.rdq").write_bytes(b"")
    again_writer = GroupCommitWriter(asyncio.get_running_loop())
    try:
        again = MessageStore(str(tmp_path / "store"), again_writer, file_size_limit=4 * (REC + 100))
        with caplog.at_level(logging.INFO, "hutch.storage"):
            assert again.recover_summary(referrers) is None
        assert "recovery summary not used" in caplog.text
        assert not os.path.exists(tmp_path / "store" / "recovery.summary")
        assert again.stats()["messages"] == 0  # nothing half loaded
    finally:
        again_writer.stop()
