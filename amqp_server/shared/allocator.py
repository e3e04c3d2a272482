"""The process's memory habits: glibc's malloc tuned for message bodies (nothing
changes under another libc), and the cyclic garbage collector run rarely
(`collect_rarely`).

By default glibc serves a block of 128 KiB or more with a fresh mmap and unmaps
it on free (and shrinks the heap whenever 128 KiB are free at its top): each
1 MiB body or delivery the broker builds then costs ~256 page faults, one per
4 KiB page the copy touches. With 1 MiB messages that was three quarters of
the broker's CPU time, all of it in the kernel (docs/benchmarks.md, "The cost
of growth"). Blocks under MMAP_BELOW come from the heap instead, and up to
KEEP_FREE bytes of free heap are kept for the next ones.

Invariant: what is kept free never raises a memory alarm by itself. Before the
alarm check calls resident memory over the watermark, `give_back` returns the
free heap to the system (malloc_trim) and the check measures again.
"""
from __future__ import annotations

import ctypes
import gc

MMAP_BELOW = 32 * 1024 * 1024  # glibc's own ceiling for its adaptive threshold
KEEP_FREE = 64 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, <malloc.h>

try:
    _libc = ctypes.CDLL(None)
    _mallopt, _malloc_trim = _libc.mallopt, _libc.malloc_trim
except (OSError, AttributeError):  # musl, macOS: no mallopt; their allocators decide
    _mallopt = _malloc_trim = None


def reuse_large_blocks() -> None:
    """Set once at start, before the broker allocates its buffers."""
    if _mallopt is not None:
        _mallopt(_M_MMAP_THRESHOLD, MMAP_BELOW)
        _mallopt(_M_TRIM_THRESHOLD, KEEP_FREE)


def give_back() -> bool:
    """Return the free heap to the system; True when some was."""
    return _malloc_trim is not None and bool(_malloc_trim(0))


# Objects allocated before the cyclic garbage collector's youngest generation is scanned. Python's
# default (700) scans it about every hundred messages (a message costs a handful of tracked
# objects: the scanned item, Message, its queue entry, the unacked record), and every tenth scan
# an older generation with it; almost everything per message is freed by reference counting, so
# those scans find nothing. Cycles still get collected, just 100 times less often.
GC_YOUNG = 70_000


def collect_rarely() -> None:
    """Once started: what start-up made (definitions, recovered queues) is moved out of the
    collector's sight (`gc.freeze`, it lives as long as the broker), and the youngest generation
    is scanned every GC_YOUNG allocations instead of 700."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)
