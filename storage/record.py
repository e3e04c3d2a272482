"""Framing of every record hutch writes to disk.

    u32 length | body | u32 crc32(body) | u8 0xFF

A record is valid only when all of it is present, its crc matches and the
end marker is there; `scan` turns a file back into its valid records and
says exactly what it had to drop, so damage is never silent.
"""
from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import dataclass, field

_LENGTH = struct.Struct(">I")
_TRAILER = struct.Struct(">IB")
END_MARKER = 0xFF
OVERHEAD = _LENGTH.size + _TRAILER.size

log = logging.getLogger("hutch.storage")


def encode(body: bytes) -> bytes:
    return b"".join((_LENGTH.pack(len(body)), body, _TRAILER.pack(zlib.crc32(body), END_MARKER)))


@dataclass
class ScanReport:
    """What `scan` found wrong in one file."""

    path: str
    valid_end: int = 0  # offset after the last complete record
    truncated_bytes: int = 0  # a torn tail after valid_end
    corrupt_records: list[int] = field(default_factory=list)  # offsets where skipped regions start

    @property
    def damaged(self) -> bool:
        return bool(self.truncated_bytes or self.corrupt_records)

    def log(self) -> None:
        if self.corrupt_records:
            log.error("%s: skipped %d corrupt record(s) at offsets %s", self.path,
                      len(self.corrupt_records), self.corrupt_records[:10])
        if self.truncated_bytes:
            log.error("%s: torn tail of %d bytes after offset %d truncated", self.path,
                      self.truncated_bytes, self.valid_end)


def _valid_at(data: bytes, pos: int) -> int:
    """End offset of a valid record starting at `pos`, or -1."""
    if len(data) - pos < OVERHEAD:
        return -1
    (length,) = _LENGTH.unpack_from(data, pos)
    end = pos + _LENGTH.size + length + _TRAILER.size
    if end > len(data):
        return -1
    crc, marker = _TRAILER.unpack_from(data, end - _TRAILER.size)
    if marker != END_MARKER or crc != zlib.crc32(data[pos + _LENGTH.size:end - _TRAILER.size]):
        return -1
    return end


def scan(data: bytes, path: str = "") -> tuple[list[tuple[int, bytes]], ScanReport]:
    """Valid records of a file's bytes as (offset, body), and a report.

    Where a record does not check out (bad crc or marker, or a length that
    lies), the scan looks for the next offset where a valid record starts and
    reports the bytes in between as one corrupt region; if none follows, the
    rest is a torn tail."""
    records: list[tuple[int, bytes]] = []
    report = ScanReport(path)
    pos, size = 0, len(data)
    while pos < size:
        end = _valid_at(data, pos)
        if end < 0:
            resume = next((p for p in range(pos + 1, size - OVERHEAD + 1) if _valid_at(data, p) >= 0), -1)
            if resume < 0:
                break
            report.corrupt_records.append(pos)
            pos = resume
            continue
        records.append((pos, data[pos + _LENGTH.size:end - _TRAILER.size]))
        pos = end
        report.valid_end = pos
    report.truncated_bytes = size - report.valid_end if pos < size else 0
    return records, report


def scan_file(path: str, truncate: bool = True) -> tuple[list[tuple[int, bytes]], ScanReport]:
    """`scan` a file (blocking; for recovery at start) and cut a torn tail off it."""
    with open(path, "rb") as f:
        data = f.read()
    records, report = scan(data, path)
    if report.truncated_bytes and truncate:
        with open(path, "r+b") as f:
            f.truncate(report.valid_end)
            f.flush()
            os.fsync(f.fileno())
    if report.damaged:
        report.log()
    return records, report
