"""The collector's write-ahead spool: requests are durable before they are acknowledged.

Each accepted request is appended to the open segment file as one record
(``[u32 length][u32 crc32][payload]``) and fsync'ed before the receiver answers. A flusher later
closes the segment, turns its records into store files and deletes it. After a crash, segments
still on disk are replayed at start; a record cut short by the crash fails its length or CRC and
ends the replay of that segment (it was never acknowledged).
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

_HEADER = struct.Struct("<II")
SEGMENT_GLOB = "seg-*.log"


class Spool:
    """Appends are thread-safe; ``rotate``/``read``/``remove`` are called by the one flusher."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = sorted(self.directory.glob(SEGMENT_GLOB))
        self._next = 1 + max((int(p.stem[4:]) for p in existing), default=0)
        self.recovered: list[Path] = existing  # segments left by an earlier process
        self._lock = threading.Lock()
        self._file = self._open_segment()
        self._written = 0
        self.pending_bytes = sum(p.stat().st_size for p in existing)

    def _open_segment(self) -> object:
        self._path = self.directory / f"seg-{self._next:08d}.log"
        self._next += 1
        return open(self._path, "ab", buffering=0)

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it; returns once it is durable."""
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            self._file.write(record)  # type: ignore[attr-defined]
            os.fsync(self._file.fileno())  # type: ignore[attr-defined]
            self._written += len(record)
            self.pending_bytes += len(record)

    def rotate(self) -> Path | None:
        """Close the open segment (if it holds anything) and start a new one."""
        with self._lock:
            if self._written == 0:
                return None
            self._file.close()  # type: ignore[attr-defined]
            closed = self._path
            self._file = self._open_segment()
            self._written = 0
        self._fsync_directory()
        return closed

    def remove(self, path: Path) -> None:
        size = path.stat().st_size
        path.unlink()
        self._fsync_directory()
        with self._lock:
            self.pending_bytes -= size

    def close(self) -> None:
        with self._lock:
            self._file.close()  # type: ignore[attr-defined]
            if self._written == 0:
                self._path.unlink(missing_ok=True)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def read(path: Path) -> Iterator[bytes]:
        """The intact records of a segment, in order; stops at a torn or corrupt tail."""
        data = path.read_bytes()
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, offset)
            start = offset + _HEADER.size
            payload = data[start : start + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                return
            yield payload
            offset = start + length
