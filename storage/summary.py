"""Recovery summaries: what a clean stop leaves so that the next start need
not scan (docs/storage.md, "Recovery").

At a clean stop, once the writer has finished every write, each durable
queue index and each persistent message store writes what a scan of its
files would compute (`QueueIndex.write_summary`, `MessageStore.write_summary`),
before the clean-shutdown marker. A summary is one `record.encode(body)`
record in one file, written atomically (temp file, fsync, rename, fsync of
the directory), so it is either whole or absent.

Invariants:
- a summary is used at most once: `take` removes it as it reads it, so a
  crash after the start that loaded it always leads to a scan (the marker is
  gone too);
- it is trusted only while the files it describes are those it saw: it
  records each file's `stamp` (size, modification time, inode) and the
  loader compares them with the real files (a stat each, no reading), and
  the set of files, falling back to the scan on any difference.
"""
from __future__ import annotations

import os
import struct

from storage import record

NAME = "recovery.summary"
STAMP = struct.Struct(">QQQ")  # size, mtime_ns, inode


def stamp(path: str, size: int | None = None) -> bytes:
    """The identity of a file as a summary records it. With `size` (what
    its writer believes it holds), OSError when the file does not hold that."""
    st = os.stat(path)
    if size is not None and st.st_size != size:
        raise OSError("%s: %d bytes on disk, %d written" % (path, st.st_size, size))
    return STAMP.pack(st.st_size, st.st_mtime_ns, st.st_ino)


def stamp_size(value: bytes) -> int:
    return STAMP.unpack(value)[0]


def write(directory: str, body: bytes) -> None:
    """DIRECTORY/NAME holds `body` once this returns (blocking)."""
    path = os.path.join(directory, NAME)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(record.encode(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def take(directory: str) -> tuple[bytes | None, str]:
    """Read and remove DIRECTORY/NAME: (its body, "") or (None, why not)."""
    path = os.path.join(directory, NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, "no summary"
    discard(directory)
    records, report = record.scan(data, path)
    if len(records) != 1 or report.damaged:
        return None, "the summary is damaged"
    return records[0][1], ""


def discard(directory: str) -> None:
    """Remove DIRECTORY/NAME (and a temp file left by a stop cut short)."""
    for name in (NAME, NAME + ".tmp"):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def is_summary(name: str) -> bool:
    return name == NAME or name == NAME + ".tmp"
