"""Where the untraced step goes: the replay's critical path by cause, and layers by their GPU time
(forward + backward) and their time on the critical path. Pure functions from a measurement
store to tables; figures are per steady iteration, shares are of the replayed step.

A layer's GPU time is the G run's durations of the activities its ops launched, forward and
backward (autograd attributes backward kernels to the forward module); its critical-path time is
what the replay's critical path charged to it: its kernels where the GPU held the path, its ops'
host work and launches where the host did.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore, text_codes
from xsp.analysis.replay import CAUSES, VERDICTS, Replay, replay
from xsp.core.columns import arrow, numbers, rows_table

__all__ = [
    "cause_share_range",
    "critical_by_layer",
    "has_gpu",
    "layer_split",
    "layer_times",
    "layer_types",
    "layers",
    "step_causes",
    "verdict",
]


def has_gpu(store: MeasurementStore) -> bool:
    """True when a run recorded GPU activities (level G)."""
    return any(run.level_set.gpu for run in store.runs)


def _steady_iterations(result: Replay) -> np.ndarray:
    steps = result.steps
    return numbers(steps.column("iteration"))[
        numbers(steps.column("steady")).astype(bool, copy=False)
    ]


def step_causes(store: MeasurementStore) -> pa.Table:
    """The replayed step's critical path by cause: cause, ms_per_iteration, share_pct."""
    result = replay(store)
    kept = _steady_iterations(result)
    path = result.path.filter(pc.is_in(result.path.column("iteration"), arrow(kept, pa.int64())))
    code, names = text_codes(path.column("cause"))  # not a str a row: 1.4M on 1M spans
    dur = numbers(path.column("dur_ns")).astype(np.float64, copy=False)
    total = float(dur.sum())
    n = max(len(kept), 1)
    spent = {
        name: float(dur[code == names.index(name)].sum()) if name in names else 0.0
        for name in CAUSES
    }
    rows = [
        {
            "cause": name,
            "ms_per_iteration": spent[name] / n / 1e6,
            "share_pct": 100.0 * spent[name] / total if total else 0.0,
        }
        for name in CAUSES
    ]
    return rows_table(rows, _CAUSES)


def critical_by_layer(store: MeasurementStore, iteration: int, rank: int = -1) -> dict[str, int]:
    """One step's time on the critical path (ns) by the layer (module path) charged, each
    layer's own (its sub-layers' apart); ``rank`` -1: every rank's."""
    result = replay(store)
    path = result.path.filter(pc.equal(result.path.column("iteration"), iteration))
    rows = path.column("row")
    if rank >= 0:
        ranks = numbers(result.spans.column("rank").take(rows), null=-1)
        path = path.filter(arrow(ranks == rank, pa.bool_()))
        rows = path.column("row")
    out: dict[str, int] = {}
    layers = result.spans.column("module_path").take(rows).cast(pa.string()).to_pylist()
    for layer, ns in zip(layers, path.column("dur_ns").to_pylist(), strict=True):
        if layer:
            out[layer] = out.get(layer, 0) + int(ns)
    return out


_CAUSES = pa.schema(
    [("cause", pa.string()), ("ms_per_iteration", pa.float64()), ("share_pct", pa.float64())]
)


def verdict(store: MeasurementStore) -> str:
    """One line: what bounds the step, with the causes' shares and how much the leading one
    moves across the steady iterations ("GPU-bound: 94% GPU compute (92-95% across 20
    iterations), ..."); "unchecked" ahead of it where the replay was not checked both ways
    (``xsp.analysis.replay.checks``)."""
    causes = [r for r in step_causes(store).to_pylist() if r["share_pct"] >= 0.5]
    if not causes:
        return "no replayed step"
    causes.sort(key=lambda r: -r["share_pct"])
    lead = causes[0]["cause"]
    shares = [f"{r['share_pct']:.0f}% {r['cause']}" for r in causes]
    spread = cause_share_range(store, lead)
    if spread is not None:
        low, high, n = spread
        shares[0] += f" ({low:.0f}-{high:.0f}% across {n} iterations)"
    verified = replay(store).verified
    unchecked = "unchecked: " if verified is not None and not verified.checked else ""
    return f"{unchecked}{VERDICTS[lead]}: {', '.join(shares)} of the step's critical path"


def cause_share_range(store: MeasurementStore, cause: str) -> tuple[float, float, int] | None:
    """The least and greatest share (%) of ``cause`` in one steady iteration's critical path,
    and how many iterations; None with fewer than two."""
    result = replay(store)
    kept = _steady_iterations(result)
    if len(kept) < 2:
        return None
    path = result.path.filter(pc.is_in(result.path.column("iteration"), arrow(kept, pa.int64())))
    code, names = text_codes(path.column("cause"))
    dur = numbers(path.column("dur_ns")).astype(np.float64, copy=False)
    iteration = numbers(path.column("iteration")).astype(np.int64, copy=False)
    seen, at = np.unique(iteration, return_inverse=True)
    if len(seen) < 2:  # the ranks of one iteration: nothing moves across iterations
        return None
    total = np.bincount(at, weights=dur)
    mine = (
        np.bincount(
            at, weights=np.where(code == names.index(cause), dur, 0.0), minlength=len(total)
        )
        if cause in names
        else np.zeros(len(total))
    )
    shares = 100.0 * mine / np.where(total > 0, total, 1.0)
    return float(shares.min()), float(shares.max()), len(shares)


#: Every layer's GPU time a steady iteration by phase, its time on the critical path, and its
#: share of the replayed step (``layer_times``).
_LAYER_TIMES_SQL = """
WITH n AS (SELECT greatest(count(*), 1) AS it FROM replay_kept),
step AS (SELECT median(dur_ns) / 1e6 AS ms FROM replay_spans
         WHERE kind = 'step' AND iteration IN (SELECT iteration FROM replay_kept)),
types AS (SELECT layer, any_value(layer_type) AS layer_type FROM replay_spans
          WHERE kind = 'module' GROUP BY layer),
gpu AS (
    SELECT layer,
           sum(dur_ns) FILTER (WHERE phase = 'forward') AS fwd,
           sum(dur_ns) FILTER (WHERE phase = 'backward') AS bwd,
           sum(dur_ns) FILTER (WHERE phase IS NULL OR phase NOT IN ('forward', 'backward'))
               AS other
    FROM replay_spans
    WHERE level = 'gpu' AND layer <> '' AND iteration IN (SELECT iteration FROM replay_kept)
    GROUP BY layer
),
on_path AS (
    SELECT layer, sum(dur_ns) AS total,
           sum(dur_ns) FILTER (WHERE cause = 'gpu compute') AS on_gpu
    FROM replay_path
    WHERE layer <> '' AND iteration IN (SELECT iteration FROM replay_kept)
    GROUP BY layer
),
-- each iteration's share (a multi-rank iteration: of its longest rank's step)
step_each AS (SELECT iteration, max(dur_ns) AS step_ns FROM replay_spans
              WHERE kind = 'step' AND iteration IN (SELECT iteration FROM replay_kept)
              GROUP BY iteration),
gpu_each AS (
    SELECT layer, iteration, sum(dur_ns) AS ns FROM replay_spans
    WHERE level = 'gpu' AND layer <> '' AND iteration IN (SELECT iteration FROM replay_kept)
    GROUP BY layer, iteration
),
shares AS (
    SELECT layer, min(100.0 * ns / step_ns) AS low, max(100.0 * ns / step_ns) AS high,
           count(*) AS seen
    FROM gpu_each JOIN step_each USING (iteration) WHERE step_ns > 0 GROUP BY layer
)
SELECT gpu.layer, types.layer_type,
       coalesce(fwd, 0) / n.it / 1e6 AS forward_gpu_ms,
       coalesce(bwd, 0) / n.it / 1e6 AS backward_gpu_ms,
       coalesce(other, 0) / n.it / 1e6 AS other_gpu_ms,
       (coalesce(fwd, 0) + coalesce(bwd, 0) + coalesce(other, 0)) / n.it / 1e6 AS gpu_ms,
       coalesce(total, 0) / n.it / 1e6 AS critical_path_ms,
       coalesce(on_gpu, 0) / n.it / 1e6 AS path_gpu_ms,
       (coalesce(total, 0) - coalesce(on_gpu, 0)) / n.it / 1e6 AS path_host_ms,
       100.0 * (coalesce(fwd, 0) + coalesce(bwd, 0) + coalesce(other, 0)) / n.it / 1e6
           / nullif(step.ms, 0) AS share_pct,
       CASE WHEN coalesce(seen, 0) < n.it THEN 0.0 ELSE low END AS share_min_pct,
       high AS share_max_pct
FROM gpu LEFT JOIN on_path USING (layer) LEFT JOIN types USING (layer)
     LEFT JOIN shares USING (layer), n, step
ORDER BY gpu_ms DESC, gpu.layer
"""


def _register_replay(store: MeasurementStore) -> None:
    """The replay's spans, its critical path and its steady iterations as DuckDB views, for
    ``_LAYER_TIMES_SQL``."""
    result = replay(store)
    spans = result.spans
    kept = arrow(_steady_iterations(result), pa.int64())
    # text as the store holds it (dictionary-encoded, which DuckDB reads as text): a cast to
    # strings wrote out 1M of them a column
    layer = spans.column("module_path")
    store.con.register(
        "replay_spans",
        pa.Table.from_arrays(
            [
                spans.column("iteration").cast(pa.int64()),
                spans.column("level"),
                spans.column("kind"),
                spans.column("phase"),
                layer,
                spans.column("module_type"),
                arrow(result.dur_ns, pa.int64()),
            ],
            names=["iteration", "level", "kind", "phase", "layer", "layer_type", "dur_ns"],
        ),
    )
    path = result.path
    store.con.register("replay_path", path.append_column("layer", layer.take(path.column("row"))))
    store.con.register("replay_kept", pa.Table.from_arrays([kept], names=["iteration"]))


def layer_times(store: MeasurementStore) -> pa.Table:
    """Every layer's times per steady iteration, largest GPU time first: layer, layer_type,
    forward_gpu_ms, backward_gpu_ms, other_gpu_ms, gpu_ms, critical_path_ms (of which
    path_gpu_ms on its kernels and path_host_ms on its host work, launches and syncs), share_pct
    (its GPU time against the replayed step), and share_min_pct and share_max_pct: the least and
    the greatest share it took of one steady iteration's replayed step (0 where an iteration ran
    none of its kernels), how much the share moves across iterations. Computed once per
    store."""
    return _LAYER_TIMES.of(store)


def _layer_times(store: MeasurementStore) -> pa.Table:
    _register_replay(store)
    return store.sql(_LAYER_TIMES_SQL)


def _itself(table: pa.Table) -> pa.Table:
    return table


_LAYER_TIMES = Derived("replay_layer_times", _layer_times, needs=("replay",), view=_itself)


def layers(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """Layers by GPU time (``layer_times``): layer, forward_gpu_ms, backward_gpu_ms, gpu_ms
    (every phase's), critical_path_ms, share_pct, and its range across the steady iterations,
    share_min_pct and share_max_pct."""
    return (
        layer_times(store)
        .select(
            [
                "layer",
                "forward_gpu_ms",
                "backward_gpu_ms",
                "gpu_ms",
                "critical_path_ms",
                "share_pct",
                "share_min_pct",
                "share_max_pct",
            ]
        )
        .slice(0, limit)
    )


def layer_split(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """A13 on the replay: each layer's time on the step's critical path and how much of it was
    its kernels (GPU) or its host work, launches and syncs (non-GPU), with its GPU time (forward +
    backward) beside: layer, layer_type, critical_path_ms, gpu_ms (on the path), non_gpu_ms,
    gpu_pct, gpu_total_ms. GPU work runs asynchronously, so "host latency minus GPU latency"
    (XSP's A13 for synchronous execution) says nothing here; the critical path does."""
    times = layer_times(store)
    return (
        store.sql(
            """
        SELECT layer, layer_type, critical_path_ms, path_gpu_ms AS gpu_ms,
               path_host_ms AS non_gpu_ms,
               100.0 * path_gpu_ms / nullif(critical_path_ms, 0) AS gpu_pct,
               gpu_ms AS gpu_total_ms
        FROM replay_layer_times ORDER BY critical_path_ms DESC, layer LIMIT ?
        """,
            [limit],
        )
        if times.num_rows
        else times
    )


def layer_types(store: MeasurementStore) -> pa.Table:
    """A5 on the replay: layer types by GPU time (forward + backward): layer_type, layers,
    gpu_ms_per_iteration, critical_path_ms_per_iteration, share_pct (of all layers' GPU time)."""
    layer_times(store)  # registers replay_layer_times
    return store.sql(
        """
        SELECT coalesce(layer_type, '?') AS layer_type, count(*) AS layers,
               sum(gpu_ms) AS gpu_ms_per_iteration,
               sum(critical_path_ms) AS critical_path_ms_per_iteration,
               100.0 * sum(gpu_ms) / (SELECT sum(gpu_ms) FROM replay_layer_times) AS share_pct
        FROM replay_layer_times GROUP BY ALL ORDER BY gpu_ms_per_iteration DESC
        """
    )
