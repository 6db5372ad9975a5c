"""Layer analyses (XSP's A2, A3, A5): pure functions from a measurement store to tables.

They read the forward module spans of the shallowest run that has level F (MF: the least
overhead on layers, as the leveled design takes each level from). Columns carry units.
In a multi-rank job, "per iteration" means per iteration of one rank (a rank's step), calls are
matched by their position in a rank's iteration, and the layer info is the lowest rank's.
"""

from __future__ import annotations

import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore

__all__ = ["FRAMEWORK_RUN", "layer_info", "layer_latency", "layer_types"]

#: The shallowest run with layers (module spans): the one every layer figure reads (MF).
FRAMEWORK_RUN = "(SELECT arg_min(run_index, length(levels)) FROM spans WHERE kind = 'module')"

#: The forward leaf-layer calls of the shallowest framework run, numbered in execution order.
_LEAVES = f"""
    WITH mods AS (
        SELECT * FROM spans
        WHERE run_index = {FRAMEWORK_RUN} AND kind = 'module' AND phase = 'forward'
    ),
    leaves AS (
        SELECT m.*, row_number() OVER (PARTITION BY m.iteration, m.rank ORDER BY m.start_ns)
               - 1 AS call_index
        FROM mods m
        WHERE NOT EXISTS (SELECT 1 FROM mods c WHERE c.parent_span_id = m.span_id
                          AND c.trace_id = m.trace_id)
    )"""


def layer_info(store: MeasurementStore) -> pa.Table:
    """A2: every layer call of the first measured iteration in execution order: call_index,
    module_path, module_type, input_shapes, output_shapes, params."""
    return store.sql(
        f"""
        SELECT row_number() OVER (ORDER BY start_ns) - 1 AS call_index, module_path, module_type,
               input_shapes, output_shapes, module_params AS params
        FROM spans
        WHERE run_index = {FRAMEWORK_RUN} AND kind = 'module' AND phase = 'forward'
          AND iteration = (SELECT min(iteration) FROM spans WHERE run_index = {FRAMEWORK_RUN})
          AND rank IS NOT DISTINCT FROM
              (SELECT min(rank) FROM spans WHERE run_index = {FRAMEWORK_RUN})
        ORDER BY start_ns
        """
    )


def layer_latency(store: MeasurementStore) -> pa.Table:
    """A3: forward latency of each leaf layer call, in execution order, across iterations:
    call_index, module_path, module_type, median_ms, min_ms, max_ms, iterations.

    Calls are matched across iterations by their position in the iteration (a layer called twice
    is two rows), never by name alone."""
    return store.sql(
        f"""{_LEAVES}
        SELECT call_index, any_value(module_path) AS module_path,
               any_value(module_type) AS module_type,
               median(dur_ns) / 1e6 AS median_ms, min(dur_ns) / 1e6 AS min_ms,
               max(dur_ns) / 1e6 AS max_ms, count(*) AS iterations
        FROM leaves GROUP BY call_index ORDER BY call_index
        """
    )


def layer_types(store: MeasurementStore) -> pa.Table:
    """A5: leaf layers by type: module_type, calls_per_iteration, latency_ms_per_iteration,
    share_pct (of the leaf layers' forward time)."""
    return store.sql(
        f"""{_LEAVES},
        n AS (SELECT count(DISTINCT (iteration, rank)) AS iterations FROM leaves)
        SELECT module_type, count(*) / any_value(n.iterations) AS calls_per_iteration,
               sum(dur_ns) / any_value(n.iterations) / 1e6 AS latency_ms_per_iteration,
               100.0 * sum(dur_ns) / (SELECT sum(dur_ns) FROM leaves) AS share_pct
        FROM leaves, n GROUP BY module_type ORDER BY share_pct DESC
        """
    )
