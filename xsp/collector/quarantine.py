"""Where the collector sets aside what it cannot store, so that it never blocks what it can.

Three things land here, each as one file named after where it came from, with a log line:

- ``<segment>.at<offset>.bad``: spool bytes that no intact frame covers (a flipped bit, a
  torn write, a file of garbage);
- ``<segment>.r<index>.pb``: a spooled request that reads back but cannot be turned into store
  rows (it passed ingest validation, yet its conversion failed: a fault nobody foresaw; the
  run.json of each run it was sent to counts it, ``writer.note_quarantined``);
- ``<name>.stray``: a file in the spool directory that is not a segment.

Nothing here is deleted by the collector: an operator can inspect, fix and re-send it.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

__all__ = ["QUARANTINE_DIR", "Quarantine"]

log = logging.getLogger(__name__)

QUARANTINE_DIR = ".quarantine"


class Quarantine:
    """Thread-safe; ``put`` and ``take`` may block on the disk (call them off the event loop)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.items = 0  # files set aside by this process
        self.bytes = 0
        self._lock = threading.Lock()

    def put(self, name: str, data: bytes, reason: str) -> Path:
        """Write ``data`` as ``name`` (never overwriting an earlier item) and log why."""
        path = self._free_path(name)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        self._count(len(data))
        log.error("xsp collector: quarantined %d bytes as %s: %s", len(data), path, reason)
        return path

    def take(self, source: Path, reason: str) -> Path:
        """Move a whole file here (a stray file in the spool directory)."""
        size = source.stat().st_size
        path = self._free_path(source.name + ".stray")
        os.replace(source, path)
        self._count(size)
        log.error("xsp collector: moved %s to %s: %s", source, path, reason)
        return path

    def _count(self, size: int) -> None:
        with self._lock:
            self.items += 1
            self.bytes += size

    def _free_path(self, name: str) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        n = 1
        while path.exists():  # a second crash can quarantine the same place again
            path = self.directory / f"{name}.{n}"
            n += 1
        return path
