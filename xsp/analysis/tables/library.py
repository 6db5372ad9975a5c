"""Library-level analysis: cuBLAS/cuDNN calls on CUDA, oneDNN primitives on CPU."""

from __future__ import annotations

import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore

__all__ = ["library_calls"]

_LIB_RUN = "(SELECT max(run_index) FROM spans WHERE kind = 'library_call')"


def library_calls(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """library, call, calls_per_iteration, ms_per_iteration, mean_us, top_layer (by time), from
    the deepest run with library calls; nested calls (cuDNN's own cuBLASLt GEMMs) count too."""
    return store.sql(
        f"""
        WITH c AS (SELECT * FROM spans WHERE run_index = {_LIB_RUN} AND kind = 'library_call'),
        n AS (SELECT greatest(count(DISTINCT (iteration, rank)), 1) AS it FROM spans
              WHERE run_index = {_LIB_RUN} AND kind = 'step'),
        per AS (SELECT library, name, module_path, count(*) AS calls, sum(dur_ns) AS ns
                FROM c GROUP BY ALL)
        SELECT library, name AS call, sum(calls) / any_value(n.it) AS calls_per_iteration,
               sum(ns) / any_value(n.it) / 1e6 AS ms_per_iteration,
               sum(ns) / sum(calls) / 1e3 AS mean_us, arg_max(module_path, ns) AS top_layer
        FROM per, n GROUP BY library, name ORDER BY ms_per_iteration DESC LIMIT ?
        """,
        [limit],
    )
