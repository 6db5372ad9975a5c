"""CUDA records (levels L and G) -> span blocks, hung under the framework level.

Hierarchy, from ids where the records carry them:
1. a kernel, memcpy or memset hangs under the API call that launched it (CUPTI correlation id);
2. an API call hangs under the innermost aten op that was running on its thread. CUPTI names OS
   threads and the profiler its own thread numbers, so each OS thread is matched to the profiler
   thread whose ops contain most of its calls; within a thread, nesting is exact (``nest``).
Rows that reach no op hang under the model span of the iteration they fall in (time); rows outside
every iteration (xsp's own synchronizations) are counted and left out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import numpy as np
import pyarrow as pa

from tracer import schema
from tracer.convert import dictionary_column
from tracer.intervals import nest
from tracer.records import API_RUNTIME, GPU_KERNEL, GPU_MEMCPY, ApiRecords, GpuRecords, StepRecords


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
    best matches the call's OS thread, or -1."""
    parent = np.full(len(call_start), -1, dtype=np.int64)
    for os_thread in np.unique(call_thread):
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


def _lookup_sorted(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[i] where keys[i] == query (first match), -1 where no key matches."""
    if len(keys) == 0:
        return np.full(len(queries), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    slot = np.clip(np.searchsorted(keys[order], queries), 0, len(order) - 1)
    found = keys[order][slot] == queries
    return np.where(found, values[order][slot], -1)


def by_external_correlation(api: ApiRecords, op_correlation: np.ndarray) -> np.ndarray:
    """Op row of each API call through the profiler's external correlation ids, -1 if none."""
    correlation = np.frombuffer(api.correlation, dtype=np.int64)
    external = _lookup_sorted(
        np.frombuffer(api.external_correlation, dtype=np.int64),
        np.frombuffer(api.external_id, dtype=np.int64),
        correlation,
    )
    rows = np.arange(len(op_correlation), dtype=np.int64)
    valid = op_correlation > 0
    op_row = _lookup_sorted(op_correlation[valid], rows[valid], external)
    return np.where(external > 0, op_row, -1)


def api_columns(
    api: ApiRecords, steps: StepRecords, ops: dict[str, Any] | None
) -> tuple[np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
    """(rows kept, their iteration, their columns, their op row or -1) for the API calls."""
    start = np.frombuffer(api.start_ns, dtype=np.int64)
    end = np.frombuffer(api.end_ns, dtype=np.int64)
    thread = np.frombuffer(api.thread, dtype=np.int64)
    op_row = np.full(len(start), -1, dtype=np.int64)
    iteration = _step_iteration(steps, start)
    if ops is not None and len(ops["start_ns"]):
        op_row = by_external_correlation(api, ops["profiler_correlation"])
        loose = np.nonzero(op_row < 0)[0]
        if len(loose):  # no external correlation record: fall back on containment
            op_start = np.asarray(ops["start_ns"], dtype=np.int64)
            op_end = op_start + np.asarray(ops["dur_ns"], dtype=np.int64)
            op_row[loose] = match_threads(
                thread[loose],
                start[loose],
                end[loose],
                np.asarray(ops["thread_id"]),
                op_start,
                op_end,
            )
        iteration = np.where(op_row >= 0, ops["iteration"][np.maximum(op_row, 0)], iteration)
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
    }
    return keep, iteration[keep], columns, op_row[keep]


def gpu_columns(
    gpu: GpuRecords, steps: StepRecords, api_correlation: np.ndarray, api_iteration: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
    """(rows kept, their iteration, their columns, their API row or -1) for GPU activities."""
    start = np.frombuffer(gpu.start_ns, dtype=np.int64)
    correlation = np.frombuffer(gpu.correlation, dtype=np.int64)
    api_row = _lookup_sorted(api_correlation, np.arange(len(api_correlation)), correlation)
    iteration = _step_iteration(steps, start)
    if len(api_iteration):
        iteration = np.where(api_row >= 0, api_iteration[np.maximum(api_row, 0)], iteration)
    keep = np.nonzero(iteration >= 0)[0]
    kind = np.frombuffer(gpu.kind, dtype=np.int8)[keep]
    names = [demangle(n) for n in gpu.name.values]
    end = np.frombuffer(gpu.end_ns, dtype=np.int64)[keep]

    def ints(values: Any) -> pa.Array:
        data = np.frombuffer(values, dtype=np.int64)[keep]
        return pa.array(data, pa.int64(), mask=data < 0)

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
