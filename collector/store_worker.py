"""Turning one spool segment's requests into store files: the flusher's CPU-heavy step.

It runs in the flusher thread, or (``xsp collector serve``) in a worker process: converting
protobuf spans to columns is pure Python and, in the receivers' process, holds the GIL that their
event loop needs for every socket read (measured on the 2-core dev machine: 160k spans/s
acknowledged with the flusher idle, about 90k with it converting in a thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from collector import writer
from collector.writer import StoreWriter
from tracer import otlp

#: (index of the request in its segment, why it could not be converted)
Poison = tuple[int, str]


def store_requests(store: StoreWriter, part_name: str, payloads: Sequence[bytes]) -> list[Poison]:
    """Convert and write every request that converts; return the ones that do not (poison), so
    that one bad request never blocks the rest of its segment. Store errors propagate."""
    converted: list[writer.Converted] = []
    poison: list[Poison] = []
    for index, payload in enumerate(payloads):
        try:
            converted.append(writer.convert(otlp.parse_protobuf(payload)))
        except Exception as exc:  # any failure to convert makes the request poison, no more
            poison.append((index, f"cannot convert to store rows: {exc}"))
    store.write(part_name, converted)
    return poison


def store_in_worker(root: str, part_name: str, payloads: Sequence[bytes]) -> list[Poison]:
    """``store_requests`` in a worker process (arguments and result cross a pipe)."""
    return store_requests(StoreWriter(Path(root)), part_name, payloads)
