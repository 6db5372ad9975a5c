"""A campaign job's result record (``DIR/jobs/<job>.json``), typed: what ``run_job`` writes and
the store, the report, the diff and the log read. The file holds the same JSON object as
before; these types name its keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from xsp.core.store import ProgramEnd, Status

__all__ = ["UNSTORED", "CounterSummary", "JobRecord", "JobSummary", "RunRecord", "unstored"]


#: The reason of a job whose run the campaign's store refused (an object store's publish
#: failed): the run is gone, so a rerun runs the job again.
UNSTORED = "unstored"


class CounterSummary(TypedDict, total=False):
    """A15 of a job with a counter run (what ``summary._counters`` keeps), and the roofs it was set
    against (for the campaign's cross-model roofline)."""

    work_gflop: float | None
    fp32_gflop: float | None
    tf32_gflop: float | None
    bf16_gflop: float | None
    fp16_gflop: float | None
    tensor_share_pct: float | None
    dram_read_bytes: float | None
    dram_write_bytes: float | None
    arithmetic_intensity_flop_per_byte: float | None
    achieved_gflop_per_s: float | None
    attainable_gflop_per_s: float | None
    of_attainable_pct: float | None
    kernel_ms: float | None
    precision: str | None
    roof: str | None
    bound: str | None
    device: str | None
    peaks: dict[str, float]
    peak_sources: dict[str, str]
    peaks_measured: dict[str, float]


class JobSummary(TypedDict, total=False):
    """What one job measured (``summary.summarize``): the facts the report compares. The GPU's
    keys are there only where the job traced the GPU, ``monitor`` where it sampled it and
    ``counters`` where it had a counter run."""

    step_ms: dict[str, float]  # level set -> median step (M untraced, the others traced)
    latency_ms: float | None  # the job's step: replayed where it has a replay (step_source)
    measured_latency_ms: float | None  # the shallowest run's median step, as measured
    step_source: str | None  # "replayed", "M" (measured untraced) or "traced"
    throughput_per_s: float | None  # batch / latency_ms
    top_layer_types: list[list[Any]]  # [module type, share %], the three largest
    conv_share_pct: float
    gpu_timeline: str  # "replayed" or "traced": the timeline the GPU figures come from
    gpu_busy_ms: float | None
    gpu_busy_pct: float | None
    median_kernel_us: float | None
    kernels: int
    top_kernels: list[list[Any]]  # [kernel name, share %], the three largest
    bound: str | None
    #: open keys: the monitor's numeric columns by name, as ``monitor_summary`` has them
    monitor: dict[str, float]
    suggestions: list[str]
    counters: CounterSummary


class RunRecord(TypedDict, total=False):
    """A level set's run as a job's record keeps it: its manifest entry's status and reasons,
    how its program ended, CUPTI's counts, and ``counters`` only where it has them."""

    levels: str | None
    status: Status | None
    status_reasons: list[str] | None
    program: ProgramEnd | None
    cupti: Mapping[str, Any] | None
    counters: Mapping[str, Any]


class JobRecord(TypedDict, total=False):
    """A job's result: which job, where and when it ran, how it ended (status, reason, error),
    its level sets' runs and seconds, and, when it succeeded, its summary. ``host``, ``node``
    and ``attempt``: the Ray worker's host and node that ran it, and which attempt that was
    (2 and up: Ray retried it after losing a node or worker)."""

    job: str
    model: str
    mode: str
    batch_size: int
    gpu: int | str | None
    started: float
    status: str
    reason: str | None
    error: str | None
    wall_s: float
    seconds_by_level_set: dict[str | None, Mapping[str, float] | None]
    runs: list[RunRecord]
    skipped: list[str]
    summary: JobSummary
    host: str
    node: str
    attempt: int


def unstored(record: JobRecord, exc: BaseException) -> JobRecord:
    """``record`` of a job whose run the store refused: failed, reason ``unstored``, the
    store's one-line error, and no summary (its run is not there to back it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    error = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    failed = record.copy()
    failed.pop("summary", None)  # its run is not there to back it
    failed["status"], failed["reason"], failed["error"] = "failed", UNSTORED, error[-500:]
    return failed
