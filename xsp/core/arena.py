"""Read a capture arena (written by ``xsp/tracer/native/capture.cpp``) into level records.

The arena is a file: a header, a region of length-prefixed strings, then chunks of fixed-size
records, each chunk owned by one thread. A record counts once its kind is set, and an op, module
call or range once its end is; the process that wrote it may have died since (the runner reads
arenas of killed programs). Numpy only: no torch, no extension.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from xsp.core import schema
from xsp.core.errors import StoreError
from xsp.core.intervals import find_rows
from xsp.core.records import (
    BACKWARD_PREFIX,
    MODULE_RANGE_PREFIX,
    FrameworkRecords,
    GraphNodes,
    Interned,
    MemoryRecords,
    ModuleInfo,
    StepRecords,
)
from xsp.core.run_sections import ArenaCounts

__all__ = [
    "ARENA_FILE",
    "CHUNK",
    "GRAPH_NODE_PHASES",
    "HEADER",
    "KIND_SOURCE",
    "MAGIC",
    "PENDING_ARENA_PATTERN",
    "RECORD",
    "VERSION",
    "ArenaContents",
    "framework_records",
    "graph_nodes",
    "link_backward_nodes",
    "memory_records",
    "open_threads",
    "pending_arena_name",
    "read_arena",
    "step_records",
]

MAGIC = b"XSPARENA"
VERSION = 1
KIND_OP, KIND_MODULE, KIND_RANGE, KIND_STEP, KIND_MODULE_INFO, KIND_MEMORY = 1, 2, 3, 4, 5, 6
KIND_SOURCE = 7  # an op's calling Python line: seq_nr is the op's record id
# CUDA graph nodes (capture.cpp's kGraphNode, kGraphClone): seq_nr the node id; a made node's
# name, shapes, dtypes: its op's name, module index, phase, and its aux, start_ns: the outermost
# op's name and instance (aux -1: none, as recorded before these were); a clone's aux: its
# original node
KIND_GRAPH_NODE, KIND_GRAPH_CLONE = 8, 9
#: The phases capture.cpp records for a graph node's op, by code (-1: unknown)
GRAPH_NODE_PHASES = {0: schema.PHASE_FORWARD, 1: schema.PHASE_BACKWARD, 2: schema.PHASE_OPTIMIZER}

HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("record_bytes", "<u4"),
        ("chunk_records", "<u8"),
        ("chunk_capacity", "<u8"),
        ("chunks_offset", "<u8"),
        ("strings_offset", "<u8"),
        ("strings_capacity", "<u8"),
        ("pid", "<i8"),
        ("chunks_used", "<u8"),
        ("strings_count", "<u8"),
        ("strings_bytes", "<u8"),
        ("dropped_records", "<u8"),
        ("dropped_strings", "<u8"),
        ("callback_errors", "<u8"),
    ]
)
CHUNK = np.dtype([("os_thread", "<i8"), ("rf_thread", "<i8"), ("used", "<u8"), ("pad", "<u8")])
RECORD = np.dtype(
    [
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("seq_nr", "<i8"),
        ("aux", "<i8"),
        ("name", "<i4"),
        ("shapes", "<i4"),
        ("dtypes", "<i4"),
        ("scope", "u1"),
        ("pad", "u1", (2,)),
        ("kind", "u1"),
    ]
)
ARENA_FILE = "capture.arena"
#: A continuous session's batch whose arena is drained but not yet stored: ``capture-<part>.arena``,
#: removed once ``spans-<part>.parquet`` is written (``xsp.tracer.export.batches``).
PENDING_ARENA_PATTERN = "capture-*.arena"


def pending_arena_name(part: str) -> str:
    return f"capture-{part}.arena"


@dataclass
class ArenaContents:
    """Every complete record of an arena, with its thread and its id (what the op callback
    pushed to CUPTI as external correlation id: chunk * chunk_records + slot + 1)."""

    records: np.ndarray  # RECORD rows
    thread: np.ndarray  # OS thread id of each row
    record_id: np.ndarray
    rf_to_os: dict[int, int]  # RecordFunction thread id -> OS thread id
    strings: list[str]
    counts: ArenaCounts = field(default_factory=lambda: ArenaCounts())
    open_threads: dict[int, int] = field(default_factory=dict)  # thread -> records not closed

    def of_kind(self, kind: int) -> np.ndarray:
        return np.nonzero(self.records["kind"] == kind)[0]

    @classmethod
    def empty(cls) -> ArenaContents:
        """What an arena never opened holds (the levels never came on)."""
        none = np.zeros(0, dtype=np.int64)
        return cls(np.zeros(0, dtype=RECORD), none, none.copy(), {}, [])


def read_arena(path: Path) -> ArenaContents:
    """The complete records of the arena at ``path``; StoreError names a bad file. Reads only
    the parts in use (the file is sparse and mostly empty)."""
    try:
        with open(path, "rb") as handle:
            return _parse(handle, path)
    except OSError as exc:
        raise StoreError(f"cannot read the capture arena {path}: {exc}") from exc


def _read(handle: BinaryIO, offset: int, size: int, path: Path) -> bytes:
    handle.seek(offset)
    data = handle.read(size)
    if len(data) < size:
        raise StoreError(f"capture arena {path} is truncated ({offset + len(data)} bytes)")
    return data


def _parse(handle: BinaryIO, path: Path) -> ArenaContents:
    head = np.frombuffer(_read(handle, 0, HEADER.itemsize, path), HEADER, count=1)[0]
    if bytes(head["magic"]) != MAGIC or int(head["version"]) != VERSION:
        raise StoreError(f"{path} is not an xsp capture arena of version {VERSION}")
    if int(head["record_bytes"]) != RECORD.itemsize:
        raise StoreError(f"capture arena {path} has {head['record_bytes']}-byte records")
    region = _read(handle, int(head["strings_offset"]), int(head["strings_bytes"]), path)
    strings = _strings(region, int(head["strings_count"]))
    per_chunk = int(head["chunk_records"])
    chunk_bytes = CHUNK.itemsize + per_chunk * RECORD.itemsize
    used_chunks = min(int(head["chunks_used"]), int(head["chunk_capacity"]))
    data = _read(handle, int(head["chunks_offset"]), used_chunks * chunk_bytes, path)
    parts, threads, ids = [], [], []
    rf_to_os: dict[int, int] = {}
    for index in range(used_chunks):
        at = index * chunk_bytes
        chunk = np.frombuffer(data, CHUNK, count=1, offset=at)[0]
        used = min(int(chunk["used"]), per_chunk)
        parts.append(np.frombuffer(data, RECORD, count=used, offset=at + CHUNK.itemsize))
        threads.append(np.full(used, int(chunk["os_thread"]), dtype=np.int64))
        ids.append(index * per_chunk + np.arange(used, dtype=np.int64) + 1)
        rf_to_os.setdefault(int(chunk["rf_thread"]), int(chunk["os_thread"]))
    records = np.concatenate(parts) if parts else np.zeros(0, RECORD)
    thread = np.concatenate(threads) if threads else np.zeros(0, np.int64)
    record_id = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    still_open = _open(records["kind"], records["end_ns"])
    closed = (records["kind"] != 0) & ~still_open
    counts: ArenaCounts = {
        "dropped_records": int(head["dropped_records"]),
        "dropped_strings": int(head["dropped_strings"]),
        "callback_errors": int(head["callback_errors"]),
        "open_records": int(still_open.sum()),
    }
    return ArenaContents(
        records[closed],
        thread[closed],
        record_id[closed],
        rf_to_os,
        strings,
        counts,
        _per_thread(thread[still_open]),
    )


def _open(kind: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Records written but not ended (a step record carries no end)."""
    return (kind != 0) & (end_ns == 0) & (kind != KIND_STEP)


def _per_thread(threads: np.ndarray) -> dict[int, int]:
    found, counts = np.unique(threads, return_counts=True)
    return dict(zip(found.tolist(), counts.tolist(), strict=True))


def open_threads(path: Path) -> dict[int, int]:
    """Per thread, the records still open in the arena at ``path`` while it is written to:
    read in place (a memory map of the chunks, nothing copied), for the end of a run to wait on."""
    try:
        with open(path, "rb") as handle:
            head = np.frombuffer(_read(handle, 0, HEADER.itemsize, path), HEADER, count=1)[0]
        used_chunks = min(int(head["chunks_used"]), int(head["chunk_capacity"]))
        if not used_chunks:
            return {}
        per_chunk = int(head["chunk_records"])
        layout = np.dtype([("head", CHUNK), ("records", RECORD, (per_chunk,))])
        chunks = np.memmap(
            path, layout, mode="r", offset=int(head["chunks_offset"]), shape=(used_chunks,)
        )
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read the capture arena {path}: {exc}") from exc
    in_use = np.arange(per_chunk) < chunks["head"]["used"][:, None]
    still_open = in_use & _open(chunks["records"]["kind"], chunks["records"]["end_ns"])
    return _per_thread(np.repeat(chunks["head"]["os_thread"], still_open.sum(axis=1)))


def _strings(region: bytes, count: int) -> list[str]:
    out = []
    at = 0
    for _ in range(count):
        length = int.from_bytes(region[at : at + 4], "little")
        out.append(region[at + 4 : at + 4 + length].decode("utf-8", errors="replace"))
        at += (4 + length + 3) & ~3
    return out


def step_records(arena: ArenaContents) -> StepRecords:
    """Level M's iterations, in iteration order."""
    rows = arena.of_kind(KIND_STEP)
    rows = rows[np.argsort(arena.records["seq_nr"][rows], kind="stable")]
    steps = StepRecords()
    steps.iteration = arena.records["seq_nr"][rows].tolist()
    steps.start_ns = arena.records["start_ns"][rows].tolist()
    steps.end_ns = arena.records["end_ns"][rows].tolist()
    return steps


def framework_records(arena: ArenaContents) -> FrameworkRecords:
    """Level F's records in the form conversion reads: ops and ranges as they are, module calls
    as ranges ``xsp::module::<call>`` numbered in call order, with their module table."""
    rec, strings = arena.records, arena.strings
    kind = rec["kind"]
    rows = np.nonzero((kind == KIND_OP) | (kind == KIND_RANGE) | (kind == KIND_MODULE))[0]
    rows = rows[np.argsort(arena.record_id[rows], kind="stable")]
    is_module = kind[rows] == KIND_MODULE
    module_rows = rows[is_module]
    calls = len(module_rows)

    out = FrameworkRecords()
    names = list(strings) + [f"{MODULE_RANGE_PREFIX}{c}" for c in range(calls)]
    name_codes = rec["name"][rows].astype(np.int32)
    name_codes[is_module] = len(strings) + np.arange(calls, dtype=np.int32)
    out.name = Interned.from_codes(name_codes, names)
    out.start_ns = _int64s(rec["start_ns"][rows])
    out.end_ns = _int64s(rec["end_ns"][rows])
    out.thread = _int64s(arena.thread[rows])
    out.fwd_thread = _int64s(_os_threads(rec["aux"][rows], arena.rf_to_os))
    seq = rec["seq_nr"][rows].copy()
    seq[is_module] = -1
    out.seq_nr = _int64s(seq)
    out.external_id = _int64s(np.where(kind[rows] == KIND_OP, arena.record_id[rows], 0))
    shape_codes = rec["shapes"][rows].astype(np.int32)
    dtype_codes = np.where(is_module, -1, rec["dtypes"][rows]).astype(np.int32)
    out.input_shapes = Interned.from_codes(*_with_blank(shape_codes, strings, "[]"))
    out.input_dtypes = Interned.from_codes(*_with_blank(dtype_codes, strings, ""))
    out.op_source = Interned.from_codes(*_with_blank(_op_sources(arena, rows), strings, ""))

    infos = arena.of_kind(KIND_MODULE_INFO)
    table: dict[int, ModuleInfo] = {}
    for row in infos.tolist():
        table[int(rec["seq_nr"][row])] = ModuleInfo(**json.loads(strings[rec["name"][row]]))
    if sorted(table) != list(range(len(table))):
        raise StoreError("the capture arena's module table has gaps")
    out.modules = [table[i] for i in range(len(table))]
    out.call_module = rec["seq_nr"][module_rows].tolist()
    out.call_input_shapes = [  # None: the run recorded no shapes
        strings[c] if 0 <= c < len(strings) else None for c in rec["shapes"][module_rows].tolist()
    ]
    out.call_output_shapes = {
        call: _text(strings, code, "[]")
        for call, code in enumerate(rec["dtypes"][module_rows].tolist())
        if code >= 0
    }
    out.memory = memory_records(arena)
    out.graph_nodes = graph_nodes(arena)
    link_backward_nodes(out)
    return out


def graph_nodes(arena: ArenaContents) -> GraphNodes:
    """The CUDA graph nodes made and cloned while recording."""
    rec, strings = arena.records, arena.strings
    out = GraphNodes()
    for row in arena.of_kind(KIND_GRAPH_NODE).tolist():
        node = int(rec["seq_nr"][row])
        out.op[node] = _text(strings, int(rec["name"][row]), "")
        out.module[node] = int(rec["shapes"][row])
        out.phase[node] = GRAPH_NODE_PHASES.get(int(rec["dtypes"][row]), "")
        call = int(rec["aux"][row])
        if call >= 0:
            out.call[node] = _text(strings, call, "")
            out.instance[node] = int(rec["start_ns"][row])
    for row in arena.of_kind(KIND_GRAPH_CLONE).tolist():
        original = int(rec["aux"][row])
        if original > 0:
            out.cloned_from[int(rec["seq_nr"][row])] = original
    return out


def _op_sources(arena: ArenaContents, rows: np.ndarray) -> np.ndarray:
    """Each row's calling Python line (a string code), -1 where none was recorded."""
    sources = arena.of_kind(KIND_SOURCE)
    codes = np.full(len(rows), -1, dtype=np.int32)
    if not len(sources):
        return codes
    slot = find_rows(arena.records["seq_nr"][sources], arena.record_id[rows])
    found = slot >= 0
    codes[found] = arena.records["name"][sources[slot[found]]]
    return codes


def memory_records(arena: ArenaContents) -> MemoryRecords:
    """The allocator events, in time order."""
    rows = arena.of_kind(KIND_MEMORY)
    rows = rows[np.argsort(arena.records["start_ns"][rows], kind="stable")]
    rec = arena.records
    out = MemoryRecords()
    out.time_ns = _int64s(rec["start_ns"][rows])
    out.thread = _int64s(arena.thread[rows])
    out.bytes = _int64s(rec["seq_nr"][rows])
    out.total_allocated = _int64s(rec["aux"][rows])
    out.device_type = _int64s(rec["shapes"][rows])
    out.device_index = _int64s(rec["dtypes"][rows])
    return out


def _os_threads(rf_threads: np.ndarray, rf_to_os: dict[int, int]) -> np.ndarray:
    """RecordFunction thread ids -> OS thread ids (-1 where unknown or unset)."""
    keys = np.array(sorted(rf_to_os), dtype=np.int64)
    values = np.array([rf_to_os[k] for k in keys.tolist()], dtype=np.int64)
    slot = find_rows(keys, rf_threads)
    return np.where((slot >= 0) & (rf_threads > 0), values[np.maximum(slot, 0)], -1)


def _text(strings: list[str], code: int, blank: str) -> str:
    return strings[code] if 0 <= code < len(strings) else blank


def _with_blank(codes: np.ndarray, strings: list[str], blank: str) -> tuple[np.ndarray, list[str]]:
    """Codes into ``strings``, with ``blank`` (appended when it is not there) for the rows
    without one: conversion reads a blank value as no value."""
    values = list(strings)
    if blank not in values:
        values.append(blank)
    return np.where(codes >= 0, codes, values.index(blank)).astype(np.int32), values


def _int64s(values: np.ndarray) -> array[int]:
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def link_backward_nodes(records: FrameworkRecords) -> None:
    """Give each backward node's ``evaluate_function`` range what its record may lack: its
    sequence number, which the node's own range carries (the next range on the same thread,
    ``ConvolutionBackward0``), and, where none was recorded, its forward thread: the thread of
    the earliest range with that sequence number (forward runs before backward)."""
    names = records.name.values
    evaluate = np.array([n.startswith(BACKWARD_PREFIX) for n in names] or [False])
    code = np.frombuffer(records.name.codes, dtype=np.int32)
    start = np.frombuffer(records.start_ns, dtype=np.int64)
    thread = np.frombuffer(records.thread, dtype=np.int64)
    seq = np.frombuffer(records.seq_nr, dtype=np.int64)
    fwd_thread = np.frombuffer(records.fwd_thread, dtype=np.int64)
    order = np.lexsort((start, thread))
    for at in np.nonzero(evaluate[code[order]] & (seq[order] < 0))[0].tolist():
        row, node = order[at], order[min(at + 1, len(order) - 1)]
        own_name = names[code[row]][len(BACKWARD_PREFIX) :]
        if thread[node] == thread[row] and names[code[node]] == own_name:
            seq[row] = seq[node]
    by_time = np.argsort(start, kind="stable")
    with_seq = by_time[seq[by_time] >= 0]
    seqs, first = np.unique(seq[with_seq], return_index=True)
    first_thread = thread[with_seq[first]]
    backward = np.nonzero(evaluate[code] & (seq >= 0) & (fwd_thread < 0))[0]
    slot = np.searchsorted(seqs, seq[backward])
    fwd_thread[backward] = first_thread[slot]
