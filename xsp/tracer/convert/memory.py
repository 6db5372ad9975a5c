"""Allocator events (level F) -> one row per event, each attributed to the innermost framework
span running on its thread when it happened: its op, layer and phase. Stored beside the spans
as ``memory.parquet``; the memory analyses (A4, A7) aggregate it per layer and layer type."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.columns import arrow, equals, numbers
from xsp.core.intervals import stab
from xsp.core.records import MemoryRecords

__all__ = ["DEVICE_TYPES", "memory_table"]

#: c10::DeviceType values of the devices xsp runs on.
DEVICE_TYPES = {0: "cpu", 1: "cuda"}


def memory_table(memory: MemoryRecords, spans: pa.Table) -> pa.Table | None:
    """The events of ``memory`` inside a framework span of ``spans``; None without events.
    Works on row numbers into ``spans``, never on a filtered copy of it: the finish's peak
    memory is here (a span table is some 250 bytes a row)."""
    time = np.frombuffer(memory.time_ns, dtype=np.int64)
    if not len(time):
        return None
    framework = np.nonzero(equals(spans["level"], schema.LEVEL_FRAMEWORK))[0]
    start = numbers(spans["start_ns"])[framework]
    end = start + numbers(spans["dur_ns"])[framework]
    thread = numbers(spans["thread_id"], null=-1)[framework]
    event_thread = np.frombuffer(memory.thread, dtype=np.int64)
    parent = stab(thread, start, end, event_thread, time)
    del start, end, thread
    inside = np.nonzero(parent >= 0)[0]
    rows = arrow(framework[parent[inside]])
    device_type = np.frombuffer(memory.device_type, dtype=np.int64)[inside]
    columns = {
        "time_ns": arrow(time[inside]),
        "thread_id": arrow(event_thread[inside]),
        "bytes": arrow(np.frombuffer(memory.bytes, dtype=np.int64)[inside]),
        "total_allocated": arrow(np.frombuffer(memory.total_allocated, dtype=np.int64)[inside]),
        "device": _device_names(device_type),
        "device_index": arrow(np.frombuffer(memory.device_index, dtype=np.int64)[inside]),
    }
    for name in ("iteration", "span_id", "module_path", "module_type", "phase", "op_name"):
        is_type = name == "module_type"  # a span's own is null but on module spans
        columns[name] = _layer_types(spans, rows) if is_type else spans[name].take(rows)
    return pa.Table.from_arrays(list(columns.values()), names=list(columns))


def _device_names(device_type: np.ndarray) -> pa.Array:
    kinds, codes = np.unique(device_type, return_inverse=True)
    names = arrow([DEVICE_TYPES.get(int(t), str(t)) for t in kinds], pa.string())
    return names.take(arrow(codes.astype(np.int64).ravel()))


def _layer_types(spans: pa.Table, rows: pa.Array) -> pa.Array:
    """The type of the layer of each span at ``rows``: module spans carry it, every other span
    takes its layer's (the module span with the same module path). Mapped per distinct path."""
    modules = arrow(np.nonzero(equals(spans["kind"], schema.KIND_MODULE))[0])
    paths = spans["module_path"].take(modules).cast(pa.string()).to_pylist()
    types = dict(
        zip(paths, spans["module_type"].take(modules).cast(pa.string()).to_pylist(), strict=True)
    )
    wanted = spans["module_path"].take(rows).combine_chunks()
    wanted = wanted.cast(pa.string()).dictionary_encode()  # one dictionary for every chunk
    values = arrow([types.get(p) for p in wanted.dictionary.to_pylist()], pa.string())
    return values.take(wanted.indices)
