"""The summary ``xsp run`` prints: step latency per level set, overhead against the shallowest
run, spans per iteration, the slowest layers, and where the measurement's time went."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay.m_interval import MInterval, Position, m_interval, process_steps
from xsp.analysis.tables.layers import FRAMEWORK_RUN
from xsp.core.columns import arrow, rows_table
from xsp.core.store import Manifest, ManifestRun

__all__ = [
    "PHASE_GROUPS",
    "Overhead",
    "level_sets",
    "overhead_verdict",
    "own_time_line",
    "time_by_phase",
    "time_line",
    "top_layers",
]

#: The phases of a level-set process as the manifest's runs record them (``seconds``:
#: ``xsp.tracer.run.manifest.phase_seconds``), grouped under the names the time line gives them.
PHASE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("start-up", ("start_up",)),
    ("warm-up", ("untraced_warm_up",)),
    ("waiting", ("waiting_for_previous",)),
    ("F's calibration", ("calibration",)),
    ("levels on", ("switch_on",)),
    ("traced", ("traced_iterations",)),
    ("finish", ("stop", "drain", "convert", "store")),
    ("exit", ("exit",)),
)


def level_sets(store: MeasurementStore) -> pa.Table:
    """One row per level-set run: columns levels, status, iterations, step_median_ms,
    step_min_ms, step_max_ms, spans_per_iteration, overhead_x (median against the first run) and
    overhead_verdict. The step figures are the complete iterations': one that failed or that
    the session closed inside (its status message says which) is left out of them.

    Where M ran in several processes (``xsp.analysis.replay.m_interval``), M's row is all of them (its
    median the pooled one, its iterations and extremes every process's), the ratios are against
    that median, and a verdict places a run's median against M's 95% interval: "noise" inside
    it, "added" above it, "below M" under it. Otherwise the verdict is
    ``overhead_verdict`` on the mean steps' difference."""
    stats = store.sql(
        """
        SELECT levels, run_index,
               count(DISTINCT trace_id) FILTER (WHERE complete) AS iterations,
               median(dur_ns) FILTER (WHERE complete) / 1e6 AS step_median_ms,
               min(dur_ns) FILTER (WHERE complete) / 1e6 AS step_min_ms,
               max(dur_ns) FILTER (WHERE complete) / 1e6 AS step_max_ms,
               avg(dur_ns) FILTER (WHERE complete) / 1e6 AS step_mean_ms,
               stddev_samp(dur_ns) FILTER (WHERE complete) / 1e6
                   / sqrt(count(*) FILTER (WHERE complete)) AS step_stderr_ms,
               count(*) / greatest(count(DISTINCT trace_id) FILTER (WHERE kind = 'step'), 1)
                   AS spans_per_iteration
        FROM (SELECT *, kind = 'step' AND status_message IS NULL AS complete FROM spans)
        GROUP BY levels, run_index ORDER BY run_index
        """
    ).to_pylist()
    by_levels = {row["levels"]: row for row in stats}
    interval = m_interval(store) if stats and stats[0]["levels"] == "M" else None
    if interval is not None and not interval.single:
        stats[0].update(_over_processes(store, interval))
    else:
        interval = None
    base = stats[0]["step_median_ms"] if stats else None
    first = stats[0] if stats else {}
    rows = []
    for run in store.runs:
        row = by_levels.get(run.levels, {})
        median = row.get("step_median_ms")
        verdict = None
        if row and row is not first:
            verdict = _placed(interval, median) if interval else _verdict(first, row)
        rows.append(
            {
                "levels": run.levels,
                "status": run.document.status,
                "iterations": row.get("iterations", 0),
                "step_median_ms": median,
                "step_min_ms": row.get("step_min_ms"),
                "step_max_ms": row.get("step_max_ms"),
                "spans_per_iteration": row.get("spans_per_iteration", 0),
                "overhead_x": (median / base) if (median and base) else None,
                "overhead_verdict": verdict,
            }
        )
    return rows_table(rows, _LEVEL_SETS)


def _over_processes(store: MeasurementStore, interval: MInterval) -> dict[str, Any]:
    """M's row over every process it ran in: the pooled median, every steady step counted."""
    every = np.concatenate(process_steps(store))
    return {
        "iterations": interval.iterations,
        "step_median_ms": interval.median_ms,
        "step_min_ms": float(every.min()),
        "step_max_ms": float(every.max()),
    }


class Overhead(StrEnum):
    """A deeper run's step against M's (a ``str``: tables, JSON and the summary hold the word)."""

    NOISE = "noise"  # within the spread: not overhead
    ADDED = "added"
    FASTER = "faster"  # faster beyond the spread of one process each
    BELOW_M = "below M"  # below M's interval across processes


#: A run's median step against M's interval, by where it lies.
_PLACED = {
    Position.INSIDE: Overhead.NOISE,
    Position.ABOVE: Overhead.ADDED,
    Position.BELOW: Overhead.BELOW_M,
}


def _placed(interval: MInterval, median: float | None) -> Overhead | None:
    """A run's median step against M's interval: noise inside, added above, below M under."""
    if median is None:
        return None
    return _PLACED[interval.position(median)]


#: level_sets' columns (``rows_table``: ``from_pylist`` would import pandas, a third of
#: ``xsp summary``'s time, to ask whether the rows are a data frame).
_LEVEL_SETS = pa.schema(
    [
        ("levels", pa.string()),
        ("status", pa.string()),
        ("iterations", pa.int64()),
        ("step_median_ms", pa.float64()),
        ("step_min_ms", pa.float64()),
        ("step_max_ms", pa.float64()),
        ("spans_per_iteration", pa.float64()),
        ("overhead_x", pa.float64()),
        ("overhead_verdict", pa.string()),
    ]
)


def top_layers(store: MeasurementStore, limit: int = 5) -> pa.Table:
    """The leaf layers with the largest mean forward time in the shallowest run that has them
    (MF: the least overhead on layers): columns module_path, module_type, calls_per_iteration,
    mean_ms, share_pct (of that run's step time)."""
    return store.sql(
        f"""
        WITH run AS (SELECT {FRAMEWORK_RUN} AS r),
        mods AS (
            SELECT s.* FROM spans s, run WHERE s.run_index = run.r AND s.kind = 'module'
              AND s.phase = 'forward' AND s.module_path <> ''
        ),
        leaves AS (
            SELECT m.* FROM mods m
            WHERE NOT EXISTS (SELECT 1 FROM mods c WHERE c.parent_span_id = m.span_id
                                AND c.iteration = m.iteration)
        ),
        steps AS (SELECT sum(dur_ns) AS total, count(*) AS n FROM spans, run
                  WHERE run_index = run.r AND kind = 'step'
                    -- a sampled service run: the iterations level F recorded
                    AND iteration IN (SELECT DISTINCT iteration FROM mods))
        SELECT module_path, any_value(module_type) AS module_type,
               count(*) / any_value(steps.n) AS calls_per_iteration,
               sum(dur_ns) / count(*) / 1e6 AS mean_ms,
               100.0 * sum(dur_ns) / any_value(steps.total) AS share_pct
        FROM leaves, steps GROUP BY module_path ORDER BY share_pct DESC LIMIT ?
        """,
        [limit],
    )


def _verdict(first: dict, row: dict) -> Overhead | None:
    """A run's mean step against the first run's (``overhead_verdict``)."""

    if first.get("step_mean_ms") is None or row.get("step_mean_ms") is None:
        return None
    spread = (first.get("step_stderr_ms") or 0.0) ** 2 + (row.get("step_stderr_ms") or 0.0) ** 2
    return overhead_verdict(row["step_mean_ms"] - first["step_mean_ms"], spread**0.5)


def time_by_phase(manifest: Manifest) -> pa.Table:
    """Where a leveled measurement's processes spent their time, summed over its level sets:
    one row per phase group of ``PHASE_GROUPS`` that some run recorded, in the order they come,
    with columns phase, seconds and share_pct (of all the processes' seconds). Runs without
    phase seconds (a manifest older than them) add nothing."""
    runs = [r.seconds or {} for r in manifest.runs or ()]
    total = sum(float(r.get("total") or 0.0) for r in runs)
    phases, seconds = [], []
    for group, names in PHASE_GROUPS:
        if any(name in r for r in runs for name in names):
            phases.append(group)
            seconds.append(sum(float(r.get(name) or 0.0) for r in runs for name in names))
    values = np.array(seconds, dtype=np.float64)
    share = 100.0 * values / total if total > 0 else np.zeros(len(values))
    return pa.Table.from_arrays(
        [arrow(phases, pa.string()), arrow(values), arrow(share)],
        names=["phase", "seconds", "share_pct"],
    )


def time_line(manifest: Manifest) -> str | None:
    """The one line on where a leveled measurement's time went, for example ``time: 33.4 s in
    all; 3 level-set processes 32.7 s: start-up 25.0 s (77%), warm-up 2.2 s (7%), ...`` (``3
    level sets in 2 processes`` where one ran after another in its process); the whole is
    given where the manifest has the measurement's end (``finished_ns``). None when its runs
    recorded no phases."""
    table = time_by_phase(manifest)
    if not table.num_rows:
        return None
    runs = [r for r in manifest.runs or () if r.seconds]
    processes = sum(float((r.seconds or {}).get("total") or 0.0) for r in runs)
    count = f"{_count(len(runs), 'level-set process')} {processes:.1f} s"
    shared = sum(1 for r in runs if r.in_process_of)
    if shared:  # a level set run after another in its process (xsp.tracer.run.runner)
        held = _count(len(runs) - shared, "process")
        count = f"{len(runs)} level sets in {held} {processes:.1f} s"
    start, end = manifest.created_ns, manifest.finished_ns
    whole = ""
    if isinstance(start, int) and isinstance(end, int) and end > start:
        whole = f"{(end - start) / 1e9:.1f} s in all; "
    parts = [
        f"{phase} {seconds:.1f} s ({share:.0f}%)"
        for phase, seconds, share in zip(
            table.column("phase").to_pylist(),
            table.column("seconds").to_pylist(),
            table.column("share_pct").to_pylist(),
            strict=True,
        )
    ]
    found = [_process_seconds(e) for e in manifest.m_processes or ()]
    again = [seconds for seconds in found if seconds is not None]
    more = f"; M again in {_count(len(again), 'process')} {sum(again):.1f} s" if again else ""
    return f"time: {whole}{count}: {', '.join(parts)}{more}"


def _process_seconds(entry: ManifestRun) -> float | None:
    """A further M process's seconds: its phases' total (a store of the first design: the
    seconds its own measurement took, a number the typed entry keeps aside)."""
    seconds = entry.seconds.get("total") if entry.seconds else entry.extra.get("seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else None


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun`` in the number ``n`` asks for (a noun ending in "s" takes "es")."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def own_time_line(manifest: Manifest) -> str | None:
    """The seconds ``xsp run``'s own process spent outside the measurement, for example
    ``xsp run itself: 0.3 s before the level sets (start-up, checks), 0.5 s after (summary)``;
    None where the manifest has no record of them (a campaign's job, an older store)."""
    own = manifest.runner_s
    if own is None:
        return None
    before, after = own.get("before"), own.get("after")
    if not isinstance(before, (int, float)) or not isinstance(after, (int, float)):
        return None
    return (
        f"xsp run itself: {before:.1f} s before the level sets (start-up, checks), "
        f"{after:.1f} s after them (summary)"
    )


def overhead_verdict(mean: float, stderr: float) -> Overhead:
    """ "noise" within twice the standard error of zero (run-to-run spread, not overhead);
    "added" above it; "faster" below it: the deeper run was faster beyond its spread, which
    one process each cannot explain (the host's speed differs between processes by up to ±25%
    on the lent GPU hosts: ``xsp.analysis.replay.m_interval`` measures M across several)."""
    if abs(mean) <= 2 * stderr:
        return Overhead.NOISE
    return Overhead.ADDED if mean > 0 else Overhead.FASTER
