"""Every analysis a measurement supports, under a stable key: the one list that ``xsp analyze``
prints, ``xsp analyze --json`` writes and the HTML report draws; and ``COMPARISONS``, the ones
``xsp diff`` compares between two measurements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from xsp.analysis import samples
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.samples import Samples

__all__ = [
    "COMPARISONS",
    "COUNTER_KEYS",
    "FLOP_KEYS",
    "TOP_KERNELS",
    "TOP_LAYERS",
    "Comparison",
    "Section",
    "Unit",
    "counter_sections",
    "flop_sections",
    "sections",
]

#: Row limits of the analyses that rank (the rest return every row).
TOP_KERNELS = 25
TOP_LAYERS = 20


@dataclass(frozen=True)
class Section:
    """One analysis: ``key`` is stable (the ``--json`` key), ``note`` says what the table leaves
    out or how to read it, ``chart`` makes its plotly figure from the table."""

    key: str
    title: str
    table: pa.Table
    note: str = ""
    chart: Callable[[pa.Table], Any] | None = None
    #: the section stands for analyses this measurement cannot have; ``note`` says why
    absent: bool = False
    #: what ``--json`` carries beside the rows (the memory timeline's series)
    data: dict[str, Any] | None = None
    #: a line the terminal prints above the table (the memory timeline's sparkline)
    text: str = ""


def sections(store: MeasurementStore) -> list[Section]:
    """Every analysis of the measurement, suggestions first; empty tables included. The
    multi-rank analyses (``ranks``, ``communication_overlap``, ``collective_skew``) are there
    only for a multi-rank job."""
    return [
        *_overview(store),
        *_layers(store),
        _source_lines(store),
        *_kernels(store),
        *flop_sections(store),
        *counter_sections(store),
        *_memory(store),
        *_multi_rank(store),
    ]


#: The unit of a compared row's figures: what its columns end in and its verdict's words.
Unit = Literal["ms", "bytes", ""]


@dataclass(frozen=True)
class Comparison:
    """An analysis ``xsp diff`` compares: ``key`` is its ``--json`` key, ``label`` what its rows
    are (``layer``, ``kernel``: the rows' first column), ``samples`` reads each row's
    per-iteration values from one measurement (None where it recorded none); ``needs_replay``
    where those come from the G run and the replay. Declared, not built: a diff reads only the
    samples, never the tables of ``sections``."""

    key: str
    title: str
    label: str
    unit: Unit
    samples: Callable[[MeasurementStore], Samples | None]
    needs_replay: bool = True
    note: str = ""


#: What ``xsp diff`` compares, in the order it lists them.
COMPARISONS = (
    Comparison("step", "Step", "step", "ms", samples.step_samples, needs_replay=False),
    Comparison("replayed_step", "Replayed step", "step", "ms", samples.replayed_step_samples),
    Comparison(
        "layers_gpu",
        "Layers by GPU time (forward + backward)",
        "layer",
        "ms",
        samples.layer_gpu_samples,
        note="the activities each layer's ops launched, G run durations",
    ),
    Comparison(
        "layers_critical_path",
        "Layers by critical-path time (replayed step)",
        "layer",
        "ms",
        samples.layer_path_samples,
    ),
    Comparison(
        "kernels",
        "GPU kernels and copies by name",
        "kernel",
        "ms",
        samples.activity_samples,
        note="calls per iteration beside; 'only before'/'only after': a kernel one side lacks",
    ),
    Comparison(
        "ops",
        "Ops by GPU time",
        "op",
        "ms",
        samples.op_samples,
        note="each outermost op (or autograd node) by its layer and name",
    ),
    Comparison(
        "memory",
        "Memory allocated per layer",
        "layer",
        "bytes",
        samples.memory_samples,
        needs_replay=False,
        note="bytes per iteration, from the F run's allocator events",
    ),
    Comparison(
        "counters",
        "Hardware counters (model aggregate)",
        "metric",
        "",
        samples.counter_values,
        needs_replay=False,
        note="one counted pass each: no per-iteration samples, so no verdict",
    ),
    Comparison(
        "causes",
        "Critical path by cause (replayed step)",
        "cause",
        "ms",
        samples.cause_samples,
    ),
)


def _memory(store: MeasurementStore) -> list[Section]:
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.tables import memory

    found = memory.memory_run(store)
    if found is None:
        return [
            Section(
                "memory",
                "Memory (A4, A7)",
                pa.table({}),
                "no allocator events: "
                + (
                    "its runs with level F recorded none (no memory.parquet)"
                    if any(r.level_set.framework for r in store.runs)
                    else "the measurement has no run with level F"
                ),
                absent=True,
            )
        ]
    note = f"allocator events of the {found[0]} run, per measured iteration"
    return [
        Section(
            "layer_memory",
            "Memory per layer (A4)",
            memory.layer_memory(store),
            note,
            chart=lambda t: bar(t, "layer", "allocated_bytes_per_iteration", "Bytes allocated"),
        ),
        Section(
            "layer_type_memory",
            "Memory per layer type (A7)",
            memory.layer_type_memory(store),
            note,
            chart=lambda t: bar(
                t, "layer_type", "allocated_bytes_per_iteration", "Bytes allocated by layer type"
            ),
        ),
        _memory_timeline(store),
    ]


def _source_lines(store: MeasurementStore) -> Section:
    """The program's lines by the GPU and host time of the ops they called."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.tables import sources

    table = sources.lines(store, limit=TOP_LAYERS)
    if not table.num_rows:
        return Section(
            "source_lines",
            "Program lines",
            table,
            "no op recorded its calling line: the deepest run with level F records them (with "
            "the ops' shapes); older measurements have none",
            absent=True,
        )
    return Section(
        "source_lines",
        "Program lines by the GPU and host time of the ops they called",
        table,
        f"the {TOP_LAYERS} lines (file:line function, the innermost frame outside torch) with "
        "the most GPU time, then host time, per steady iteration of the replayed step; a line's "
        "GPU time is its ops' kernels, its host time what its outermost ops cover",
        # without G (a CPU measurement) every line's GPU time is 0: its host time is the chart
        chart=lambda t: (
            bar(t, "source", "gpu_ms", "GPU time per program line")
            if any(t.column("gpu_ms").to_pylist())
            else bar(t, "source", "host_ms", "Host time per program line")
        ),
    )


def _memory_timeline(store: MeasurementStore) -> Section:
    from xsp.analysis.figures.charts import memory_over_step
    from xsp.analysis.figures.present import human_bytes
    from xsp.analysis.tables import memory_timeline as mt

    timeline = mt.memory_timeline(store)
    assert timeline is not None  # the measurement has allocator events (the caller's check)
    before = timeline.held(timeline.peak)[mt.BEFORE]
    note = (
        f"peak {human_bytes(timeline.peak_bytes)} at {timeline.peak_ms:.3f} ms of iteration "
        f"{timeline.iteration} on {timeline.device} ({timeline.levels} run), in "
        f"{timeline.peak_where}; the layers' allocations still held then, with "
        f"{human_bytes(before)} held from before the step (parameters, gradients, optimizer "
        "state, allocations outside any framework span). The events carry no address: a free "
        "pairs with the latest held allocation of its size, and "
        f"{timeline.frees_with_choice:,} of {timeline.frees:,} frees had blocks of several "
        "layers to pick from"
    )
    return Section(
        "memory_timeline",
        "Memory over the step: layers held at the peak",
        mt.alive_at_peak(timeline),
        note,
        chart=lambda _: memory_over_step(timeline),
        data=mt.series(timeline),
        text=(
            f"allocated, 0-{float(timeline.time_ms[-1]):.1f} ms: {mt.sparkline(timeline, 40)} "
            f"peak {human_bytes(timeline.peak_bytes)}"
        ),
    )


def _step_source(store: MeasurementStore) -> str:
    """Which run's step the reconstruction keeps (its shallowest), as the notes say it."""
    shallowest = min((r.levels for r in store.runs), key=len)
    if shallowest == "M":
        return "the untraced step (M)"
    return f"the {shallowest} run's traced step (no M run: shares are of a slower step)"


def _replayed(store: MeasurementStore) -> bool:
    """True where the layer views read the replay: a run with G, one rank."""
    from xsp.analysis.reconstruction import distributed
    from xsp.analysis.replay import critical_path

    return critical_path.has_gpu(store) and not distributed.is_multi_rank(store)


def _layer_types(store: MeasurementStore) -> Section:
    """A5: by GPU time (forward + backward) on the replay; without G, by forward host time."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.replay import critical_path
    from xsp.analysis.tables import layers

    if _replayed(store):
        return Section(
            "layer_types",
            "Layer types (A5)",
            critical_path.layer_types(store),
            "GPU time of each type's layers, forward + backward, per steady iteration",
            chart=lambda t: bar(t, "layer_type", "gpu_ms_per_iteration", "GPU time by layer type"),
        )
    return Section(
        "layer_types",
        "Layer types (A5)",
        layers.layer_types(store),
        "forward host time in the shallowest run with F (no run with G for GPU time)",
        chart=lambda t: bar(t, "module_type", "latency_ms_per_iteration", "Time by layer type"),
    )


def _gpu_time_per_layer(store: MeasurementStore) -> Section:
    """A13: on the replay, each layer's critical-path time split into GPU and non-GPU."""
    from xsp.analysis.replay import critical_path
    from xsp.analysis.tables import kernels

    if _replayed(store):
        return Section(
            "gpu_time_per_layer",
            "GPU and non-GPU time per layer (A13)",
            critical_path.layer_split(store, limit=TOP_LAYERS),
            f"the {TOP_LAYERS} layers with the most time on the replayed step's critical path: "
            "gpu_ms is its kernels', non_gpu_ms its host work, launches and syncs "
            "(asynchronous GPU work makes 'host minus GPU latency' meaningless)",
        )
    return Section(
        "gpu_time_per_layer",
        "GPU and non-GPU time per layer (A13)",
        kernels.gpu_time_per_layer(store, limit=TOP_LAYERS),
        f"the {TOP_LAYERS} slowest leaf layers",
    )


def _replay_sections(store: MeasurementStore) -> list[Section]:
    """Where the replayed step goes, and layers by GPU time: with level G, single-rank."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.replay import critical_path

    if not _replayed(store):
        return []
    return [
        Section(
            "step_causes",
            "Where the step goes: the replayed step's critical path by cause",
            critical_path.step_causes(store),
            critical_path.verdict(store),
            chart=lambda t: bar(t, "cause", "ms_per_iteration", "Critical path by cause"),
        ),
        Section(
            "layers_by_gpu_time",
            "Layers by GPU time (forward + backward) and critical-path time",
            critical_path.layers(store, limit=TOP_LAYERS),
            f"the {TOP_LAYERS} layers with the most GPU time per steady iteration; share_pct is "
            "of the replayed step",
            chart=lambda t: bar(t, "layer", "gpu_ms", "GPU time per layer (fwd + bwd)"),
        ),
    ]


def _overview(store: MeasurementStore) -> list[Section]:
    """What to change, where the step goes, and what the measurement itself cost and saw."""
    from xsp.analysis.reconstruction.reconstruct import level_overhead
    from xsp.analysis.suggestions.rules import suggest
    from xsp.analysis.tables import summary
    from xsp.analysis.tables.monitor import monitor_summary

    return [
        Section(
            "suggestions",
            "Suggestions",
            suggest(store),
            f"gains are estimates on the reconstruction, not measurements: {_step_source(store)}, "
            "with GPU time from G's durations on the replayed timeline; no gain exceeds the step",
        ),
        *_replay_sections(store),
        Section("level_sets", "Level sets (XSP's leveled runs)", summary.level_sets(store)),
        Section(
            "level_overhead",
            "Overhead each deeper run added, per level",
            level_overhead(store),
            "a verdict of 'noise' means the added time is within twice its standard error of zero",
        ),
        Section(
            "monitor",
            "GPU monitor: SM active and occupancy against NVML's utilization",
            monitor_summary(store),
        ),
    ]


def _layers(store: MeasurementStore) -> list[Section]:
    """The layers (A2, A3, A5) and the library calls they make."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.tables import layers, library

    return [
        _layer_types(store),
        Section("layer_info", "Layer info (A2)", layers.layer_info(store)),
        Section(
            "layer_latency",
            "Layer latency in execution order (A3)",
            layers.layer_latency(store),
            chart=lambda t: bar(t, "module_path", "median_ms", "Layer latency (forward)", 400),
        ),
        Section(
            "library_calls",
            "Library calls (cuBLAS, cuDNN, oneDNN)",
            library.library_calls(store, limit=TOP_LAYERS),
            f"the {TOP_LAYERS} calls with the most time",
        ),
    ]


def _replayed_timeline(store: MeasurementStore) -> tuple[pa.Table | None, str]:
    """The replayed, untraced steps (the reconstruction) that HTA's breakdowns read, and how a
    section says so; None where the measurement has no shallower run to replay against (its
    one run is read as traced)."""
    from xsp.analysis.reconstruction.reconstruct import replayed_timeline

    spans = replayed_timeline(store)
    if spans is None:
        return None, ""
    return spans, "on the replayed, untraced step (the reconstruction), not a traced run"


def _kernels(store: MeasurementStore) -> list[Section]:
    """The kernels (A10, A11), GPU time per layer (A13) and HTA's GPU time breakdowns."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.tables import kernels

    gpu_run = "from the deepest run with level G (traced)"
    timeline, replayed = _replayed_timeline(store)
    hta_run = replayed if timeline is not None else gpu_run
    return [
        Section(
            "kernels_by_name",
            "Kernels by name (A10)",
            kernels.kernels_by_name(store, limit=TOP_KERNELS),
            f"the {TOP_KERNELS} kernels with the most time, {gpu_run}",
            chart=lambda t: bar(t, "kernel", "total_ms_per_iteration", "Kernel time per iteration"),
        ),
        Section(
            "kernels_by_layer",
            "Kernels by layer (A11)",
            kernels.kernels_by_layer(store, limit=TOP_LAYERS),
            f"the {TOP_LAYERS} layers with the most kernel time",
        ),
        _gpu_time_per_layer(store),
        Section(
            "temporal_breakdown",
            "GPU busy and idle per iteration (HTA temporal breakdown)",
            kernels.temporal_breakdown(store, timeline),
            hta_run,
            chart=lambda t: bar(t, "iteration", "busy_pct", "GPU busy % per iteration", 1000),
        ),
        Section(
            "idle_breakdown",
            "Idle time: host wait against kernel wait (HTA)",
            kernels.idle_breakdown(store, timeline),
            hta_run,
        ),
        Section(
            "launch_statistics",
            "Kernel launch statistics (HTA)",
            kernels.launch_statistics(store, timeline),
            hta_run,
        ),
        Section(
            "kernel_duration_distribution",
            "Kernel duration distribution (HTA)",
            kernels.kernel_duration_distribution(store),
            gpu_run,
            chart=lambda t: bar(
                t, "bucket", "share_of_time_pct", "Share of kernel time by duration"
            ),
        ),
    ]


#: The algorithmic-FLOP analyses' keys (present together, or absent with one note).
FLOP_KEYS = ("model_flops", "layer_flops", "op_flops")


#: The FLOP tables' columns that only a GPU run fills (kernel times, the GPU's roof and peak).
GPU_FLOP_COLUMNS = frozenset(
    {
        "kernel_ms_per_iteration",
        "kernels_per_iteration",
        "over_kernels_tflop_per_s",
        "achieved_tflop_per_s",
        "roof",
        "peak_tflop_per_s",
        "peak_source",
        "gpus",
        "mfu_pct",
        "of_peak_pct",
    }
)


def _host_only(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in table.column_names if c in GPU_FLOP_COLUMNS])


def flop_sections(store: MeasurementStore) -> list[Section]:
    """Algorithmic FLOPs from the recorded op shapes, with achieved TFLOP/s and MFU over G's
    kernel durations and M's step; without shapes, one empty ``flops`` section saying so. A run
    without a GPU keeps the FLOPs and the rate over the step, none of the GPU's columns."""
    from xsp.analysis.figures.charts import bar
    from xsp.analysis.replay.critical_path import has_gpu
    from xsp.analysis.tables import utilization

    reason = utilization.unavailable(store)
    if reason is not None:
        return [Section("flops", "FLOPs and utilization", pa.table({}), reason, absent=True)]
    if not has_gpu(store):
        source = (
            "algorithmic FLOPs: the math of the recorded shapes, as torch.utils.flop_counter "
            "counts matmuls, convolutions and attention (norms: fvcore's estimate); no GPU ran"
        )
        return [
            Section(
                "model_flops",
                "Model FLOPs",
                _host_only(utilization.model_flops(store)),
                source + "; over_step_tflop_per_s is the rate over the untraced step",
            ),
            Section(
                "layer_flops",
                "FLOPs per layer",
                _host_only(utilization.layer_flops(store, limit=TOP_LAYERS)),
                f"the {TOP_LAYERS} layers with the most FLOPs, forward + backward; {source}",
            ),
            Section(
                "op_flops",
                "FLOPs per op",
                _host_only(utilization.op_flops(store, limit=TOP_KERNELS)),
                f"the {TOP_KERNELS} op groups with the most FLOPs; {source}",
            ),
        ]
    source = (
        "algorithmic FLOPs: the math of the recorded shapes, as torch.utils.flop_counter counts "
        "matmuls, convolutions and attention (norms: fvcore's estimate); rates over G's kernel "
        "durations, against the tensor-core peak of the operands' dtype (fp32: TF32's)"
    )
    return [
        Section(
            "model_flops",
            "Model FLOPs and utilization (MFU)",
            utilization.model_flops(store),
            source + "; mfu_pct is the untraced step's rate against that peak",
        ),
        Section(
            "layer_flops",
            "FLOPs and achieved TFLOP/s per layer",
            utilization.layer_flops(store, limit=TOP_LAYERS),
            f"the {TOP_LAYERS} layers with the most FLOPs, forward + backward; {source}",
            chart=lambda t: bar(t, "layer", "achieved_tflop_per_s", "Achieved TFLOP/s per layer"),
        ),
        Section(
            "op_flops",
            "FLOPs and achieved TFLOP/s per op",
            utilization.op_flops(store, limit=TOP_KERNELS),
            f"the {TOP_KERNELS} op groups with the most FLOPs; {source}",
        ),
    ]


#: The hardware-counter analyses' keys (present together, or absent with one note).
COUNTER_KEYS = (
    "counter_matching",
    "peaks",
    "kernel_info",
    "kernel_roofline",
    "layer_metrics",
    "layer_roofline",
    "model_metrics",
)


def counter_sections(store: MeasurementStore) -> list[Section]:
    """A8, A9, A12, A14 and A15 with the join and the roofs they rest on; without a counter run
    (or a G run to join it onto), one empty ``hardware_counters`` section whose note says so."""
    from xsp.analysis.figures.roofline import plot_roofline
    from xsp.analysis.tables import counters

    reason = counters.unavailable(store)
    if reason is not None:
        return [
            Section(
                "hardware_counters",
                "Hardware counters (A8, A9, A12, A14, A15)",
                pa.table({}),
                reason,
                absent=True,
            )
        ]
    peaks = counters.store_peaks(store)
    source = f"latency from the G run, counters from the counter run; {peaks.summary}"
    counted = (
        f"{source}; executed_over_algorithmic: the FLOPs the hardware executed over the math's "
        "(matmuls, convolutions, attention; a multi-kernel op's split by executed FLOPs), "
        f"tile_waste_pct its excess; {counters.DRAM_WRITE_NOTE}"
    )
    return [
        Section(
            "counter_matching",
            "Hardware counters: the counter run matched to the G run",
            counters.counter_matching(store),
            counters.matching_note(store),
        ),
        Section(
            "peaks", "Roofs: peak FLOP/s and DRAM bandwidth", counters.peaks(store), peaks.summary
        ),
        Section("kernel_info", "Kernel info (A8)", counters.kernel_info(store), counted),
        Section(
            "kernel_roofline",
            "Kernel roofline (A9)",
            counters.kernel_roofline(store),
            "kernels that did floating-point work; " + source,
            chart=lambda t: plot_roofline(t, peaks, "Kernel roofline (A9)"),
        ),
        Section(
            "layer_metrics", "GPU metrics per layer (A12)", counters.layer_metrics(store), counted
        ),
        Section(
            "layer_roofline",
            "Layer roofline (A14)",
            counters.layer_roofline(store),
            source,
            chart=lambda t: plot_roofline(t, peaks, "Layer roofline (A14)"),
        ),
        Section(
            "model_metrics",
            "The model's aggregate and bound (A15)",
            counters.model_metrics(store),
            counted,
        ),
    ]


def _multi_rank(store: MeasurementStore) -> list[Section]:
    """The analyses of a multi-rank job; none for a single-rank measurement."""
    from xsp.analysis.figures.charts import bar, stacked_bars
    from xsp.analysis.reconstruction import distributed

    if not distributed.is_multi_rank(store):
        return []
    clock = "ranks are compared on their hosts' clocks (one host: one clock)"
    return [
        Section(
            "ranks",
            "Ranks: step per rank, measured and reconstructed; stragglers",
            distributed.rank_summary(store),
            "steps from the shallowest run with M and from the leveled reconstruction; "
            "collectives and waits from the shallowest run that recorded collectives",
            chart=lambda t: bar(
                t, "rank", "wait_ms_per_iteration", "Time each rank waited for the others"
            ),
        ),
        Section(
            "communication_overlap",
            "Communication against computation per rank, and their overlap (HTA)",
            distributed.communication_overlap(store),
            "overlap_pct is the share of communication time with computation beside it; "
            "exposed communication has none",
            chart=lambda t: stacked_bars(
                t,
                "rank",
                [
                    "compute_ms_per_iteration",
                    "exposed_communication_ms_per_iteration",
                ],
                "Computation and exposed communication per rank",
            ),
        ),
        Section(
            "collective_skew",
            "Collectives across ranks: skew, wait and the straggler",
            distributed.collective_skew(store),
            "matched across ranks by ordinal among each rank's c10d calls of the iteration; "
            f"the straggler arrived last and the others waited for it; {clock}",
        ),
    ]
