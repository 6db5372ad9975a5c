"""Where the untraced step goes: the replay's critical path by cause, and layers by their GPU time
(forward + backward) and their time on the critical path. Pure functions from a measurement
store to tables; figures are per steady iteration, shares are of the replayed step.

A layer's GPU time is the G run's durations of the activities its ops launched, forward and
backward (autograd attributes backward kernels to the forward module); its critical-path time is
what the replay's critical path charged to it: its kernels where the GPU held the path, its ops'
host work and launches where the host did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.replay import CAUSES, VERDICTS, Replay, replay
from xsp.analysis.store import MeasurementStore
from xsp.tracer import schema


def has_gpu(store: MeasurementStore) -> bool:
    """True when a run recorded GPU activities (level G)."""
    return any("G" in run.levels for run in store.runs)


def _steady_iterations(result: Replay) -> np.ndarray:
    steps = result.steps
    return np.asarray(steps.column("iteration"))[np.asarray(steps.column("steady"), dtype=bool)]


def step_causes(store: MeasurementStore) -> pa.Table:
    """The replayed step's critical path by cause: cause, ms_per_iteration, share_pct."""
    result = replay(store)
    kept = _steady_iterations(result)
    path = result.path.filter(pc.is_in(result.path.column("iteration"), pa.array(kept)))
    cause = np.asarray(path.column("cause").to_pylist(), dtype=object)
    dur = np.asarray(path.column("dur_ns"), dtype=np.float64)
    total = float(dur.sum())
    n = max(len(kept), 1)
    rows = [
        {
            "cause": name,
            "ms_per_iteration": float(dur[cause == name].sum()) / n / 1e6,
            "share_pct": 100.0 * float(dur[cause == name].sum()) / total if total else 0.0,
        }
        for name in CAUSES
    ]
    return pa.Table.from_pylist(rows)


def verdict(store: MeasurementStore) -> str:
    """One line: what bounds the step, with the causes' shares ("GPU-bound: 94% GPU compute,
    ...")."""
    causes = [r for r in step_causes(store).to_pylist() if r["share_pct"] >= 0.5]
    if not causes:
        return "no replayed step"
    causes.sort(key=lambda r: -r["share_pct"])
    shares = ", ".join(f"{r['share_pct']:.0f}% {r['cause']}" for r in causes)
    return f"{VERDICTS[causes[0]['cause']]}: {shares} of the step's critical path"


def layers(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """Layers by GPU time: layer, forward_gpu_ms, backward_gpu_ms, other_gpu_ms, gpu_ms,
    critical_path_ms, share_pct (GPU time of the replayed step), per steady iteration."""
    result = replay(store)
    spans = result.spans
    kept = _steady_iterations(result)
    n = max(len(kept), 1)
    iteration = np.asarray(spans.column("iteration").fill_null(-1), dtype=np.int64)
    level = np.asarray(spans.column("level").cast(pa.string()).fill_null(""), dtype=object)
    path_of = np.asarray(spans.column("module_path").cast(pa.string()).fill_null(""), dtype=object)
    phase = np.asarray(spans.column("phase").cast(pa.string()).fill_null(""), dtype=object)
    gpu = (level == schema.LEVEL_GPU) & np.isin(iteration, kept) & (path_of != "")
    dur = result.dur_ns.astype(np.float64)
    table: dict[str, dict[str, float]] = {}
    for name, ph, d in zip(path_of[gpu], phase[gpu], dur[gpu], strict=True):
        row = table.setdefault(name, {"forward": 0.0, "backward": 0.0, "other": 0.0, "path": 0.0})
        row[ph if ph in ("forward", "backward") else "other"] += d
    path = result.path
    charged = np.asarray(path.column("row"), dtype=np.int64)
    on_path = np.isin(np.asarray(path.column("iteration"), dtype=np.int64), kept)
    for row, d in zip(charged[on_path], np.asarray(path.column("dur_ns"))[on_path], strict=True):
        name = path_of[row]
        if name and name in table:
            table[name]["path"] += float(d)
    step_ms = result.summary()["step_ms"] or 0.0
    rows: list[dict[str, Any]] = []
    for name, values in table.items():
        gpu_ms = (values["forward"] + values["backward"] + values["other"]) / n / 1e6
        rows.append(
            {
                "layer": name,
                "forward_gpu_ms": values["forward"] / n / 1e6,
                "backward_gpu_ms": values["backward"] / n / 1e6,
                "other_gpu_ms": values["other"] / n / 1e6,
                "gpu_ms": gpu_ms,
                "critical_path_ms": values["path"] / n / 1e6,
                "share_pct": 100.0 * gpu_ms / step_ms if step_ms else 0.0,
            }
        )
    rows.sort(key=lambda r: -float(r["gpu_ms"]))
    return pa.Table.from_pylist(
        rows[:limit],
        schema=pa.schema(
            [
                ("layer", pa.string()),
                ("forward_gpu_ms", pa.float64()),
                ("backward_gpu_ms", pa.float64()),
                ("other_gpu_ms", pa.float64()),
                ("gpu_ms", pa.float64()),
                ("critical_path_ms", pa.float64()),
                ("share_pct", pa.float64()),
            ]
        ),
    )
