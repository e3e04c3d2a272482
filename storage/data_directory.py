"""The broker's data directory as one start found it, and the node's lock on it.

A node's start claims its directory (`DataDirectory.claim`): it finds or makes
it and takes an exclusive flock on DATA_DIR/hutch.lock, waiting a few seconds
for a node that still holds it (the shards a SIGKILLed supervisor left, a stop
under way) and refusing after that; every shard the node forks inherits the
descriptor, never closed, so the lock lasts until the node's last process has
ended. Only under the lock does the start judge what it found: an earlier
run's directory (recovered from the summaries after a clean stop, else by
checking every file), or a new one, which has nothing to recover and says so:
the directory did not exist (the start created it, with any missing parents)
or held nothing but the lock file (a freshly mounted volume). Invariant:
`remove_created` deletes only what this start made. A start that fails (a port
in use, the directory in use) leaves the file system as it found it: no
directory it created, an empty directory empty again, and never anything of an
earlier run or of another node.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from dataclasses import dataclass

# Written by a clean stop, removed at the next start: its presence says the
# recovery summaries describe the files (docs/storage.md).
CLEAN_SHUTDOWN = "clean_shutdown"
# Locked (flock) by the node that runs on the directory; holds the pid of the process that took it.
LOCK = "hutch.lock"
# How long a start waits for the node holding the lock to end before it refuses.
LOCK_WAIT = 5.0

log = logging.getLogger("hutch.storage")


class Unclaimed(Exception):
    """The directory cannot be claimed: another node holds its lock, or it
    cannot be locked (the message says which directory and why)."""


@dataclass(frozen=True)
class DataDirectory:
    path: str
    created: str | None  # the outermost directory this start made; None: the path existed
    new: bool  # nothing from an earlier run: created now, or found empty
    # The descriptor holding the node's lock (`claim`); None when opened inside a node that holds it.
    lock: int | None = None

    @classmethod
    def claim(cls, path: str, wait: float = LOCK_WAIT) -> "DataDirectory":
        """The node's start: finds or creates `path` and locks it, waiting up
        to `wait` seconds for the node that holds it (Unclaimed then, or when
        it cannot be locked; OSError when it cannot be made)."""
        deadline = time.monotonic() + wait
        waiting = False
        while True:
            outermost = _outermost_missing(path)
            os.makedirs(path, exist_ok=True)
            try:
                lock = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise Unclaimed("cannot lock the data directory %s: %s" % (path, exc.strerror or exc)) from None
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(lock, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(lock)
                if time.monotonic() >= deadline:
                    raise Unclaimed("the data directory %s is in use by another hutch node (pid %s): one node "
                                    "runs on a data directory; stop that node first, or give this one another "
                                    "data_dir" % (path, holder)) from None
                if not waiting:
                    waiting = True
                    log.warning("the data directory %s is locked by another hutch node (pid %s): waiting up to "
                                "%.0f s for it to end", path, holder, wait)
                time.sleep(0.05)
                continue
            except OSError as exc:
                os.close(lock)
                raise Unclaimed("cannot lock the data directory %s: %s" % (path, exc.strerror or exc)) from None
            if not _names(lock, os.path.join(path, LOCK)):
                # A failed start removed the file (or its directory) once this one had opened it:
                # its lock guards nothing a later start would see. Lock the file there now.
                os.close(lock)
                continue
            os.ftruncate(lock, 0)
            os.pwrite(lock, b"%d\n" % os.getpid(), 0)
            new = not any(name != LOCK for name in os.listdir(path))
            return cls(path, outermost if new else None, new, lock)

    @classmethod
    def open(cls, path: str) -> "DataDirectory":
        """Finds or creates `path` inside a node that holds its data
        directory's lock (a shard's own directory, a restarted shard's, a
        cluster leader's broker); OSError when it cannot be made. The lock
        file counts as content here: the node's own directory is never new
        to a later open, so a failed one never removes the lock."""
        outermost = _outermost_missing(path)
        os.makedirs(path, exist_ok=True)
        return cls(path, outermost, outermost is not None or not os.listdir(path))

    def remove_created(self) -> None:
        """Undo what this start made (after a failed start): the directories
        it created, or what it put in a directory it found empty."""
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
        elif self.new:
            for entry in os.scandir(self.path):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.remove(entry.path)


def _outermost_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist (None: it exists)."""
    outermost = None
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        outermost = probe
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return outermost


def _names(descriptor: int, path: str) -> bool:
    """Whether `path` is still the file open as `descriptor`."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)
