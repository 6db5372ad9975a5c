"""The collector's write-ahead spool: requests are durable before they are acknowledged.

Each accepted request is appended to the open segment file as one frame
(``[4-byte magic][u32 length][u32 crc32][payload]``) and fsync'ed before the receiver answers. A
flusher later closes the segment, turns its frames into store files and deletes it. A segment is
also closed once it holds ``segment_bytes`` (and the flusher woken), so that a long burst reaches
the store in pieces while it lasts, each freeing its spool space once stored, instead of as one
segment of everything that arrived while the previous one was stored. After a crash, segments
still on disk are replayed at start.

Reading a segment keeps every intact frame: a frame whose length or CRC is wrong is skipped by
searching for the next magic, and the bytes no intact frame covers go to the quarantine (logged,
counted), never silently dropped. A file in the spool directory that is not a segment is moved to
the quarantine too, so it cannot stop a start.

Segment names carry an id unique to the collector start that opened them
(``seg-<start id>-<n>.log``), and store parts are named after their segment: parts of different
starts never collide, while replaying one segment twice rewrites the same part (no duplicates).
A collector replica (``--replica NAME``, one of several sharing a store) keeps its own spool
(``STORE/.spool-NAME``) and ends its part names with ``-NAME``, so replicas never replay or
overwrite each other's.
Segments of the older ``seg-<n>.log`` form (frames without the magic) are still replayed.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from xsp.collector.quarantine import Quarantine

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_RESERVE_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "MAGIC",
    "Spool",
    "SpoolFull",
    "read_frames",
]

log = logging.getLogger(__name__)

MAGIC = b"XSP\x01"
_HEADER = struct.Struct("<4sII")
_LEGACY_HEADER = struct.Struct("<II")
#: ``{n:06d}``: six digits at least, seven from a start's millionth segment on
_SEGMENT = re.compile(r"seg-(?P<start>[0-9a-f]{16})-(?P<n>[0-9]{6,})\.log")
_LEGACY_SEGMENT = re.compile(r"seg-(?P<n>[0-9]{8})\.log")
#: How many recent request digests are remembered to recognise a byte-identical retry (a sender
#: whose answer was lost to a crash): about 1 MiB of digests.
DEFAULT_DEDUP_WINDOW = 32768
#: A segment is closed for the flusher once it holds this much (about 45k of xsp's spans).
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
#: Free space on the spool's filesystem kept for the store: a request that would leave less is
#: refused (the sender retries), since the flusher needs room to turn the spool into store parts
#: and only then frees the spool's segments (four parts of a full segment, with room to spare).
DEFAULT_RESERVE_BYTES = 64 * 1024 * 1024


class SpoolFull(OSError):
    """The spool's filesystem cannot take a request now: nothing of it was kept."""


class Spool:
    """``append`` is thread-safe and blocks on fsync; ``rotate``/``closed``/``read``/``remove``
    are called by the one flusher, which replays the ``recovered`` segments while ``append`` goes
    on. ``on_closed`` is called when ``append`` closes a full segment."""

    def __init__(
        self,
        directory: Path,
        quarantine: Quarantine,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        on_closed: Callable[[], None] | None = None,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.quarantine = quarantine
        self.recovered: list[Path] = self._scan()  # segments left by an earlier process
        self.pending_bytes = sum(p.stat().st_size for p in self.recovered)
        self._start_id = self._new_start_id()
        self._next = 1
        self._lock = threading.Lock()
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._dedup_window = dedup_window
        self._segment_bytes = segment_bytes
        self._reserve_bytes = reserve_bytes
        self._on_closed = on_closed
        self._closed: list[Path] = []  # closed segments not yet handed to the flusher
        self._file = self._open_segment()
        self._written = 0
        self.duplicates = 0  # byte-identical retries acknowledged without a second copy
        for path in self.recovered:  # before any append: a retry of these is not spooled again
            legacy = _LEGACY_SEGMENT.fullmatch(path.name) is not None
            self._remember_payloads(read_frames(path.read_bytes(), legacy)[0])

    def _scan(self) -> list[Path]:
        found: list[tuple[tuple[str, int], Path]] = []
        for path in self.directory.iterdir():
            match = _SEGMENT.fullmatch(path.name)
            legacy = _LEGACY_SEGMENT.fullmatch(path.name)
            if path.is_file() and match:
                found.append(((match["start"], int(match["n"])), path))
            elif path.is_file() and legacy:
                found.append((("", int(legacy["n"])), path))  # older than any start id
            elif path.is_file() and not path.name.endswith(".tmp"):
                self.quarantine.take(path, "not a spool segment")
            else:
                log.warning("xsp collector: ignoring %s in the spool directory", path)
        return [path for _, path in sorted(found)]

    def _new_start_id(self) -> str:
        # Time-ordered, so recovered segments replay oldest first; checked against the segments
        # on disk so that two starts in one clock tick still differ.
        start = time.time_ns()
        matches = (_SEGMENT.fullmatch(p.name) for p in self.recovered)
        taken = {m["start"] for m in matches if m is not None}
        while f"{start:016x}" in taken:
            start += 1
        return f"{start:016x}"

    def _open_segment(self) -> BinaryIO:
        self._path = self.directory / f"seg-{self._start_id}-{self._next:06d}.log"
        self._next += 1
        return open(self._path, "ab", buffering=0)

    @staticmethod
    def part_name(segment: Path, replica: str | None = None) -> str:
        """The store part name of a segment: stable for the segment, unique across starts, and
        across the replicas that share a store (each names its own parts)."""
        match = _SEGMENT.fullmatch(segment.name)
        # a legacy segment keeps its old part name
        name = f"c{match['start']}-{match['n']}" if match else f"c{segment.stem[4:]}"
        return name if replica is None else f"{name}-{replica}"

    @staticmethod
    def is_own_part(part: str, replica: str | None) -> bool:
        """Whether the store part ``part`` is one that ``part_name`` gives the segments of
        ``replica`` (any part, for a collector that is the store's only writer). The segment
        number holds digits only, so replica ``r1`` never owns ``x-r1``'s parts."""
        if replica is None:
            return True
        return re.fullmatch(rf"c(?:[0-9a-f]{{16}}-)?[0-9]+-{re.escape(replica)}", part) is not None

    def append(self, payload: bytes) -> bool:
        """Write one frame and fsync it; returns once it is durable. Returns False (and writes
        nothing) when a byte-identical payload is already durable here or in the store. Raises
        OSError (``SpoolFull`` for a full disk, or one short of the reserve) having kept
        nothing of the frame: the request must not be acknowledged."""
        digest = hashlib.blake2b(payload, digest_size=16).digest()
        frame = _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            if digest in self._digests:
                self.duplicates += 1
                return False
            self._check_room(len(frame))
            self._write_frame(frame)
            self._written += len(frame)
            self.pending_bytes += len(frame)
            self._remember(digest)
            full = self._written >= self._segment_bytes
            if full:
                self._close_open()
        if full and self._on_closed is not None:
            self._on_closed()
        return True

    def _check_room(self, size: int) -> None:
        stat = os.fstatvfs(self._file.fileno())
        free = stat.f_bavail * stat.f_frsize
        if free - size < self._reserve_bytes:
            raise SpoolFull(
                errno.ENOSPC,
                f"{free} bytes free in {self.directory}, and {self._reserve_bytes} are kept for "
                f"the store: a request of {size} bytes is refused",
            )

    def _write_frame(self, frame: bytes) -> None:
        # os.write, not the file's write: on a nearly full disk a write is short without raising,
        # and only the count it returns tells. A frame is whole and fsync'ed or not there at all:
        # a partial one would pass for a sender's acknowledged request until the replay.
        fd = self._file.fileno()
        view = memoryview(frame)
        done = 0
        try:
            while done < len(frame):
                count = os.write(fd, view[done:])
                if count <= 0:
                    raise SpoolFull(errno.ENOSPC, f"{self._path} took no more bytes")
                done += count
            os.fsync(fd)
        except OSError as exc:
            self._truncate(exc)
            if exc.errno == errno.ENOSPC and not isinstance(exc, SpoolFull):
                raise SpoolFull(errno.ENOSPC, f"{self._path}: {exc.strerror}") from exc
            raise

    def _truncate(self, exc: OSError) -> None:
        try:
            os.ftruncate(self._file.fileno(), self._written)
            os.fsync(self._file.fileno())
        except OSError as again:  # its bytes go to the quarantine on replay, never acknowledged
            log.error(
                "xsp collector: cannot cut a failed frame (%s) from %s: %s", exc, self._path, again
            )

    def _remember(self, digest: bytes) -> None:
        self._digests[digest] = None
        if len(self._digests) > self._dedup_window:
            self._digests.popitem(last=False)

    def rotate(self) -> Path | None:
        """Close the open segment (if it holds anything) and start a new one; returns the
        segment closed (``closed`` hands it over too)."""
        with self._lock:
            if self._written == 0:
                return None
            return self._close_open()

    def closed(self) -> list[Path]:
        """The segments closed since the last call, oldest first (the flusher's to store)."""
        with self._lock:
            closed, self._closed = self._closed, []
        return closed

    def _close_open(self) -> Path:
        # under the lock: the new segment's name is durable before any request goes into it
        self._file.close()
        closed = self._path
        self._closed.append(closed)
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
            self._file.close()
            if self._written == 0:
                self._path.unlink(missing_ok=True)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, path: Path) -> list[bytes]:
        """The intact records of a segment, in order. Unreadable stretches go to the quarantine;
        the digests of what is read from an earlier process's segment are remembered, so a
        sender's retry of a request that a crash left unanswered is not stored twice (this
        process's own were remembered as they were appended)."""
        data = path.read_bytes()
        legacy = _LEGACY_SEGMENT.fullmatch(path.name) is not None
        records, bad = read_frames(data, legacy)
        for start, end in bad:
            self.quarantine.put(
                f"{path.stem}.at{start}.bad",
                data[start:end],
                f"{end - start} bytes of {path} at offset {start} hold no intact frame",
            )
        own = _SEGMENT.fullmatch(path.name)
        if own is None or own["start"] != self._start_id:
            self._remember_payloads(records)
        return records

    def _remember_payloads(self, payloads: list[bytes]) -> None:
        with self._lock:
            for payload in payloads:
                self._remember(hashlib.blake2b(payload, digest_size=16).digest())


def read_frames(data: bytes, legacy: bool = False) -> tuple[list[bytes], list[tuple[int, int]]]:
    """Split a segment into its intact payloads and the (start, end) byte ranges between them
    that no intact frame covers. A bad frame is skipped by resynchronising on the next magic
    (legacy frames, which have none, are searched for byte by byte)."""
    header = _LEGACY_HEADER if legacy else _HEADER
    records: list[bytes] = []
    bad: list[tuple[int, int]] = []
    offset, bad_start = 0, -1
    while offset < len(data):
        payload = _frame_at(data, offset, legacy)
        if payload is not None:
            if bad_start >= 0:
                bad.append((bad_start, offset))
                bad_start = -1
            records.append(payload)
            offset += header.size + len(payload)
            continue
        if bad_start < 0:
            bad_start = offset
        if legacy:
            offset += 1
        else:
            found = data.find(MAGIC, offset + 1)
            offset = found if found >= 0 else len(data)
    if bad_start >= 0:
        bad.append((bad_start, len(data)))
    return records, bad


def _frame_at(data: bytes, offset: int, legacy: bool) -> bytes | None:
    if legacy:
        if offset + _LEGACY_HEADER.size > len(data):
            return None
        length, crc = _LEGACY_HEADER.unpack_from(data, offset)
        start = offset + _LEGACY_HEADER.size
    else:
        if offset + _HEADER.size > len(data):
            return None
        magic, length, crc = _HEADER.unpack_from(data, offset)
        if magic != MAGIC:
            return None
        start = offset + _HEADER.size
    if start + length > len(data):
        return None
    payload = data[start : start + length]
    return payload if zlib.crc32(payload) == crc else None
