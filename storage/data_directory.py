"""The broker's data directory as one start found it.

A start either finds an earlier run's directory (recover it: from the
summaries after a clean stop, else by checking every file), or begins a new
one: the directory did not exist (this start creates it, with any missing
parents) or exists and is empty (a freshly mounted volume). A new directory
has nothing to recover, so its first start says so instead of reporting a
missing clean-shutdown marker.

Invariant: `remove_created` deletes only what this start made. A start that
fails (a port in use) leaves the file system as it found it: no directory it
created, an empty directory empty again, and never anything of an earlier run.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

# Written by a clean stop, removed at the next start: its presence says the
# recovery summaries describe the files (docs/storage.md).
CLEAN_SHUTDOWN = "clean_shutdown"


@dataclass(frozen=True)
class DataDirectory:
    path: str
    created: str | None  # the outermost directory this start made; None: the path existed
    new: bool  # nothing from an earlier run: created now, or found empty

    @classmethod
    def open(cls, path: str) -> "DataDirectory":
        """Finds or creates `path` (OSError when it cannot be made)."""
        outermost = None
        probe = os.path.abspath(path)
        while not os.path.lexists(probe):
            outermost = probe
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
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
