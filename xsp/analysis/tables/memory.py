"""Memory per layer (XSP's A4) and per layer type (A7), from level F's allocator events.

Each event (an allocation or a free, with the allocator's total after it) hangs under the span
that ran on its thread when it happened, so a layer's figures include its forward ops and, for
training, the backward nodes attributed to it. Figures are per measured iteration; ``peak`` is the
most the allocator held while the layer ran (over the whole run). On CUDA the caching allocator
reports tensor allocations, not cudaMalloc calls; on CPU, the CPU allocator's.
"""

from __future__ import annotations

import pyarrow as pa

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore
from xsp.core.columns import arrow

__all__ = ["MEMORY_EVENTS", "layer_memory", "layer_type_memory", "memory_run"]

# made with ``arrow``: pa.table of Python values imports pandas (0.15 s of every analyze)
_EMPTY = pa.Table.from_arrays([arrow([], pa.string())], names=["layer"])


def memory_run(store: MeasurementStore) -> tuple[str, pa.Table] | None:
    """(levels, events) of the run with the fewest levels that recorded allocator events (its
    allocations are those of the least instrumented F run); read once per store (five analyses
    ask, and a 1M-span measurement's events took 0.1 s a read)."""
    return MEMORY_EVENTS.of(store)


def _memory_run(store: MeasurementStore) -> tuple[str, pa.Table] | None:
    for run in sorted(store.runs, key=lambda r: len(r.levels)):
        events = run.memory()
        if events is not None and events.num_rows:
            return run.levels, events
    return None


def _query(store: MeasurementStore, group: str, label: str) -> pa.Table:
    found = memory_run(store)
    if found is None:
        return _EMPTY
    levels, _ = found  # its events: the SQL table memory_events
    return store.sql(
        f"""WITH per_group AS (
              SELECT {group} AS {label}, device,
                     sum(CASE WHEN bytes > 0 THEN 1 ELSE 0 END) AS allocations,
                     sum(CASE WHEN bytes > 0 THEN bytes ELSE 0 END) AS allocated,
                     -sum(CASE WHEN bytes < 0 THEN bytes ELSE 0 END) AS freed,
                     max(total_allocated) AS peak_allocated_bytes,
                     count(DISTINCT iteration) AS iterations
              FROM memory_events WHERE {group} IS NOT NULL GROUP BY {group}, device)
            SELECT {label}, device,
                   allocations / greatest(iterations, 1) AS allocations_per_iteration,
                   allocated / greatest(iterations, 1) AS allocated_bytes_per_iteration,
                   freed / greatest(iterations, 1) AS freed_bytes_per_iteration,
                   (allocated - freed) / greatest(iterations, 1) AS net_bytes_per_iteration,
                   peak_allocated_bytes, '{levels}' AS levels
            FROM per_group ORDER BY allocated_bytes_per_iteration DESC, {label}, device"""
    )


def layer_memory(store: MeasurementStore) -> pa.Table:
    """A4: per layer (module path) and device, what it allocates and frees per iteration, and the
    most that device's allocator held while it ran (a CUDA layer's small host tensors are a row
    of their own)."""
    table = _query(store, "module_path", "layer")
    if table.num_rows and "layer" in table.column_names:
        store.con.register("layer_memory_rows", table)
        found = memory_run(store)
        assert found is not None
        types = store.sql(
            "SELECT module_path AS layer, any_value(module_type) AS layer_type "
            "FROM memory_events GROUP BY module_path"
        )
        store.con.register("layer_types", types)
        table = store.sql(
            "SELECT m.layer, t.layer_type, m.* EXCLUDE (layer) FROM layer_memory_rows m "
            "LEFT JOIN layer_types t USING (layer) "
            "ORDER BY m.allocated_bytes_per_iteration DESC, m.layer, m.device"
        )
    return table


def layer_type_memory(store: MeasurementStore) -> pa.Table:
    """A7: the same per layer type (Conv2d, BatchNorm2d, ...), over every layer of the type."""
    return _query(store, "module_type", "layer_type")


def _events(found: tuple[str, pa.Table] | None) -> pa.Table | None:
    return found[1] if found is not None else None


#: The allocator events of the least instrumented run with them, and its levels
#: (``memory_run``); SQL reads the events as ``memory_events``.
MEMORY_EVENTS = Derived("memory_events", _memory_run, view=_events)
