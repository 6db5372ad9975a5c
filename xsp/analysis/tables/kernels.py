"""GPU analyses: kernels by name (XSP's A10) and the temporal breakdown of HTA (GPU busy
against idle per iteration). Pure functions from a measurement store to tables.

HTA's breakdowns (``temporal_breakdown``, ``idle_breakdown``, ``launch_statistics``) read the
deepest run with level G as traced, or, given ``timeline``, a spans table of one timeline: the
replayed, untraced step of the reconstruction (``xsp.analysis.reconstruction``), which is what
the report shows by default. One query serves both: the timeline is read as a run of its own."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore, arrow_of
from xsp.analysis.tables.layers import FRAMEWORK_RUN

__all__ = [
    "gpu_time_per_layer",
    "idle_breakdown",
    "kernel_duration_distribution",
    "kernels_by_layer",
    "kernels_by_name",
    "launch_statistics",
    "temporal_breakdown",
    "union_length",
]

_GPU_RUN = "(SELECT max(run_index) FROM spans WHERE level = 'gpu')"


def _sql(store: MeasurementStore, timeline: pa.Table | None, query: str) -> pa.Table:
    """``query`` over the store's spans, or over ``timeline`` as the only run (index 0)."""
    if timeline is None:
        return store.sql(query)
    spans = timeline.append_column("run_index", pa.array(np.zeros(timeline.num_rows, np.int64)))
    con = duckdb.connect()
    con.register("spans", spans)
    return arrow_of(con.sql(query))


def kernels_by_name(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """A10: kernel, calls_per_iteration, total_ms_per_iteration, mean_us, share_pct (of kernel
    time), from the deepest run with level G."""
    return store.sql(
        f"""
        WITH k AS (SELECT * FROM spans WHERE run_index = {_GPU_RUN} AND kind = 'kernel'),
        n AS (SELECT count(DISTINCT (iteration, rank)) AS iterations FROM k)
        SELECT name AS kernel, count(*) / any_value(n.iterations) AS calls_per_iteration,
               sum(dur_ns) / any_value(n.iterations) / 1e6 AS total_ms_per_iteration,
               avg(dur_ns) / 1e3 AS mean_us,
               100.0 * sum(dur_ns) / (SELECT sum(dur_ns) FROM k) AS share_pct
        FROM k, n GROUP BY name ORDER BY share_pct DESC LIMIT ?
        """,
        [limit],
    )


def temporal_breakdown(store: MeasurementStore, timeline: pa.Table | None = None) -> pa.Table:
    """Per iteration of the deepest run with level G (or of ``timeline``): step_ms, gpu_busy_ms
    (the union of kernel, memcpy and memset intervals on any stream), gpu_idle_ms, busy_pct.
    Overlapping activities count once, so busy time never exceeds the step."""
    steps = _sql(
        store,
        timeline,
        f"SELECT iteration, start_ns, dur_ns FROM spans WHERE run_index = {_GPU_RUN} "
        "AND kind = 'step' ORDER BY iteration",
    ).to_pydict()
    work = _sql(
        store,
        timeline,
        f"SELECT iteration, start_ns, start_ns + dur_ns AS end_ns FROM spans "
        f"WHERE run_index = {_GPU_RUN} AND level = 'gpu' ORDER BY iteration, start_ns",
    ).to_pydict()
    iterations = np.asarray(work["iteration"], dtype=np.int64)
    starts = np.asarray(work["start_ns"], dtype=np.int64)
    ends = np.asarray(work["end_ns"], dtype=np.int64)
    rows = []
    for iteration, step_start, step_dur in zip(
        steps["iteration"], steps["start_ns"], steps["dur_ns"], strict=True
    ):
        mask = iterations == iteration
        busy = union_length(
            np.clip(starts[mask], step_start, step_start + step_dur),
            np.clip(ends[mask], step_start, step_start + step_dur),
        )
        rows.append(
            {
                "iteration": iteration,
                "step_ms": step_dur / 1e6,
                "gpu_busy_ms": busy / 1e6,
                "gpu_idle_ms": (step_dur - busy) / 1e6,
                "busy_pct": 100.0 * busy / step_dur if step_dur else 0.0,
            }
        )
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("iteration", pa.int64()),
                ("step_ms", pa.float64()),
                ("gpu_busy_ms", pa.float64()),
                ("gpu_idle_ms", pa.float64()),
                ("busy_pct", pa.float64()),
            ]
        ),
    )


def union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by intervals (sorted by start or not)."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new covered segment starts where an interval begins after everything before it ended.
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    segment = np.cumsum(new) - 1
    seg_start = s[new]
    seg_end = np.zeros(segment[-1] + 1, dtype=np.int64)
    np.maximum.at(seg_end, segment, e)
    return int((seg_end - seg_start).sum())


def kernels_by_layer(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """A11: layer, kernels_per_iteration, kernel_ms_per_iteration, distinct_kernels, top_kernel
    (by time), from the deepest run with level G. Kernels inherit their layer from the op that
    launched them; backward kernels count for the layer whose gradient they compute."""
    return store.sql(
        f"""
        WITH k AS (SELECT * FROM spans WHERE run_index = {_GPU_RUN} AND kind = 'kernel'
                   AND module_path IS NOT NULL),
        n AS (SELECT greatest(count(DISTINCT (iteration, rank)), 1) AS iterations
              FROM spans WHERE run_index = {_GPU_RUN} AND kind = 'step'),
        per AS (SELECT module_path, name, count(*) AS calls, sum(dur_ns) AS ns
                FROM k GROUP BY ALL)
        SELECT module_path AS layer, sum(calls) / any_value(n.iterations) AS kernels_per_iteration,
               sum(ns) / any_value(n.iterations) / 1e6 AS kernel_ms_per_iteration,
               count(*) AS distinct_kernels, arg_max(name, ns) AS top_kernel
        FROM per, n GROUP BY module_path ORDER BY kernel_ms_per_iteration DESC LIMIT ?
        """,
        [limit],
    )


def gpu_time_per_layer(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """A13: per leaf layer (forward), its latency from the shallowest run with level F (the
    least overhead on it: MF, not MFLG) and the kernel time it launched from the GPU run: layer,
    type, latency_ms, gpu_ms, non_gpu_ms, gpu_pct."""
    return store.sql(
        f"""
        WITH fw AS (SELECT {FRAMEWORK_RUN} AS r),
        n AS (SELECT greatest(count(DISTINCT (iteration, rank)), 1) AS it FROM spans
              WHERE run_index = (SELECT r FROM fw) AND kind = 'step'),
        ng AS (SELECT greatest(count(DISTINCT (iteration, rank)), 1) AS it FROM spans
               WHERE run_index = {_GPU_RUN} AND kind = 'step'),
        lat AS (SELECT module_path, any_value(module_type) AS type,
                       sum(dur_ns) / any_value(n.it) / 1e6 AS latency_ms
                FROM spans, n WHERE run_index = (SELECT r FROM fw) AND kind = 'module'
                AND phase = 'forward' GROUP BY module_path),
        gpu AS (SELECT module_path, sum(dur_ns) / any_value(ng.it) / 1e6 AS gpu_ms
                FROM spans, ng WHERE run_index = {_GPU_RUN} AND kind = 'kernel'
                AND phase = 'forward' GROUP BY module_path)
        SELECT lat.module_path AS layer, type, latency_ms, coalesce(gpu_ms, 0) AS gpu_ms,
               greatest(latency_ms - coalesce(gpu_ms, 0), 0) AS non_gpu_ms,
               100.0 * least(coalesce(gpu_ms, 0) / nullif(latency_ms, 0), 1) AS gpu_pct
        FROM lat LEFT JOIN gpu USING (module_path)
        WHERE lat.module_path <> '' AND {_GPU_RUN} IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM lat AS inner_layer
            WHERE inner_layer.module_path LIKE lat.module_path || '.%')
        ORDER BY latency_ms DESC LIMIT ?
        """,
        [limit],
    )


def launch_statistics(store: MeasurementStore, timeline: pa.Table | None = None) -> pa.Table:
    """HTA's kernel launch statistics: per kernel, its launch call's duration against its own,
    and the launch delay (kernel start minus launch start). One row: kernels (over all the
    run's iterations), iterations, kernels_per_iteration, launch_longer_than_kernel_pct,
    median_launch_us, median_kernel_us, median_delay_us, p90_delay_us."""
    return _sql(
        store,
        timeline,
        f"""
        WITH k AS (SELECT k.dur_ns AS kernel_ns, a.dur_ns AS launch_ns,
                          k.start_ns - a.start_ns AS delay_ns, k.iteration
                   FROM spans k JOIN spans a ON a.span_id = k.parent_span_id
                        AND a.run_index = k.run_index
                   WHERE k.run_index = {_GPU_RUN} AND k.kind = 'kernel'
                   AND a.kind IN ('runtime', 'driver'))
        SELECT count(*) AS kernels, count(DISTINCT iteration) AS iterations,
               count(*) / greatest(count(DISTINCT iteration), 1) AS kernels_per_iteration,
               100.0 * avg(CASE WHEN launch_ns > kernel_ns THEN 1 ELSE 0 END)
                   AS launch_longer_than_kernel_pct,
               median(launch_ns) / 1e3 AS median_launch_us,
               median(kernel_ns) / 1e3 AS median_kernel_us,
               median(delay_ns) / 1e3 AS median_delay_us,
               quantile_cont(delay_ns, 0.9) / 1e3 AS p90_delay_us
        FROM k HAVING count(*) > 0
        """,
    )


def kernel_duration_distribution(store: MeasurementStore) -> pa.Table:
    """HTA's kernel duration distribution: bucket (by duration), kernels, share_of_kernels_pct,
    share_of_time_pct."""
    return store.sql(
        f"""
        WITH k AS (SELECT dur_ns FROM spans WHERE run_index = {_GPU_RUN} AND kind = 'kernel'),
        b AS (SELECT CASE WHEN dur_ns < 5e3 THEN '1: < 5 us'
                          WHEN dur_ns < 10e3 THEN '2: 5-10 us'
                          WHEN dur_ns < 50e3 THEN '3: 10-50 us'
                          WHEN dur_ns < 100e3 THEN '4: 50-100 us'
                          WHEN dur_ns < 1e6 THEN '5: 0.1-1 ms'
                          ELSE '6: >= 1 ms' END AS bucket, dur_ns FROM k)
        SELECT bucket, count(*) AS kernels,
               100.0 * count(*) / (SELECT count(*) FROM k) AS share_of_kernels_pct,
               100.0 * sum(dur_ns) / (SELECT sum(dur_ns) FROM k) AS share_of_time_pct
        FROM b GROUP BY bucket ORDER BY bucket
        """
    )


def idle_breakdown(store: MeasurementStore, timeline: pa.Table | None = None) -> pa.Table:
    """HTA's idle-time breakdown, per iteration: each gap between consecutive kernels of a
    stream is host wait when the next kernel's launch call started after the previous kernel
    ended (the GPU waited for the CPU), else kernel wait (launch latency and queueing).
    Columns: iteration, idle_ms, host_wait_ms, kernel_wait_ms, host_wait_pct."""
    rows = _sql(
        store,
        timeline,
        f"""
        SELECT k.iteration, k.gpu_stream, k.start_ns, k.start_ns + k.dur_ns AS end_ns,
               coalesce(a.start_ns, k.start_ns) AS launch_ns
        FROM spans k LEFT JOIN spans a ON a.span_id = k.parent_span_id
             AND a.run_index = k.run_index
        WHERE k.run_index = {_GPU_RUN} AND k.level = 'gpu'
        ORDER BY k.iteration, k.gpu_stream, k.start_ns
        """,
    ).to_pydict()
    it = np.asarray(rows["iteration"], dtype=np.int64)
    stream = np.asarray(rows["gpu_stream"], dtype=np.int64)
    start = np.asarray(rows["start_ns"], dtype=np.int64)
    end = np.asarray(rows["end_ns"], dtype=np.int64)
    launch = np.asarray(rows["launch_ns"], dtype=np.int64)
    same = np.zeros(len(it), dtype=bool)
    same[1:] = (it[1:] == it[:-1]) & (stream[1:] == stream[:-1])
    gap = np.where(same, np.maximum(start - np.roll(end, 1), 0), 0)
    host = same & (launch > np.roll(end, 1))
    out = []
    for iteration in np.unique(it):
        mask = it == iteration
        idle, host_ns = gap[mask].sum(), gap[mask & host].sum()
        out.append(
            {
                "iteration": int(iteration),
                "idle_ms": idle / 1e6,
                "host_wait_ms": host_ns / 1e6,
                "kernel_wait_ms": (idle - host_ns) / 1e6,
                "host_wait_pct": 100.0 * host_ns / idle if idle else 0.0,
            }
        )
    return pa.Table.from_pylist(out)
