"""Achieved TFLOP/s and model FLOPs utilization from algorithmic FLOPs (``xsp.analysis.tables.flops``)
and G's kernel durations: every measurement whose deepest F run recorded op shapes has them,
with no counter run.

Rates are algorithmic FLOPs over time: per op and per layer over their kernels' G durations,
per model over kernel time and over the untraced step (M). Each is set against the peak of the
tensor-core roof its operands' dtype runs on (``flop_formulas.DTYPE_ROOFS``), measured by a
counter run where the measurement has one, else the datasheet's (``xsp.analysis.tables.peaks``);
model FLOPs utilization (MFU) is the step's rate against the roof of most of its FLOPs.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables import flops
from xsp.analysis.tables.counters import store_peaks, untraced_step_ms
from xsp.analysis.tables.flop_formulas import ATTENTION, CONVOLUTION, MATMUL, NORM
from xsp.analysis.tables.peaks import Peaks

__all__ = ["FAMILIES", "NO_SHAPES", "layer_flops", "model_flops", "op_flops", "unavailable"]

NO_SHAPES = (
    "no algorithmic FLOPs: no run recorded op shapes (level F records them in the deepest "
    "level set with F, unless xsp run was given --no-op-shapes)"
)
FAMILIES = (MATMUL, CONVOLUTION, ATTENTION, NORM)


def unavailable(store: MeasurementStore) -> str | None:
    """Why the FLOP analyses are absent (one line), or None when they are there."""
    return NO_SHAPES if flops.counted(store).run_index is None else None


def _rate(gflop: float, kernel_ms: float | None, roof: str | None, peaks: Peaks) -> dict[str, Any]:
    """Achieved TFLOP/s over ``kernel_ms`` and its share of ``roof``'s peak."""
    achieved = gflop / kernel_ms if kernel_ms else None  # GFLOP/ms = TFLOP/s
    peak = peaks.values.get(roof) if roof else None
    return {
        "achieved_tflop_per_s": achieved,
        "roof": roof,
        "of_peak_pct": 100.0 * achieved * 1e12 / peak if achieved is not None and peak else None,
    }


def _kernel_ns(store: MeasurementStore) -> dict[int, int]:
    """Kernel span id -> duration, in the shapes run (kernels map to ops only there)."""
    found = flops.counted(store)
    if not found.kernel_op:
        return {}
    rows = store.sql(
        "SELECT span_id, dur_ns FROM spans WHERE run_index = ? AND kind = 'kernel'",
        [found.run_index],
    ).to_pylist()
    return {r["span_id"]: r["dur_ns"] for r in rows}


_OP_SCHEMA = pa.schema(
    [
        ("layer", pa.string()),
        ("phase", pa.string()),
        ("op", pa.string()),
        ("input_shapes", pa.string()),
        ("dtype", pa.string()),
        ("calls_per_iteration", pa.float64()),
        ("algorithmic_gflop_per_iteration", pa.float64()),
        ("kernels_per_iteration", pa.float64()),
        ("kernel_ms_per_iteration", pa.float64()),
        ("achieved_tflop_per_s", pa.float64()),
        ("roof", pa.string()),
        ("of_peak_pct", pa.float64()),
    ]
)


def op_flops(store: MeasurementStore, limit: int = 25) -> pa.Table:
    """The ops with the most algorithmic FLOPs, grouped by layer, phase, op, input shapes and
    dtype, per iteration: calls, GFLOP, their kernels and kernel time (where the shapes run has
    level G), achieved TFLOP/s and its share of the dtype's roof. Ops whose shapes do not fit
    their formula are left out (``model_flops`` counts them)."""
    found = flops.counted(store)
    if not found.iterations:
        return _OP_SCHEMA.empty_table()
    durations = _kernel_ns(store)
    kernels: dict[int, list[int]] = {}
    for kernel, op_span in found.kernel_op.items():
        kernels.setdefault(op_span, []).append(durations.get(kernel, 0))
    groups: dict[tuple[Any, ...], list[flops.OpFlops]] = {}
    for op in found.ops:
        if op.flops is not None:
            groups.setdefault((op.layer, op.phase, op.name, op.shapes, op.dtype), []).append(op)
    peaks, n = store_peaks(store), found.iterations
    rows = []
    for (layer, phase, name, shapes, dtype), members in groups.items():
        gflop = sum(op.flops or 0 for op in members) / 1e9 / n
        times = [t for op in members for t in kernels.get(op.span_id, [])]
        kernel_ms = sum(times) / 1e6 / n if durations else None
        rows.append(
            {
                "layer": layer,
                "phase": phase,
                "op": name,
                "input_shapes": shapes,
                "dtype": dtype,
                "calls_per_iteration": len(members) / n,
                "algorithmic_gflop_per_iteration": gflop,
                "kernels_per_iteration": len(times) / n if durations else None,
                "kernel_ms_per_iteration": kernel_ms,
                **_rate(gflop, kernel_ms, members[0].roof, peaks),
            }
        )
    rows.sort(key=lambda r: -r["algorithmic_gflop_per_iteration"])
    return pa.Table.from_pylist(rows[:limit], schema=_OP_SCHEMA)


def _layer_kernel_ms(store: MeasurementStore) -> dict[str, float] | None:
    """Kernel time per layer per iteration in the G run (None without one)."""
    run = flops.gpu_run(store)
    if run is None:
        return None
    rows = store.sql(
        """
        WITH k AS (SELECT module_path, dur_ns, iteration FROM spans
                   WHERE run_index = ? AND kind = 'kernel' AND iteration IS NOT NULL)
        SELECT module_path AS layer, sum(dur_ns) / 1e6 / (SELECT count(DISTINCT iteration)
               FROM k) AS ms
        FROM k GROUP BY module_path
        """,
        [run],
    ).to_pylist()
    return {r["layer"]: r["ms"] for r in rows}


def _roof_of(ops: list[flops.OpFlops]) -> str | None:
    """The roof of most of ``ops``' FLOPs."""
    by_roof: dict[str, int] = {}
    for op in ops:
        if op.roof and op.flops:
            by_roof[op.roof] = by_roof.get(op.roof, 0) + op.flops
    return max(by_roof, key=lambda r: by_roof[r]) if by_roof else None


_LAYER_SCHEMA = pa.schema(
    [
        ("layer", pa.string()),
        ("algorithmic_gflop_per_iteration", pa.float64()),
        ("kernel_ms_per_iteration", pa.float64()),
        ("achieved_tflop_per_s", pa.float64()),
        ("roof", pa.string()),
        ("of_peak_pct", pa.float64()),
    ]
)


def layer_flops(store: MeasurementStore, limit: int = 20) -> pa.Table:
    """The layers with the most algorithmic FLOPs per iteration (forward and backward), their
    kernel time (every kernel of the layer in the G run), achieved TFLOP/s over it and its share
    of the roof of most of the layer's FLOPs."""
    found = flops.counted(store)
    gflop = {k: v / 1e9 for k, v in flops.per_iteration(store, "layer").items() if k and v}
    kernel_ms = _layer_kernel_ms(store)
    by_layer: dict[str, list[flops.OpFlops]] = {}
    for op in found.ops:
        if op.layer:
            by_layer.setdefault(op.layer, []).append(op)
    peaks = store_peaks(store)
    rows = []
    for layer, work in sorted(gflop.items(), key=lambda item: -item[1])[:limit]:
        ms = kernel_ms.get(layer) if kernel_ms is not None else None
        rows.append(
            {
                "layer": layer,
                "algorithmic_gflop_per_iteration": work,
                "kernel_ms_per_iteration": ms,
                **_rate(work, ms, _roof_of(by_layer[layer]), peaks),
            }
        )
    return pa.Table.from_pylist(rows, schema=_LAYER_SCHEMA)


def _ranks(store: MeasurementStore, run: int | None) -> int:
    """How many ranks' ops the shapes run holds (their FLOPs add up; so do their GPUs' peaks)."""
    rows = store.sql(
        "SELECT count(DISTINCT rank) AS n FROM spans WHERE run_index = ? AND kind = 'op'", [run]
    ).to_pylist()
    return max(1, int(rows[0]["n"] or 0)) if rows else 1


def model_flops(store: MeasurementStore) -> pa.Table:
    """One row per iteration: algorithmic GFLOP in all and by family, ops whose shapes fit no
    formula, kernel time (G run) and the untraced step (M), achieved TFLOP/s over each, the roof
    of most FLOPs with its peak and source, and model FLOPs utilization (``mfu_pct``: the
    step's rate against that peak, times the GPUs of a multi-rank job, whose ranks' FLOPs add
    up); empty without shapes."""
    found = flops.counted(store)
    total = flops.total_per_iteration(store)
    if total is None:
        return pa.Table.from_pylist([])
    families = flops.per_iteration(store, "family")
    layer_ms = _layer_kernel_ms(store)
    # fsum: the layers come in the query's order, which varies; a plain sum's last digit did
    kernel_ms = math.fsum(layer_ms.values()) if layer_ms else None
    step_ms = untraced_step_ms(store)
    peaks = store_peaks(store)
    roof = _roof_of(found.ops)
    peak = peaks.values.get(roof) if roof else None
    gpus = _ranks(store, found.run_index)
    gflop = total / 1e9
    over_step = gflop / step_ms if step_ms else None
    row = {
        "algorithmic_gflop_per_iteration": gflop,
        **{f"{family}_gflop": families.get(family, 0.0) / 1e9 for family in FAMILIES},
        "uncounted_ops_per_iteration": flops.uncounted_per_iteration(store),
        "kernel_ms_per_iteration": kernel_ms,
        "step_ms": step_ms,
        "over_kernels_tflop_per_s": gflop / kernel_ms if kernel_ms else None,
        "over_step_tflop_per_s": over_step,
        "roof": roof,
        "peak_tflop_per_s": peak / 1e12 if peak else None,
        "peak_source": peaks.sources.get(roof) if roof else None,
        "gpus": gpus,
        "mfu_pct": (
            100.0 * over_step * 1e12 / (peak * gpus) if over_step is not None and peak else None
        ),
    }
    return pa.Table.from_pylist([row])
