"""Hardware-counter analyses: XSP's A8 (kernel information), A9 (kernel roofline), A12 (GPU
metrics per layer), A14 (layer roofline) and A15 (the model's aggregate), from the counter run
(level set MH, Nsight Compute) joined onto the G run's kernels.

The counter run replays every kernel, so its durations mean nothing; its counters join the
kernels of the deepest run with level G by structure, never by time (algorithm notes):

1. The counter run launches the G run's kernel sequence (same program, same shapes), so within
   each iteration its kernels pair with the G run's in launch order (CUPTI correlation ids in
   the G run, ncu's result order in the counter run), provided they agree on the kernel's own
   function name (``xsp.core.counter_names.kernel_base``: the two tools demangle scopes,
   template values and parameters differently, and CUPTI leaves some names mangled) and on the
   launch shape (grid, block) where both sides recorded one. The sequences are aligned as a
   diff (``difflib``: the longest run that agrees, then recursively either side of it, after
   the common prefix and suffix), so one kernel either side has alone shifts nothing else.
2. Counted iterations are matched to the G run's iterations of the same number; what either
   side has alone is reported (``counter_matching``), with how many matched kernels the tools
   spell differently.
3. The analyses describe one typical iteration: each kernel of the G run's reference iteration
   (the first counted one) with its median duration over every G iteration of the same key and
   its counter values averaged over the counted iterations of the same key (a kernel's key in
   the G run: its name and its ordinal among same-named kernels of its iteration).
4. Rates are counters over G-run durations: achieved GFLOP/s = FLOPs / duration; arithmetic
   intensity = FLOPs / DRAM bytes (read + written); a kernel is compute-bound when its intensity
   reaches the ridge point (peak FLOP/s / DRAM bandwidth) of the roof of its precision, else
   memory-bound. Roofs come from ``xsp.analysis.tables.peaks`` (measured or datasheet; it says which).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables.counter_matching import align_kernels, iteration_of, keyed
from xsp.analysis.tables.counter_records import (
    CountedKernel,
    CounterValues,
    GpuKernel,
    Rates,
    RooflinePoint,
    Waste,
)
from xsp.analysis.tables.flop_formulas import EXACT_FAMILIES
from xsp.analysis.tables.flops import counted as counted_ops
from xsp.analysis.tables.flops import gpu_run, per_iteration, split, total_per_iteration
from xsp.analysis.tables.peaks import Peaks, peaks_table, resolve
from xsp.core import schema
from xsp.core.counter_names import DERIVED, PRECISIONS

if TYPE_CHECKING:
    from xsp.core.store import Run

__all__ = [
    "COUNTER_JOIN",
    "DRAM_WRITE_NOTE",
    "KERNEL_RATES",
    "NO_COUNTERS",
    "TENSOR_ONLY",
    "VALUES",
    "WASTE_COLUMNS",
    "WEIGHTED",
    "CounterJoin",
    "counter_columns",
    "counter_join",
    "counter_matching",
    "kernel_info",
    "kernel_roofline",
    "layer_metrics",
    "layer_roofline",
    "matching_note",
    "model_metrics",
    "peaks",
    "precision_of",
    "store_peaks",
    "unavailable",
    "untraced_step_ms",
    "waste",
]

#: Counter columns averaged per kernel and carried into the analyses: the counter table's
#: derived columns but ncu's own duration (replay times are not the G run's).
VALUES = tuple(c for c in DERIVED if c != "ncu_duration_ns")
#: Rates that aggregate weighted by kernel time (the rest are sums).
WEIGHTED = ("occupancy_pct", "sm_throughput_pct", "memory_throughput_pct")
#: Precisions that exist only on tensor cores.
TENSOR_ONLY = ("tf32", "bf16", "fp8")
NO_COUNTERS = (
    "no hardware counters: this measurement has no counter run (add level set "
    f"{schema.COUNTER_LEVEL_SET} to xsp run; it needs Nsight Compute's ncu)"
)


@dataclass
class CounterJoin:
    """The counter run joined onto the G run (see the module notes)."""

    kernels: list[CountedKernel]  # the typical iteration, in launch order
    matching: pa.Table
    peaks: Peaks
    counter_levels: str
    #: counter values per G-run key (kernel_key, ordinal), averaged over the counted iterations
    values: dict[tuple[str, int], CounterValues] = field(default_factory=dict)
    counted_iterations: list[int] = field(default_factory=list)
    gpu_iterations: int = 0
    note: str = ""
    #: the counter run's gaps: quantities with no metric on the device, the metric set
    coverage: str = ""


def unavailable(store: MeasurementStore) -> str | None:
    """Why the counter analyses are absent (one line), or None when they are there."""
    join = counter_join(store)
    if join is None:
        return NO_COUNTERS
    if not join.kernels:
        return join.note
    return None


def counter_join(store: MeasurementStore) -> CounterJoin | None:
    """The join, computed once per store; None without a counter table."""
    return COUNTER_JOIN.of(store)


def _counter_source(store: MeasurementStore) -> tuple[Run, pa.Table] | None:
    for run in store.counter_runs:
        table = run.counters()
        if table is not None and table.num_rows:
            return run, table
    return None


def _device(store: MeasurementStore) -> str:
    for run in [*store.counter_runs, *store.runs]:
        name = run.resource.get(schema.RES_DEVICE_NAME)
        if name:
            return str(name)
    return "unknown device"


def store_peaks(store: MeasurementStore) -> Peaks:
    """The roofs of this measurement: measured by its counter run where it did, else the
    datasheet's for its device."""
    measured: dict[str, float] = {}
    for run in store.counter_runs:
        counters = run.document.counters or {}
        measured = dict(counters.get("peaks_measured") or {}) or measured
    return resolve(_device(store), measured)


def _gpu_kernels(store: MeasurementStore) -> list[GpuKernel]:
    return store.sql(
        """
        SELECT span_id, iteration, name, dur_ns, module_path, phase, grid, block
        FROM spans WHERE run_index = (SELECT max(run_index) FROM spans WHERE level = 'gpu')
          AND kind = 'kernel' AND iteration IS NOT NULL
        ORDER BY iteration, correlation_id NULLS LAST, start_ns
        """
    ).to_pylist()


def _coverage(run: Run) -> str:
    """What the counter run could not count, from its run.json: quantities the device offers
    no metric for, and the lean metric set's omissions."""
    info = run.document.counters or {}
    parts = []
    missing = sorted({str(q).split("[", 1)[0] for q in info.get("quantities_without_metric") or []})
    for quantity in missing:
        tensor = [p for p, (_, t) in PRECISIONS.items() if t == quantity]
        effect = f"{tensor[0]} tensor-core FLOPs count as zero" if tensor else "it is null"
        parts.append(f"no metric on this device for {quantity} ({effect})")
    if info.get("metric_set") == "lean":
        parts.append("lean metric set (XSP_COUNTER_METRICS=lean): no SM or memory throughput")
    return "; ".join(parts)


def _join(store: MeasurementStore) -> CounterJoin | None:
    source = _counter_source(store)
    if source is None:
        return None
    run, table = source
    peaks = store_peaks(store)
    # the counter table's rows: open records (its columns are the metrics counted)
    counter_rows: list[dict[str, object]] = [
        r
        for r in table.sort_by([("iteration", "ascending"), ("ordinal", "ascending")]).to_pylist()
        if r["iteration"] is not None and r["iteration"] >= 0
    ]
    counted = sorted({iteration_of(r) for r in counter_rows})
    coverage = _coverage(run)
    gpu_rows = _gpu_kernels(store)
    if not gpu_rows:
        return CounterJoin(
            [],
            align_kernels([], counter_rows).matching,
            peaks,
            run.levels,
            counted_iterations=counted,
            note=(
                "hardware counters found, but no run with level G to join them onto (add "
                "MFLG or MLG): latencies come from G"
            ),
            coverage=coverage,
        )
    alignment = align_kernels(gpu_rows, counter_rows)
    g_keys = keyed(gpu_rows, "name")
    grouped: dict[tuple[str, int], list[dict[str, object]]] = {}
    for index, (_, key, ordinal) in enumerate(g_keys):
        if index in alignment.pairs:
            grouped.setdefault((key, ordinal), []).append(counter_rows[alignment.pairs[index]])
    means = {key: _mean(members) for key, members in grouped.items()}
    gpu_iterations = sorted({k[0] for k in g_keys})
    reference = counted[0] if counted and counted[0] in gpu_iterations else gpu_iterations[0]
    durations: dict[tuple[str, int], list[int]] = {}
    for (_, key, ordinal), row in zip(g_keys, gpu_rows, strict=True):
        durations.setdefault((key, ordinal), []).append(int(row["dur_ns"]))
    kernels = []
    position = 0
    for (it, key, ordinal), row in zip(g_keys, gpu_rows, strict=True):
        if it != reference:
            continue
        values = means.get((key, ordinal))
        kernels.append(
            CountedKernel(
                ordinal=position,
                span_id=row["span_id"],
                kernel=row["name"],
                layer=row["module_path"],
                phase=row["phase"],
                latency_ns=statistics.median(durations[(key, ordinal)]),
                counted=values is not None,
                values=values or dict.fromkeys(VALUES),
            )
        )
        position += 1
    kernels = _with_algorithmic(store, kernels)
    return CounterJoin(
        kernels,
        alignment.matching,
        peaks,
        run.levels,
        means,
        counted,
        len(gpu_iterations),
        coverage=coverage,
    )


def _with_algorithmic(store: MeasurementStore, kernels: list[CountedKernel]) -> list[CountedKernel]:
    """Each kernel's share of its op's algorithmic FLOPs (``xsp.analysis.tables.flops``, note 4) as
    ``algorithmic_flops`` (and as ``exact_flops`` where its op's family is counted exactly): 0
    for a kernel under no counted op, None where the G run recorded no shapes or the op's
    shapes do not fit its formula."""
    found = counted_ops(store)
    shaped = found.run_index is not None and found.run_index == gpu_run(store)
    ops = found.by_span
    shares: dict[int, tuple[float | None, float | None]] = {}  # by position in ``kernels``
    members: dict[int, list[int]] = {}
    for position, k in enumerate(kernels):
        op = found.kernel_op.get(k.span_id)
        share = 0.0 if shaped and op is None else None
        shares[position] = (share, share)
        if op is not None:
            members.setdefault(op, []).append(position)
    for op, group in members.items():
        total = ops[op].flops
        if total is None:
            continue
        split_shares = split(
            total,
            [kernels[i].values["flops"] for i in group],
            [kernels[i].latency_ns for i in group],
        )
        exact = ops[op].family in EXACT_FAMILIES
        for i, share in zip(group, split_shares, strict=True):
            shares[i] = (share, share if exact else 0.0)
    return [
        replace(k, algorithmic_flops=shares[i][0], exact_flops=shares[i][1])
        for i, k in enumerate(kernels)
    ]


def _mean(members: list[dict[str, object]]) -> CounterValues:
    """Counter values of one kernel, averaged over the counted iterations."""
    entry: CounterValues = {}
    for name in VALUES:
        present = [_number(m[name]) for m in members if m.get(name) is not None]
        entry[name] = statistics.fmean(present) if present else None
    return entry


def _number(value: object) -> float:
    """A counter value of the counter table (its rows are open records)."""
    if not isinstance(value, (int, float)):
        raise TypeError(f"counter value {value!r} is not a number")
    return value


def precision_of(values: Mapping[str, float | None]) -> tuple[str | None, str | None]:
    """(precision of most FLOPs, its roof key) of one kernel's or an aggregate's counters."""
    flops = {p: values.get(f"flops_{p}") or 0.0 for p in PRECISIONS}
    precision = max(flops, key=lambda p: flops[p])
    if not flops[precision]:
        return None, None
    tensor = values.get("tensor_flops") or 0.0
    on_tensor = precision in TENSOR_ONLY or tensor >= 0.5 * (values.get("flops") or 0.0)
    return precision, (f"{precision}_tensor" if on_tensor else precision)


def _rates(values: Mapping[str, float | None], latency_ns: float | None, peaks: Peaks) -> Rates:
    """Work, intensity, achieved rate, roof and bound of one kernel or aggregate."""
    flops = values.get("flops")
    dram = (values.get("dram_read_bytes") or 0.0) + (values.get("dram_write_bytes") or 0.0)
    precision, roof = precision_of(values)
    intensity = flops / dram if flops is not None and dram > 0 else None
    achieved = flops / latency_ns if flops is not None and latency_ns else None  # FLOP/ns = G/s
    ceiling = peaks.values.get(roof) if roof else None
    attainable = None
    if ceiling and peaks.dram and intensity is not None:
        attainable = min(ceiling, intensity * peaks.dram) / 1e9
    elif ceiling and not dram:
        attainable = ceiling / 1e9
    ridge = peaks.ridge(roof) if roof else None
    if not flops:
        bound = "memory-bound" if dram > 0 else None
    elif ridge is None:
        bound = None
    else:
        bound = "compute-bound" if intensity is None or intensity >= ridge else "memory-bound"
    label = None
    if precision:
        label = precision + (" tensor" if roof and roof.endswith("_tensor") else "")
    return {
        "work_gflop": flops / 1e9 if flops is not None else None,
        "achieved_gflop_per_s": achieved,
        "arithmetic_intensity_flop_per_byte": intensity,
        "attainable_gflop_per_s": attainable,
        "precision": label,
        "roof": roof,
        "bound": bound,
    }


#: Executed FLOPs (the counters) against algorithmic ones (the math, ``xsp.analysis.tables.flops``).
WASTE_COLUMNS = (
    ("algorithmic_gflop", pa.float64()),
    ("executed_over_algorithmic", pa.float64()),
    ("tile_waste_pct", pa.float64()),
)
#: Where DRAM write bytes are shown: why they fall short of what a kernel wrote.
DRAM_WRITE_NOTE = (
    "DRAM writes count what reached DRAM while the kernel ran: lines still in the L2 when it "
    "ended are written back later, uncounted (the H200 calibration's 2 GiB copy counted reads "
    "of 1.0000x its bytes and writes of 0.9888x: 24 MB still in the 50 MB L2)"
)


def waste(executed: float | None, algorithmic: float | None, exact: float | None) -> Waste:
    """Executed against algorithmic FLOPs (``exact``: those of them counted exactly, not the
    norms' estimate): ``executed_over_algorithmic`` above 1 is work the hardware did beyond the
    math (whole tiles, padded channels), as ``tile_waste_pct`` of the math; below 1, it did
    less than the direct math (Winograd, a gradient nobody needed). None where the counters saw
    no FLOPs (a precision without a metric) or nothing was counted exactly."""
    ratio = executed / exact if executed and exact else None
    return {
        "algorithmic_gflop": algorithmic / 1e9 if algorithmic is not None else None,
        "executed_over_algorithmic": ratio,
        "tile_waste_pct": 100.0 * (ratio - 1.0) if ratio is not None else None,
    }


_KERNEL_SCHEMA = pa.schema(
    [
        ("ordinal", pa.int64()),
        ("kernel", pa.string()),
        ("layer", pa.string()),
        ("phase", pa.string()),
        ("latency_us", pa.float64()),
        ("work_gflop", pa.float64()),
        *WASTE_COLUMNS,
        ("achieved_gflop_per_s", pa.float64()),
        ("dram_read_bytes", pa.float64()),
        ("dram_write_bytes", pa.float64()),
        ("l2_bytes", pa.float64()),
        ("arithmetic_intensity_flop_per_byte", pa.float64()),
        ("occupancy_pct", pa.float64()),
        ("sm_throughput_pct", pa.float64()),
        ("memory_throughput_pct", pa.float64()),
        ("precision", pa.string()),
        ("bound", pa.string()),
    ]
)


def _kernel_rates(store: MeasurementStore) -> list[tuple[CountedKernel, Rates]]:
    """Each counted kernel with its rates against the roofs, computed once per store (A8 and A9
    both read them)."""
    return KERNEL_RATES.of(store)


def kernel_info(store: MeasurementStore) -> pa.Table:
    """A8: each kernel of a typical iteration, in launch order: latency from the G run, work
    (GFLOP), achieved GFLOP/s, DRAM bytes read and written, L2 bytes, arithmetic intensity,
    achieved occupancy, SM and memory throughput (% of peak), precision, and memory- or
    compute-bound. Empty without counters (``unavailable`` says why)."""
    rows = []
    for k, rates in _kernel_rates(store):
        rows.append(
            {
                "ordinal": k.ordinal,
                "kernel": k.kernel,
                "layer": k.layer,
                "phase": k.phase,
                "latency_us": k.latency_ns / 1e3,
                **{name: k.values[name] for name in _KERNEL_SCHEMA.names if name in k.values},
                **{name: value for name, value in rates.items() if name in _KERNEL_SCHEMA.names},
                **waste(k.values.get("flops"), k.algorithmic_flops, k.exact_flops),
            }
        )
    return pa.Table.from_pylist(rows, schema=_KERNEL_SCHEMA)


_ROOFLINE_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("layer", pa.string()),
        ("latency_us", pa.float64()),
        ("arithmetic_intensity_flop_per_byte", pa.float64()),
        ("achieved_gflop_per_s", pa.float64()),
        ("attainable_gflop_per_s", pa.float64()),
        ("of_attainable_pct", pa.float64()),
        ("roof", pa.string()),
        ("bound", pa.string()),
    ]
)


def kernel_roofline(store: MeasurementStore) -> pa.Table:
    """A9: the kernel roofline's points, one per kernel that did floating-point work: its
    intensity, achieved and attainable GFLOP/s (the roof of its precision, or DRAM bandwidth
    times its intensity, whichever is lower), and how close it came."""
    rows = []
    for k, rates in _kernel_rates(store):
        if rates.get("arithmetic_intensity_flop_per_byte") is None or not rates["work_gflop"]:
            continue
        rows.append(_point(k.kernel, k.layer, k.latency_ns, rates))
    return pa.Table.from_pylist(rows, schema=_ROOFLINE_SCHEMA)


def _point(name: str, layer: str | None, latency_ns: float, rates: Rates) -> RooflinePoint:
    achieved, attainable = rates["achieved_gflop_per_s"], rates["attainable_gflop_per_s"]
    return {
        "name": name,
        "layer": layer,
        "latency_us": latency_ns / 1e3,
        "arithmetic_intensity_flop_per_byte": rates["arithmetic_intensity_flop_per_byte"],
        "achieved_gflop_per_s": achieved,
        "attainable_gflop_per_s": attainable,
        "of_attainable_pct": 100.0 * achieved / attainable if achieved and attainable else None,
        "roof": rates["roof"],
        "bound": rates["bound"],
    }


def _aggregate(kernels: list[CountedKernel]) -> tuple[CounterValues, float]:
    """Summed counters (time-weighted rates) of counted kernels, and their summed latency."""
    counted = [k for k in kernels if k.counted]
    total_ns = float(sum(k.latency_ns for k in counted))
    out: CounterValues = {}
    for name in VALUES:
        # (value, latency) of the kernels that counted it
        present = [(v, k.latency_ns) for k in counted if (v := k.values.get(name)) is not None]
        if not present:
            out[name] = None
        elif name in WEIGHTED:
            weight = sum(ns for _, ns in present)
            out[name] = sum(v * ns for v, ns in present) / weight if weight else None
        else:
            out[name] = float(sum(v for v, _ in present))
    return out, total_ns


_LAYER_SCHEMA = pa.schema(
    [
        ("layer", pa.string()),
        ("kernels", pa.int64()),
        ("kernel_ms", pa.float64()),
        ("work_gflop", pa.float64()),
        *WASTE_COLUMNS,
        ("achieved_gflop_per_s", pa.float64()),
        ("dram_read_bytes", pa.float64()),
        ("dram_write_bytes", pa.float64()),
        ("arithmetic_intensity_flop_per_byte", pa.float64()),
        ("occupancy_pct", pa.float64()),
        ("sm_throughput_pct", pa.float64()),
        ("memory_throughput_pct", pa.float64()),
        ("precision", pa.string()),
        ("bound", pa.string()),
    ]
)


def _by_layer(join: CounterJoin) -> list[tuple[str, list[CountedKernel]]]:
    layers: dict[str, list[CountedKernel]] = {}
    for k in join.kernels:
        if k.layer is not None:
            layers.setdefault(str(k.layer), []).append(k)
    return list(layers.items())


def layer_metrics(store: MeasurementStore) -> pa.Table:
    """A12: GPU metrics per layer (the layer whose op launched each kernel; backward kernels
    count for the layer whose gradient they compute), per typical iteration: kernels, kernel
    time (G run), work, achieved GFLOP/s over that time, DRAM bytes, intensity, time-weighted
    occupancy and throughputs, precision and bound; slowest layer first."""
    join = counter_join(store)
    algorithmic = per_iteration(store, "layer")
    exact = per_iteration(store, "layer", exact=True)
    shaped = counted_ops(store).run_index is not None
    if join is None:
        return pa.Table.from_pylist([], schema=_LAYER_SCHEMA)
    # (kernel_ms, row): the table's rows, open records in its schema's columns
    ranked: list[tuple[float, dict[str, object]]] = []
    for layer, members in _by_layer(join):
        values, total_ns = _aggregate(members)
        rates = _rates(values, total_ns, join.peaks)
        kernel_ms = sum(k.latency_ns for k in members) / 1e6
        row: dict[str, object] = {
            "layer": layer,
            "kernels": len(members),
            "kernel_ms": kernel_ms,
            **{name: values.get(name) for name in _LAYER_SCHEMA.names if name in values},
            **{name: value for name, value in rates.items() if name in _LAYER_SCHEMA.names},
            **waste(
                values.get("flops"),
                algorithmic.get(layer, 0.0 if shaped else None),
                exact.get(layer),
            ),
        }
        ranked.append((kernel_ms, row))
    rows = [row for _, row in sorted(ranked, key=lambda item: -item[0])]
    return pa.Table.from_pylist(rows, schema=_LAYER_SCHEMA)


def layer_roofline(store: MeasurementStore) -> pa.Table:
    """A14: the layer roofline's points (``kernel_roofline``'s columns, one per layer)."""
    join = counter_join(store)
    if join is None:
        return pa.Table.from_pylist([], schema=_ROOFLINE_SCHEMA)
    rows = []
    for layer, members in _by_layer(join):
        values, total_ns = _aggregate(members)
        rates = _rates(values, total_ns, join.peaks)
        if rates.get("arithmetic_intensity_flop_per_byte") is None or not rates["work_gflop"]:
            continue
        rows.append(_point(layer, layer, total_ns, rates))
    return pa.Table.from_pylist(rows, schema=_ROOFLINE_SCHEMA)


def model_metrics(store: MeasurementStore) -> pa.Table:
    """A15: the whole model per iteration: kernels (counted of them), kernel time (G run) and
    the untraced step (M run), work by precision, DRAM and L2 bytes, intensity, achieved
    GFLOP/s over kernel time and over the step, the share of the attainable rate, precision,
    bound, and where the peaks came from."""
    join = counter_join(store)
    if join is None or not join.kernels:
        return pa.Table.from_pylist([])
    values, counted_ns = _aggregate(join.kernels)
    rates = _rates(values, counted_ns, join.peaks)
    step_ms = untraced_step_ms(store)
    flops_executed = values.get("flops")
    achieved, attainable = rates["achieved_gflop_per_s"], rates["attainable_gflop_per_s"]
    # one row of open columns (a work column per precision)
    row: dict[str, object] = {
        "kernels": len(join.kernels),
        "counted_kernels": sum(1 for k in join.kernels if k.counted),
        "kernel_ms": sum(k.latency_ns for k in join.kernels) / 1e6,
        "step_ms": step_ms,
        "work_gflop": rates["work_gflop"],
        **waste(flops_executed, total_per_iteration(store), total_per_iteration(store, exact=True)),
        **{
            f"{p}_gflop": (work / 1e9 if (work := values.get(f"flops_{p}")) else 0.0)
            for p in PRECISIONS
        },
        "tensor_share_pct": (
            100.0 * (values.get("tensor_flops") or 0.0) / flops_executed if flops_executed else None
        ),
        "dram_read_bytes": values.get("dram_read_bytes"),
        "dram_write_bytes": values.get("dram_write_bytes"),
        "l2_bytes": values.get("l2_bytes"),
        "arithmetic_intensity_flop_per_byte": rates["arithmetic_intensity_flop_per_byte"],
        "achieved_gflop_per_s": rates["achieved_gflop_per_s"],
        "over_step_gflop_per_s": (
            flops_executed / (step_ms * 1e6) if flops_executed and step_ms else None
        ),
        "attainable_gflop_per_s": rates["attainable_gflop_per_s"],
        "of_attainable_pct": (100.0 * achieved / attainable if achieved and attainable else None),
        "occupancy_pct": values.get("occupancy_pct"),
        "sm_throughput_pct": values.get("sm_throughput_pct"),
        "memory_throughput_pct": values.get("memory_throughput_pct"),
        "precision": rates["precision"],
        "roof": rates["roof"],
        "bound": rates["bound"],
        "peaks": join.peaks.summary,
    }
    return pa.Table.from_pylist([row])


def untraced_step_ms(store: MeasurementStore) -> float | None:
    """The untraced step: median model span of the shallowest run with level M."""
    rows = store.sql(
        """
        WITH r AS (SELECT run_index FROM spans WHERE kind = 'step'
                   GROUP BY run_index, levels ORDER BY length(levels), run_index LIMIT 1)
        SELECT median(dur_ns) / 1e6 AS ms FROM spans
        WHERE kind = 'step' AND run_index = (SELECT run_index FROM r)
        """
    ).to_pylist()
    return rows[0]["ms"] if rows else None


def counter_matching(store: MeasurementStore) -> pa.Table:
    """How the counter run's kernels matched the G run's, per counted iteration (see the
    module notes); empty without counters."""
    join = counter_join(store)
    return join.matching if join else align_kernels([], []).matching


def peaks(store: MeasurementStore) -> pa.Table:
    """The roofs: datasheet and measured values, the one used, and its source."""
    return peaks_table(store_peaks(store))


def matching_note(store: MeasurementStore) -> str:
    """One line on the join: counter run, counted iterations, how kernels were paired, what the
    counter run could not count, and the roofs' source."""
    join = counter_join(store)
    if join is None:
        return NO_COUNTERS
    counted = ", ".join(map(str, join.counted_iterations)) or "none"
    rows = join.matching.to_pylist()
    matched = sum(r["matched"] for r in rows)
    total = sum(r["counter_run_kernels"] for r in rows)
    spelled = sum(r["spelled_differently"] for r in rows)
    coverage = f"; {join.coverage}" if join.coverage else ""
    return (
        f"counter run {join.counter_levels} (Nsight Compute, kernel replay: its durations are "
        f"discarded), iterations {counted}: {matched} of its {total} kernels matched to the G "
        "run's in launch order within each iteration (own function name and launch shape "
        f"agreeing; {spelled} of them spelled differently by the two tools){coverage}; "
        f"{join.peaks.summary}"
    )


def counter_columns(store: MeasurementStore, spans: pa.Table) -> dict[str, pa.Array] | None:
    """Counter values for the kernel rows of ``spans`` (a run's span table, such as the one a
    reconstruction starts from), by structure: the ``hw_*`` columns of
    ``schema.COUNTER_SUMMARIES``, null on every other row; None without counters."""
    join = counter_join(store)
    if join is None or not join.kernels or not spans.num_rows:
        return None
    kind = spans.column("kind").to_pylist()
    iteration = [it or 0 for it in spans.column("iteration").to_pylist()]
    correlation = [c or 0 for c in spans.column("correlation_id").to_pylist()]
    start = spans.column("start_ns").to_pylist()
    names = spans.column("name").to_pylist()
    order = sorted(
        (i for i, k in enumerate(kind) if k == schema.KIND_KERNEL),
        key=lambda i: (iteration[i], correlation[i], start[i]),
    )
    picked = [{"name": names[i], "iteration": iteration[i]} for i in order]
    values: list[CounterValues | None] = [None] * spans.num_rows
    for i, (_, key, ordinal) in zip(order, keyed(picked, "name"), strict=True):
        values[i] = join.values.get((key, ordinal))
    out: dict[str, pa.Array] = {}
    for name, type_ in schema.COUNTER_SUMMARIES:
        if name == "flops_precision":
            column = [precision_of(v)[0] if v else None for v in values]
            out[name] = pa.array(column, pa.string()).dictionary_encode().cast(type_)
        else:
            out[name] = pa.array([v.get(name) if v else None for v in values], type_)
    return out


def _all_kernel_rates(store: MeasurementStore) -> list[tuple[CountedKernel, Rates]]:
    join = counter_join(store)
    return [(k, _rates(k.values, k.latency_ns, join.peaks)) for k in join.kernels] if join else []


#: The counter run's kernels joined to the timing run's (``counter_join``).
COUNTER_JOIN = Derived("counter_join", _join)
#: Each joined kernel's rates (``_kernel_rates``).
KERNEL_RATES = Derived("kernel_rates", _all_kernel_rates, needs=("counter_join",))
