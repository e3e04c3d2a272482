"""The storage's file operations besides appends, and the one hook that sees
every change to a data file.

A cluster's leader replicates its data directory by watching what its
storage does to files (docs/cluster.md): `hook.file_changed(kind, path,
offset, data)` is told of every append (by `writer.AppendFile`, on the
writer thread, after the bytes are written; not for a file that no restart
keeps, such as the transient store: `AppendFile.kept` False), and of every other operation
made through the functions here. A new kind of file is therefore replicated
without code of its own as long as it is appended through the writer and
created, replaced, renamed and deleted through this module.

`hook` is None on a node that is not a cluster's leader: then these are the
plain `os` calls and the appends pay one attribute test per write.

Kinds, and what `data` holds: APPEND (the bytes written at `offset`), WRITE
(the whole new content; SQLite stores report their committed database this
way, see `wrote`), CREATE (nothing; an empty file if absent), REMOVE (a file
or a directory tree), RENAME (`data` is the new path, UTF-8).
"""
from __future__ import annotations

import os
import shutil

APPEND, WRITE, CREATE, REMOVE, RENAME = 1, 2, 3, 4, 5

# Set by the cluster's leader (amqp_server.cluster.replication); see above.
hook = None


def create(path: str) -> None:
    """An empty file at `path` unless one is there (parents made)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    if hook is not None:
        hook.file_changed(CREATE, path, 0, b"")


def remove(path: str) -> None:
    os.unlink(path)
    if hook is not None:
        hook.file_changed(REMOVE, path, 0, b"")


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if hook is not None:
        hook.file_changed(REMOVE, path, 0, b"")


def removed(path: str) -> None:
    """Tell the hook that `path` (a file or a directory tree) is gone, for a
    caller that removed it itself."""
    if hook is not None:
        hook.file_changed(REMOVE, path, 0, b"")


def rename(source: str, target: str) -> None:
    os.rename(source, target)
    if hook is not None:
        hook.file_changed(RENAME, source, 0, target.encode())


def replace(source: str, target: str) -> None:
    """os.replace; the hook sees the whole new content of `target`."""
    os.replace(source, target)
    if hook is not None:
        with open(target, "rb") as f:
            hook.file_changed(WRITE, target, 0, f.read())


def wrote(path: str, content) -> None:
    """A store that rewrites a file in place (SQLite) reports its whole
    committed content; `content` is called only when someone listens."""
    if hook is not None:
        hook.file_changed(WRITE, path, 0, content())
