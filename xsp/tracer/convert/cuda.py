"""Library and CUDA records (levels L and G) -> span blocks, hung under the framework level.

Hierarchy, from ids and recorded nesting:
1. a kernel, memcpy or memset hangs under the API call that launched it (CUPTI correlation id);
2. an API call hangs under the innermost library call (cuBLAS/cuDNN NVTX range) containing it on
   its thread, else under the innermost aten op;
3. a library call hangs under the library call or aten op containing it on its thread.
Host ranges nest exactly within a thread (``nest``). Where the two sides name threads differently
(Kineto's thread numbers against OS thread ids: oneDNN ranges under a CPU run's ops), each thread
is matched to the thread whose ranges contain most of its calls.
Rows that reach no op hang under the model span of the iteration they fall in (time); rows outside
every iteration (xsp's own synchronizations) are counted and left out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.columns import arrow, dictionary_column
from xsp.core.intervals import find_rows, nest
from xsp.core.records import (
    API_RUNTIME,
    GPU_KERNEL,
    GPU_MEMCPY,
    ApiRecords,
    GpuRecords,
    RangeRecords,
    StepRecords,
)
from xsp.tracer.convert.table import BlockColumn, BlockColumns

__all__ = ["HostSpans", "api_columns", "demangle", "gpu_columns", "library_columns"]


@dataclass(frozen=True)
class HostSpans:
    """The host spans that calls hang under (a framework block's ops, or the library calls):
    each one's start, duration, thread and iteration, and for ops their CUPTI external
    correlation id (None: recorded without)."""

    start_ns: BlockColumn
    dur_ns: BlockColumn
    thread_id: BlockColumn
    iteration: np.ndarray
    external_id: np.ndarray | None = None


def _step_iteration(steps: StepRecords, start: np.ndarray) -> np.ndarray:
    """Iteration whose model span contains each start time, -1 for none."""
    order = np.argsort(np.asarray(steps.start_ns, dtype=np.int64))
    s = np.asarray(steps.start_ns, dtype=np.int64)[order]
    e = np.asarray(steps.end_ns, dtype=np.int64)[order]
    it = np.asarray(steps.iteration, dtype=np.int64)[order]
    if len(s) == 0:
        return np.full(len(start), -1, dtype=np.int64)
    slot = np.searchsorted(s, start, side="right") - 1
    inside = (slot >= 0) & (start <= e[np.maximum(slot, 0)])
    return np.where(inside, it[np.maximum(slot, 0)], -1)


def match_threads(
    call_thread: np.ndarray,
    call_start: np.ndarray,
    call_end: np.ndarray,
    op_thread: np.ndarray,
    op_start: np.ndarray,
    op_end: np.ndarray,
) -> np.ndarray:
    """For each call, the index of the innermost op containing it on the profiler thread that
    best matches the call's OS thread, or -1. The native core and CUPTI both name OS threads,
    so a call on a thread that recorded ops nests among that thread's ops, all in one pass; only
    calls of other threads (records whose ops named profiler threads) search for a match."""
    parent = np.full(len(call_start), -1, dtype=np.int64)
    same = np.isin(call_thread, op_thread)
    if same.any():
        calls = np.nonzero(same)[0]
        nested = nest(
            np.concatenate([op_thread, call_thread[calls]]),
            np.concatenate([op_start, call_start[calls]]),
            np.concatenate([op_end, call_end[calls]]),
        )[len(op_start) :]
        parent[calls] = np.where(nested < len(op_start), nested, -1)
    for os_thread in np.unique(call_thread[~same]):
        calls = np.nonzero(call_thread == os_thread)[0]
        best_hits, best = 0, None
        for thread in np.unique(op_thread):
            ops = np.nonzero(op_thread == thread)[0]
            starts = np.concatenate([op_start[ops], call_start[calls]])
            ends = np.concatenate([op_end[ops], call_end[calls]])
            nested = nest(np.zeros(len(starts), dtype=np.int64), starts, ends)[len(ops) :]
            hits = (nested >= 0) & (nested < len(ops))
            if hits.sum() > best_hits:
                best_hits = int(hits.sum())
                best = np.where(hits, ops[np.clip(nested, 0, len(ops) - 1)], -1)
        if best is not None:
            parent[calls] = best
    return parent


def _containing_op(
    thread: np.ndarray, start: np.ndarray, end: np.ndarray, ops: HostSpans | None
) -> np.ndarray:
    """Row of the innermost framework op containing each interval, -1 for none."""
    if ops is None or not len(ops.start_ns):
        return np.full(len(start), -1, dtype=np.int64)
    op_start = np.asarray(ops.start_ns, dtype=np.int64)
    op_end = op_start + np.asarray(ops.dur_ns, dtype=np.int64)
    return match_threads(thread, start, end, np.asarray(ops.thread_id), op_start, op_end)


def library_columns(
    ranges: RangeRecords, steps: StepRecords, ops: HostSpans | None
) -> tuple[np.ndarray, np.ndarray, BlockColumns, np.ndarray, np.ndarray]:
    """(rows kept, iteration, columns, parent among kept rows or -1, op row or -1) for library
    calls. A call inside another on its thread (cuBLAS inside cuDNN) hangs under it; an
    outermost call hangs under the innermost aten op containing it."""
    start = np.frombuffer(ranges.start_ns, dtype=np.int64)
    end = np.frombuffer(ranges.end_ns, dtype=np.int64)
    thread = np.frombuffer(ranges.thread, dtype=np.int64)
    op_row = _containing_op(thread, start, end, ops)
    iteration = _step_iteration(steps, start)
    if ops is not None and len(ops.start_ns):
        iteration = np.where(op_row >= 0, ops.iteration[np.maximum(op_row, 0)], iteration)
    keep = np.nonzero(iteration >= 0)[0]
    parent = nest(thread[keep], start[keep], end[keep])
    columns = {
        "name": dictionary_column(
            np.frombuffer(ranges.name.codes, dtype=np.int32)[keep], ranges.name.values
        ),
        "start_ns": start[keep],
        "dur_ns": end[keep] - start[keep],
        "kind": [schema.KIND_LIBRARY_CALL] * len(keep),
        "thread_id": thread[keep],
        "library": dictionary_column(
            np.frombuffer(ranges.domain.codes, dtype=np.int32)[keep], ranges.domain.values
        ),
        "library_detail": _strings(ranges.detail, keep, np.ones(len(keep), dtype=bool)),
    }
    op_row = np.where(parent >= 0, -1, op_row[keep])
    return keep, iteration[keep], columns, parent, op_row


def _op_of_call(
    api: ApiRecords, thread: np.ndarray, start: np.ndarray, end: np.ndarray, ops: HostSpans | None
) -> tuple[np.ndarray, np.ndarray]:
    """(op row or -1, reached by id) for each API call: the op whose record id the call's
    external correlation id names, else the innermost op containing it on its thread (records
    captured without ids)."""
    by_id = np.zeros(len(start), dtype=bool)
    op_row = np.full(len(start), -1, dtype=np.int64)
    external = np.frombuffer(api.external_id, dtype=np.int64)
    if ops is not None and ops.external_id is not None and len(external) == len(start):
        op_row = find_rows(np.asarray(ops.external_id), np.where(external > 0, external, -1))
        by_id = op_row >= 0
    rest = np.nonzero(~by_id)[0]
    if len(rest):
        op_row[rest] = _containing_op(thread[rest], start[rest], end[rest], ops)
    return op_row, by_id


def api_columns(
    api: ApiRecords,
    steps: StepRecords,
    ops: HostSpans | None,
    library: HostSpans | None,
) -> tuple[np.ndarray, np.ndarray, BlockColumns, np.ndarray, np.ndarray, np.ndarray]:
    """(rows kept, iteration, columns, library row or -1, op row or -1, op reached by id) for
    the API calls: each hangs under the innermost library call containing it on its thread,
    else under its op (both recorded on one clock with OS thread ids)."""
    start = np.frombuffer(api.start_ns, dtype=np.int64)
    end = np.frombuffer(api.end_ns, dtype=np.int64)
    thread = np.frombuffer(api.thread, dtype=np.int64)
    lib_row = _containing_op(thread, start, end, library)
    op_row, by_id = _op_of_call(api, thread, start, end, ops)
    op_row = np.where(lib_row >= 0, -1, op_row)
    by_id &= lib_row < 0
    iteration = _step_iteration(steps, start)
    for rows, host in ((op_row, ops), (lib_row, library)):
        if host is not None and len(host.start_ns):
            iteration = np.where(rows >= 0, host.iteration[np.maximum(rows, 0)], iteration)
    keep = np.nonzero(iteration >= 0)[0]
    kind = np.frombuffer(api.kind, dtype=np.int8)[keep]
    names = np.frombuffer(api.name.codes, dtype=np.int32)[keep]
    columns = {
        "name": dictionary_column(names, api.name.values),
        "start_ns": start[keep],
        "dur_ns": end[keep] - start[keep],
        "kind": dictionary_column(
            np.where(kind == API_RUNTIME, 0, 1), [schema.KIND_RUNTIME, schema.KIND_DRIVER]
        ),
        "thread_id": thread[keep],
        "correlation_id": np.frombuffer(api.correlation, dtype=np.int64)[keep],
        "gpu_stream": _named(api.stream, len(start), keep),
        "cuda_event": _named(api.event, len(start), keep),
    }
    return keep, iteration[keep], columns, lib_row[keep], op_row[keep], by_id[keep]


def _named(values: Any, rows: int, keep: np.ndarray) -> pa.Array:
    """The stream or event each kept API call names, null for none (and for records from before
    CUPTI's synchronization records were kept)."""
    data = np.frombuffer(values, dtype=np.int64)
    data = data[keep] if len(data) == rows else np.full(len(keep), -1, dtype=np.int64)
    return arrow(data, pa.int64(), mask=data < 0)


def gpu_columns(
    gpu: GpuRecords, steps: StepRecords, api_correlation: np.ndarray, api_iteration: np.ndarray
) -> tuple[np.ndarray, np.ndarray, BlockColumns, np.ndarray]:
    """(rows kept, their iteration, their columns, their API row or -1) for GPU activities."""
    start = np.frombuffer(gpu.start_ns, dtype=np.int64)
    correlation = np.frombuffer(gpu.correlation, dtype=np.int64)
    api_row = find_rows(api_correlation, correlation)
    iteration = _step_iteration(steps, start)
    if len(api_iteration):
        iteration = np.where(api_row >= 0, api_iteration[np.maximum(api_row, 0)], iteration)
    keep = np.nonzero(iteration >= 0)[0]
    kind = np.frombuffer(gpu.kind, dtype=np.int8)[keep]
    names = [demangle(n) for n in gpu.name.values]
    end = np.frombuffer(gpu.end_ns, dtype=np.int64)[keep]

    def ints(values: Any) -> pa.Array:
        data = np.frombuffer(values, dtype=np.int64)[keep]
        return arrow(data, pa.int64(), mask=data < 0)

    columns = {
        "name": dictionary_column(np.frombuffer(gpu.name.codes, dtype=np.int32)[keep], names),
        "start_ns": start[keep],
        "dur_ns": end - start[keep],
        "kind": dictionary_column(
            kind.astype(np.int64), [schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET]
        ),
        "correlation_id": correlation[keep],
        "gpu_device": np.frombuffer(gpu.device, dtype=np.int64)[keep],
        "gpu_stream": np.frombuffer(gpu.stream, dtype=np.int64)[keep],
        "grid": _strings(gpu.grid, keep, kind == GPU_KERNEL),
        "block": _strings(gpu.block, keep, kind == GPU_KERNEL),
        "registers_per_thread": ints(gpu.registers),
        "shared_memory_bytes": ints(gpu.shared_memory),
        "bytes": ints(gpu.bytes),
        "copy_kind": _strings(gpu.copy_kind, keep, kind == GPU_MEMCPY),
    }
    return keep, iteration[keep], columns, api_row[keep]


def _strings(column: Any, keep: np.ndarray, valid: np.ndarray) -> pa.DictionaryArray:
    codes = np.frombuffer(column.codes, dtype=np.int32)[keep].astype(np.int64)
    return dictionary_column(np.where(valid, codes, -1), column.values)


@functools.lru_cache(maxsize=1)
def _cxa_demangle() -> Any:
    path = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        function = ctypes.CDLL(path).__cxa_demangle
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int),
    ]
    return function


@functools.lru_cache(maxsize=8192)
def demangle(name: str) -> str:
    """The C++ name of a kernel (``_Z...`` -> ``void at::native::foo<float>(...)``); names that are
    not mangled, or cannot be, come back unchanged."""
    function = _cxa_demangle()
    if function is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int()
    pointer = function(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not pointer:
        return name
    try:
        return ctypes.string_at(pointer).decode(errors="replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(pointer))
