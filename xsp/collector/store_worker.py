"""Turning one spool segment's requests into store files: the flusher's CPU-heavy step.

It runs in the flusher thread, or (``xsp collector serve``) in a worker process: converting
protobuf spans to columns is pure Python and, in the receivers' process, holds the GIL that their
event loop needs for every socket read (measured on the 2-core dev machine: 160k spans/s
acknowledged with the flusher idle, about 90k with it converting in a thread). xsp's own spans
are decoded column-wise (``otlp_columns``), any other request span by span. The worker keeps
one ``StoreWriter`` per store for its lifetime, so the span-key indexes that keep a span from
being stored twice are read from the parts once, not once per segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from xsp.collector import writer
from xsp.collector.object_mirror import ObjectMirror, StoreTarget
from xsp.collector.writer import StoreWriter
from xsp.core.otlp import columns as otlp_columns

__all__ = ["Poison", "Stored", "open_writer", "store_in_worker", "store_requests"]

#: (index of the request in its segment, why it could not be converted)
Poison = tuple[int, str]


class Stored(NamedTuple):
    """What storing one segment did: the requests set aside, the spans left out as already
    stored (or repeated within the segment)."""

    poison: list[Poison]
    duplicate_spans: int


def store_requests(store: StoreWriter, part_name: str, payloads: Sequence[bytes]) -> Stored:
    """Convert and write every request that converts; return the ones that do not (poison), so
    that one bad request never blocks the rest of its segment, nor one whose run directory is
    a symbolic link (``writer.unsafe_destination``). Store errors propagate."""
    parsed: list[Any] = []
    indexes: list[int] = []  # of the parsed requests in the segment
    poison: list[Poison] = []
    for index, payload in enumerate(payloads):
        try:
            parsed.append(otlp_columns.parse_request(payload))
            indexes.append(index)
        except Exception as exc:  # any failure to convert makes the request poison, no more
            poison.append((index, f"cannot convert to store rows: {exc}"))
    together = writer.convert_together(parsed)
    if together is None:  # one request is not xsp's common case, or fails: each alone
        converted = _each(indexes, parsed, poison)
    else:
        converted = list(zip(indexes, together, strict=True))
    kept: list[writer.Converted] = []
    unsafe: dict[tuple[str, str], str | None] = {}  # each run directory looked at once
    for index, request in converted:
        for run in request:
            if run.key not in unsafe:
                unsafe[run.key] = writer.unsafe_destination(store.root, [run.key])
        why = next((unsafe[run.key] for run in request if unsafe[run.key] is not None), None)
        if why is None:
            kept.append(request)
        else:
            poison.append((index, why))
    poison.sort()
    before = store.duplicate_spans
    store.write(part_name, kept)
    return Stored(poison, store.duplicate_spans - before)


def _each(
    indexes: list[int], parsed: list[Any], poison: list[Poison]
) -> list[tuple[int, writer.Converted]]:
    """Each request converted alone; the ones that fail are added to ``poison``."""
    converted: list[tuple[int, writer.Converted]] = []
    for index, request in zip(indexes, parsed, strict=True):
        try:
            converted.append((index, writer.convert(request)))
        except Exception as exc:  # any failure to convert makes the request poison
            poison.append((index, f"cannot convert to store rows: {exc}"))
    return converted


def open_writer(target: StoreTarget) -> StoreWriter:
    """The writer of ``target``: into the local store, or into the working copy of the object
    store, each run's new part uploaded as it is written."""
    mirror = None
    if target.uri is not None:
        mirror = ObjectMirror(target.uri, target.root, target.replica)
    return StoreWriter(Path(target.root), mirror=mirror)


#: The worker process's writers, by target: kept across segments (and their indexes too).
_writers: dict[StoreTarget, StoreWriter] = {}


def store_in_worker(target: StoreTarget, part_name: str, payloads: Sequence[bytes]) -> Stored:
    """``store_requests`` in a worker process (arguments and result cross a pipe)."""
    store = _writers.get(target)
    if store is None:
        store = _writers[target] = open_writer(target)
    return store_requests(store, part_name, payloads)
