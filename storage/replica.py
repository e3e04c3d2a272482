"""A data directory's changes as records, and a follower's copy kept from them.

The leader turns each file change its storage reports (`storage.files`) into
one *operation record*; a follower applies the records in order to its own
directory (`Applier`), which then holds the same bytes. Paths are relative
to the data directory.

Record: u32 length of what follows the 5-byte head, u8 kind, then for the
file kinds (storage.files.APPEND ... RENAME) u64 offset, u16 path length,
the path (UTF-8) and the data. Other kinds (>= 16) carry the replication
protocol's own messages (amqp_server.cluster.replication) as JSON.

A follower's first contact compares its files with the leader's
(`listing`: size and SHA-1 per file); the leader then sends what differs
(`differences`): a file the follower holds a prefix of gets only the
missing tail, any other different file its whole content, and files the
leader does not have are removed. SQLite databases are never compared on
disk (their WAL makes the bytes differ while the content is the same): the
leader sends their committed content whole, at the start and after every
commit (storage.files.wrote).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import struct

from storage.data_directory import LOCK
from storage.files import APPEND, CREATE, REMOVE, RENAME, WRITE

HEAD = struct.Struct(">IB")
FILE_OP = struct.Struct(">QH")
CHUNK = 1024 * 1024
MAX_OPEN = 256  # files an Applier keeps open
PART = ".part"  # a whole file being sent in pieces (write_records)
# Never compared nor sent as files: the clean-stop marker (only the node that
# stopped cleanly may trust it; a promoted follower must recover as after a
# crash, every message redelivered) and SQLite's files (sent as content).
_SQLITE = (".db", ".db-wal", ".db-shm", ".db-journal")
# The cluster's own files (amqp_server.cluster.state) say what this node
# holds, `force_boot` is an operator's word to this node only, and each
# node locks its own lock file (storage.data_directory).
_LOCAL = ("clean_shutdown", "cluster_state", "cluster_position", "force_boot", LOCK)
# A node of several shards keeps shard K's directory in DATA_DIR/shards/K: each is
# its own replication group's (docs/scaling.md), never part of shard 0's stream,
# which holds DATA_DIR itself (a snapshot of it must neither send nor remove them).
SHARDS = "shards"


def file_record(kind: int, path: str, offset: int, data: bytes) -> bytes:
    name = path.encode()
    return b"".join((HEAD.pack(FILE_OP.size + len(name) + len(data), kind), FILE_OP.pack(offset, len(name)),
                     name, data))


def write_records(relative: str, data: bytes) -> list[bytes]:
    """A whole file's new content as records of at most CHUNK bytes: one
    WRITE when it fits, else WRITE and APPENDs to `relative`.part and a
    RENAME over `relative`, so a follower replaces the file at once either
    way and no record outgrows what a follower accepts."""
    if len(data) <= CHUNK:
        return [file_record(WRITE, relative, 0, data)]
    part = relative + PART
    view = memoryview(data)
    out = [file_record(WRITE, part, 0, bytes(view[:CHUNK]))]
    out += [file_record(APPEND, part, at, bytes(view[at:at + CHUNK])) for at in range(CHUNK, len(data), CHUNK)]
    out.append(file_record(RENAME, part, 0, relative.encode()))
    return out


def append_records(relative: str, offset: int, data: bytes) -> list[bytes]:
    """An append as records of at most CHUNK bytes each."""
    if len(data) <= CHUNK:
        return [file_record(APPEND, relative, offset, data)]
    view = memoryview(data)
    return [file_record(APPEND, relative, offset + at, bytes(view[at:at + CHUNK])) for at in range(0, len(data), CHUNK)]


def parse_file_record(payload: memoryview) -> tuple[int, str, bytes]:
    """(offset, relative path, data) of a file record's payload."""
    offset, size = FILE_OP.unpack_from(payload)
    start = FILE_OP.size
    path = bytes(payload[start:start + size]).decode()
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or parts[0] == SHARDS:
        raise ValueError("record path outside the data directory: %r" % path)
    return offset, path, bytes(payload[start + size:])


def replicated(name: str) -> bool:
    return name not in _LOCAL and not name.endswith(_SQLITE) and not name.endswith((".tmp", PART))


def _walk(root: str):
    for directory, dirs, names in os.walk(root):
        if directory == root and SHARDS in dirs:
            dirs.remove(SHARDS)  # the other shards' groups'
        for name in names:
            if replicated(name):
                path = os.path.join(directory, name)
                yield os.path.relpath(path, root), path


def sha1_of(path: str, size: int | None = None) -> str:
    """SHA-1 of the first `size` bytes (all when None)."""
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        left = size
        while left is None or left > 0:
            block = f.read(CHUNK if left is None else min(CHUNK, left))
            if not block:
                break
            digest.update(block)
            if left is not None:
                left -= len(block)
    return digest.hexdigest()


def listing(root: str) -> dict[str, tuple[int, str]]:
    """relative path -> (size, SHA-1) of every replicated file (blocking)."""
    found = {}
    for relative, path in _walk(root):
        try:
            found[relative] = (os.path.getsize(path), sha1_of(path))
        except FileNotFoundError:
            pass
    return found


def sizes(root: str) -> dict[str, int]:
    """relative path -> size, the leader's side of a snapshot (blocking)."""
    found = {}
    for relative, path in _walk(root):
        try:
            found[relative] = os.path.getsize(path)
        except FileNotFoundError:
            pass
    return found


def differences(root: str, leader: dict[str, int], follower: dict[str, tuple[int, str]]):
    """Yield the records that make a follower with `follower` (its listing)
    hold the leader's files as they were at `leader` (sizes): reads the files
    (blocking). A file deleted or replaced since the sizes were taken is
    sent as it is now; the records after the snapshot repair that."""
    for relative, theirs in follower.items():
        if relative not in leader:
            yield file_record(REMOVE, relative, 0, b"")
    for relative, size in leader.items():
        path = os.path.join(root, relative)
        theirs = follower.get(relative)
        start = 0
        try:
            if theirs is not None and theirs[0] <= size and sha1_of(path, theirs[0]) == theirs[1]:
                start = theirs[0]
                if start == size:
                    continue  # the same file
            with open(path, "rb") as f:
                f.seek(start)
                left = size - start
                kind = APPEND if start else WRITE
                if not left:
                    yield file_record(WRITE, relative, 0, b"")
                while left > 0:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        break
                    yield file_record(kind, relative, start, block)
                    kind = APPEND
                    start += len(block)
                    left -= len(block)
        except FileNotFoundError:
            yield file_record(REMOVE, relative, 0, b"")


def _whole_database(path: str) -> None:
    """A SQLite database was just replaced whole: its old WAL must not be replayed over it."""
    if path.endswith(".db"):
        for suffix in ("-wal", "-shm"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass


class Applier:
    """A follower's side: applies records to `root` (blocking calls, on one
    thread); `sync()` makes what was applied durable. With `aside` (a
    directory), a file that a record would remove or replace is moved there
    first instead (a follower stepping back keeps what it had)."""

    def __init__(self, root: str, fsync: bool = True, aside: str | None = None) -> None:
        self.root = root
        self.fsync = fsync
        self.aside = aside
        self._open: dict[str, int] = {}
        self._touched: set[str] = set()

    def _set_aside(self, relative: str) -> None:
        if self.aside is None:
            return
        # a SQLite database goes with its write-ahead log
        for name in (relative, relative + "-wal", relative + "-shm") if relative.endswith(".db") else (relative,):
            path = os.path.join(self.root, name)
            if not os.path.lexists(path):
                continue
            target = os.path.join(self.aside, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.rename(path, target)
            except OSError:  # another file system: copy, then let the record go on
                (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, target)

    def _fd(self, relative: str) -> int:
        fd = self._open.get(relative)
        if fd is None:
            if len(self._open) >= MAX_OPEN:
                self.sync()
                self.close()
            path = os.path.join(self.root, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            self._open[relative] = fd
        return fd

    def _close(self, relative: str) -> None:
        fd = self._open.pop(relative, None)
        self._touched.discard(relative)
        if fd is not None:
            os.close(fd)

    def _close_under(self, relative: str) -> None:
        prefix = relative.rstrip("/") + "/"
        for name in [n for n in self._open if n == relative or n.startswith(prefix)]:
            self._close(name)

    def apply(self, kind: int, payload: memoryview) -> None:
        offset, relative, data = parse_file_record(payload)
        path = os.path.join(self.root, relative)
        if kind == APPEND:
            fd = self._fd(relative)
            end = os.fstat(fd).st_size
            if end != offset:
                # Longer: bytes the leader never confirmed (a torn or
                # unreplicated tail): the leader's view wins. Shorter: a gap
                # means this copy missed something; only a fresh sync helps.
                if end < offset:
                    raise ValueError("%s: %d bytes here, the leader appends at %d" % (relative, end, offset))
                os.ftruncate(fd, offset)
            os.pwrite(fd, data, offset)
            self._touched.add(relative)
        elif kind == WRITE:
            self._close(relative)
            self._set_aside(relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                if self.fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
            _whole_database(path)
        elif kind == CREATE:
            self._fd(relative)
        elif kind == REMOVE:
            self._close_under(relative)
            self._set_aside(relative)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        elif kind == RENAME:
            self._close_under(relative)
            target = data.decode()
            self._close_under(target)
            self._set_aside(target)
            try:
                os.rename(path, os.path.join(self.root, target))
            except FileNotFoundError:
                pass
            _whole_database(os.path.join(self.root, target))
        else:
            raise ValueError("unknown file record kind %d" % kind)

    def sync(self) -> None:
        if self.fsync:
            for relative in self._touched:
                os.fsync(self._open[relative])
        self._touched.clear()

    def close(self) -> None:
        for relative in list(self._open):
            self._close(relative)
