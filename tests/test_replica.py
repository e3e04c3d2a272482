"""storage.replica: a follower's directory made equal to the leader's from
the differences, then kept equal by applying records (no network)."""
from __future__ import annotations

import os

import pytest

from storage import files, replica
from storage.replica import HEAD


def write(root, relative: str, data: bytes) -> None:
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def apply_all(applier: replica.Applier, stream) -> None:
    for record in stream:
        size, kind = HEAD.unpack_from(record)
        applier.apply(kind, memoryview(record)[HEAD.size:HEAD.size + size])
    applier.sync()


def test_differences_make_the_copy_equal_sending_only_missing_tails(tmp_path):
    leader, follower = str(tmp_path / "leader"), str(tmp_path / "follower")
    write(leader, "vhosts/a/msg_store/0.rdq", b"x" * 5000)        # follower has a prefix: tail only
    write(follower, "vhosts/a/msg_store/0.rdq", b"x" * 3000)
    write(leader, "vhosts/a/queues/q/0.idx", b"leader")           # differs: whole
    write(follower, "vhosts/a/queues/q/0.idx", b"follower!")
    write(follower, "vhosts/a/queues/old/0.idx", b"gone")         # not on the leader: removed
    write(leader, "dead/1.dlog", b"")                              # empty file: created
    write(leader, "definitions.db", b"sqlite")                     # databases are not compared as files
    write(follower, "clean_shutdown", b"local")
    records = list(replica.differences(leader, replica.sizes(leader), replica.listing(follower)))
    tail = [r for r in records if b"0.rdq" in r]
    assert len(tail) == 1 and len(tail[0]) < 2100  # 2000 missing bytes, not 5000
    apply_all(replica.Applier(follower), records)
    assert replica.listing(follower) == replica.listing(leader)
    assert os.path.exists(os.path.join(follower, "clean_shutdown"))
    assert not os.path.exists(os.path.join(follower, "definitions.db"))


def test_records_replay_appends_writes_renames_and_removes(tmp_path):
    root = str(tmp_path / "copy")
    applier = replica.Applier(root)
    apply_all(applier, [
        replica.file_record(files.APPEND, "a/1", 0, b"abc"),
        replica.file_record(files.APPEND, "a/1", 3, b"def"),
        replica.file_record(files.CREATE, "a/2", 0, b""),
        replica.file_record(files.WRITE, "b.db", 0, b"whole"),
        replica.file_record(files.RENAME, "a", 0, b"c"),
        replica.file_record(files.APPEND, "c/1", 6, b"g"),
    ])
    with open(os.path.join(root, "c/1"), "rb") as f:
        assert f.read() == b"abcdefg"
    assert os.path.getsize(os.path.join(root, "c/2")) == 0
    apply_all(applier, [replica.file_record(files.REMOVE, "c", 0, b"")])
    assert sorted(os.listdir(root)) == ["b.db"]


def test_an_unconfirmed_tail_is_cut_and_a_gap_refused(tmp_path):
    root = str(tmp_path)
    write(root, "f", b"12345")
    applier = replica.Applier(root)
    apply_all(applier, [replica.file_record(files.APPEND, "f", 3, b"x")])
    with open(os.path.join(root, "f"), "rb") as f:
        assert f.read() == b"123x"
    with pytest.raises(ValueError, match="appends at 9"):
        apply_all(applier, [replica.file_record(files.APPEND, "f", 9, b"y")])


def test_a_record_cannot_leave_the_data_directory(tmp_path):
    with pytest.raises(ValueError, match="outside the data directory"):
        apply_all(replica.Applier(str(tmp_path)), [replica.file_record(files.APPEND, "../x", 0, b"y")])


def test_a_big_whole_file_goes_in_pieces_and_replaces_the_old_one_at_once(tmp_path):
    root = str(tmp_path)
    write(root, "definitions.db", b"old")
    write(root, "definitions.db-wal", b"stale log")
    content = os.urandom(replica.CHUNK * 2 + 10)
    records = replica.write_records("definitions.db", content)
    assert len(records) == 4 and all(len(r) < replica.CHUNK + 100 for r in records)
    apply_all(replica.Applier(root), records)
    with open(os.path.join(root, "definitions.db"), "rb") as f:
        assert f.read() == content
    assert sorted(os.listdir(root)) == ["definitions.db"]
    big = os.urandom(replica.CHUNK + 5)
    apply_all(replica.Applier(root), replica.append_records("store/0.rdq", 0, b"abc")
              + replica.append_records("store/0.rdq", 3, big))
    with open(os.path.join(root, "store/0.rdq"), "rb") as f:
        assert f.read() == b"abc" + big


def test_a_follower_stepping_back_moves_what_it_gives_up_aside(tmp_path):
    """With `aside`, the files a snapshot replaces or removes (a SQLite
    database with its write-ahead log) are moved there, not erased; the
    cluster's own files are never sent nor removed."""
    leader, follower, aside = str(tmp_path / "leader"), str(tmp_path / "follower"), str(tmp_path / "aside")
    write(leader, "vhosts/a/queues/q/0.idx", b"leader")
    write(follower, "vhosts/a/queues/q/0.idx", b"follower's newer")
    write(follower, "vhosts/a/queues/mine/0.idx", b"only here")
    write(follower, "definitions.db", b"follower's users")
    write(follower, "definitions.db-wal", b"and their last commit")
    write(follower, "cluster_state", b"{}")
    records = list(replica.differences(leader, replica.sizes(leader), replica.listing(follower)))
    records += replica.write_records("definitions.db", b"leader's users")
    apply_all(replica.Applier(follower, aside=aside), records)
    assert replica.listing(follower) == replica.listing(leader)
    assert os.path.exists(os.path.join(follower, "cluster_state"))
    with open(os.path.join(follower, "definitions.db"), "rb") as f:
        assert f.read() == b"leader's users"
    kept = {}
    for directory, _dirs, names in os.walk(aside):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                kept[os.path.relpath(os.path.join(directory, name), aside)] = f.read()
    assert kept == {"vhosts/a/queues/q/0.idx": b"follower's newer", "vhosts/a/queues/mine/0.idx": b"only here",
                    "definitions.db": b"follower's users", "definitions.db-wal": b"and their last commit"}
