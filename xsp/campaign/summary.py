"""One job's measurement -> the facts the campaign report compares across models."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.suggestions.rules import LAUNCH_BOUND_BUSY_PCT, SHORT_KERNEL_US
from xsp.campaign.records import CounterSummary, JobRecord, JobSummary

__all__ = ["COMPUTE_BOUND_BUSY_PCT", "job_line", "shares_text", "summarize"]

#: Above this GPU busy share of its true latency a step is bound by the GPU itself; below the
#: launch-bound rule's share, with short kernels, it waits on launches (analysis.suggestions).
COMPUTE_BOUND_BUSY_PCT = 80.0


def summarize(run_dir: Path) -> JobSummary:
    """The job's facts: its step (``latency_ms``) is the replayed, untraced step where its
    measurement has a replay (``step_source`` "replayed"; M's own median stays in
    ``measured_latency_ms``), else its shallowest run's (``step_source`` "M", or "traced" where
    that run traced); its GPU figures come from the same replayed timeline (``gpu_timeline``
    "replayed"), or the traced G run's where there is none ("traced")."""
    from xsp.analysis.suggestions.rules import suggest
    from xsp.analysis.tables import layers
    from xsp.analysis.tables.monitor import monitor_summary

    store = MeasurementStore(run_dir)
    out = _steps(store)
    types = layers.layer_types(store).to_pylist()
    out["top_layer_types"] = [
        [r["module_type"], round(r["share_pct"], 1)] for r in types[:3] if r["share_pct"]
    ]
    out["conv_share_pct"] = sum(
        r["share_pct"] or 0.0 for r in types if "Conv" in str(r["module_type"])
    )
    has_gpu = bool(store.sql("SELECT count(*) AS n FROM spans WHERE level = 'gpu'")["n"][0].as_py())
    if has_gpu:
        out.update(_gpu(store, out.get("latency_ms")))
    monitor = monitor_summary(store).to_pylist()
    if monitor:
        # the shallowest run's samples: the GPU as the uninstrumented workload drives it
        out["monitor"] = {k: v for k, v in monitor[0].items() if isinstance(v, (int, float))}
    out["suggestions"] = [r["rule"] for r in suggest(store).to_pylist()]
    counted = _counters(store)
    if counted:
        out["counters"] = counted
    return out


def _steps(store: MeasurementStore) -> JobSummary:
    """Each level set's median step (M's untraced, the others' traced), and the job's step:
    the replayed one where the measurement has a replay, else its shallowest run's."""
    from xsp.analysis.reconstruction.reconstruct import has_replay
    from xsp.analysis.replay import replay
    from xsp.analysis.tables.summary import level_sets

    step_ms = {
        r["levels"]: r["step_median_ms"]
        for r in level_sets(store).to_pylist()
        if r["step_median_ms"] is not None
    }
    shallowest = min(step_ms, key=len) if step_ms else None
    measured = step_ms.get(shallowest) if shallowest else None
    replayed = replay(store).result().step_ms if has_replay(store) else None
    latency = replayed if replayed is not None else measured
    source = "replayed" if replayed is not None else "M" if shallowest == "M" else "traced"
    batch = int(store.runs[0].resource.get("xsp.batch_size", 1) or 1)
    return JobSummary(
        step_ms=step_ms,
        latency_ms=latency,
        measured_latency_ms=measured,
        step_source=source if latency is not None else None,
        throughput_per_s=batch / (latency / 1e3) if latency else None,
    )


def _gpu(store: MeasurementStore, latency: float | None) -> JobSummary:
    """GPU busy and launch figures on the replayed timeline, each iteration's busy share of its
    own replayed step; without a replay, the traced G run's busy time over the job's step (G's
    own step is stretched by tracing, so its busy share would understate the GPU's)."""
    from xsp.analysis.reconstruction.reconstruct import replayed_timeline
    from xsp.analysis.tables import kernels

    timeline = replayed_timeline(store)
    busy = kernels.temporal_breakdown(store, timeline).to_pylist()
    busy_ms = statistics.median(r["gpu_busy_ms"] for r in busy) if busy else None
    if timeline is not None:
        busy_pct = statistics.median(r["busy_pct"] for r in busy) if busy else None
    else:
        busy_pct = min(100.0, 100.0 * busy_ms / latency) if busy_ms and latency else None
    launch = (kernels.launch_statistics(store, timeline).to_pylist() or [{}])[0]
    return JobSummary(
        gpu_timeline="replayed" if timeline is not None else "traced",
        gpu_busy_ms=busy_ms,
        gpu_busy_pct=busy_pct,
        median_kernel_us=launch.get("median_kernel_us"),
        kernels=launch.get("kernels", 0),
        top_kernels=[
            [r["kernel"][:80], round(r["share_pct"], 1)]
            for r in kernels.kernels_by_name(store, limit=3).to_pylist()
        ],
        bound=_bound(busy_pct, launch.get("median_kernel_us")),
    )


def job_line(record: JobRecord, finished: int, total: int, elapsed_s: float) -> str:
    """One finished job in a campaign's log, for example ``[12/105 41 s] timm-x__infer__b1
    ok 3.4 s: M 1.0 s, MF 1.7 s, MFLG 1.1 s``: its wall time and each level-set process's."""
    processes = ", ".join(
        f"{levels} {float(seconds.get('total') or 0.0):.1f} s"
        for levels, seconds in (record.get("seconds_by_level_set") or {}).items()
        if isinstance(seconds, dict)
    )
    wall = record.get("wall_s")
    took = f" {float(wall):.1f} s" if isinstance(wall, (int, float)) else ""
    return (
        f"[{finished}/{total} {elapsed_s:.0f} s] {record.get('job')} {record.get('status')}{took}"
        + (f": {processes}" if processes else "")
    )


def _counters(store: MeasurementStore) -> CounterSummary | None:
    """A15 of a job with a counter run, and the roofs it was set against (for the campaign's
    cross-model roofline)."""
    from xsp.analysis.tables import counters

    rows = counters.model_metrics(store).to_pylist()
    if not rows:
        return None
    peaks = counters.store_peaks(store)
    found = rows[0]
    return CounterSummary(  # what a job summary keeps of A15, then the roofs
        work_gflop=found.get("work_gflop"),
        fp32_gflop=found.get("fp32_gflop"),
        tf32_gflop=found.get("tf32_gflop"),
        bf16_gflop=found.get("bf16_gflop"),
        fp16_gflop=found.get("fp16_gflop"),
        tensor_share_pct=found.get("tensor_share_pct"),
        dram_read_bytes=found.get("dram_read_bytes"),
        dram_write_bytes=found.get("dram_write_bytes"),
        arithmetic_intensity_flop_per_byte=found.get("arithmetic_intensity_flop_per_byte"),
        achieved_gflop_per_s=found.get("achieved_gflop_per_s"),
        attainable_gflop_per_s=found.get("attainable_gflop_per_s"),
        of_attainable_pct=found.get("of_attainable_pct"),
        kernel_ms=found.get("kernel_ms"),
        precision=found.get("precision"),
        roof=found.get("roof"),
        bound=found.get("bound"),
        device=peaks.device,
        peaks=dict(peaks.values),
        peak_sources=dict(peaks.sources),
        peaks_measured=dict(peaks.measured),
    )


def _bound(busy_pct: float | None, median_kernel_us: float | None) -> str | None:
    if busy_pct is None:
        return None
    if busy_pct >= COMPUTE_BOUND_BUSY_PCT:
        return "compute-bound"
    if busy_pct < LAUNCH_BOUND_BUSY_PCT and (median_kernel_us or 0) < SHORT_KERNEL_US:
        return "launch-bound"
    return "mixed"


def shares_text(value: list[Any]) -> str:
    """``[["Conv2d", 45.3], ...]`` (a summary's top-N lists) -> ``Conv2d (45.3%), ...``."""
    return ", ".join(f"{v[0]} ({v[1]}%)" if isinstance(v, list) else str(v) for v in value)
