"""GPU analyses: kernels by name (XSP's A10) and the temporal breakdown of HTA (GPU busy
against idle per iteration). Pure functions from a measurement store to tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from analysis.store import MeasurementStore

_GPU_RUN = "(SELECT max(run_index) FROM spans WHERE level = 'gpu')"


def kernels_by_name(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """A10: kernel, calls_per_iteration, total_ms_per_iteration, mean_us, share_pct (of kernel
    time), from the deepest run with level G."""
    return store.sql(
        f"""
        WITH k AS (SELECT * FROM spans WHERE run_index = {_GPU_RUN} AND kind = 'kernel'),
        n AS (SELECT count(DISTINCT iteration) AS iterations FROM k)
        SELECT name AS kernel, count(*) / any_value(n.iterations) AS calls_per_iteration,
               sum(dur_ns) / any_value(n.iterations) / 1e6 AS total_ms_per_iteration,
               avg(dur_ns) / 1e3 AS mean_us,
               100.0 * sum(dur_ns) / (SELECT sum(dur_ns) FROM k) AS share_pct
        FROM k, n GROUP BY name ORDER BY share_pct DESC LIMIT ?
        """,
        [limit],
    )


def temporal_breakdown(store: MeasurementStore) -> pa.Table:
    """Per iteration of the deepest run with level G: step_ms, gpu_busy_ms (the union of kernel,
    memcpy and memset intervals on any stream), gpu_idle_ms, busy_pct. Overlapping activities
    count once, so busy time never exceeds the step."""
    steps = store.sql(
        f"SELECT iteration, start_ns, dur_ns FROM spans WHERE run_index = {_GPU_RUN} "
        "AND kind = 'step' ORDER BY iteration"
    ).to_pydict()
    work = store.sql(
        f"SELECT iteration, start_ns, start_ns + dur_ns AS end_ns FROM spans "
        f"WHERE run_index = {_GPU_RUN} AND level = 'gpu' ORDER BY iteration, start_ns"
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
