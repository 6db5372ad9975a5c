"""run.json's fixed-key sections, typed: what a session's parts count and describe (the
levels' loss counts, CUPTI's and the capture arena's counts, the conversion's, the interleaved
iterations, the host, the warm-up, the calibration), and ``RunCounts``, all of them a run
gathers before they go into run.json (``xsp.tracer.capture.run_json``).

Each is a plain JSON object (a TypedDict): run.json holds it as written, key for key.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "ApiOps",
    "ArenaCounts",
    "CalibrationProbe",
    "CalibrationResult",
    "ContinuousMeta",
    "CounterLevelCounts",
    "CuptiCounts",
    "GraphKernels",
    "HostState",
    "InductorCache",
    "InterleaveEntry",
    "InterleaveReport",
    "MonitorCounts",
    "ProgramProfilerSummary",
    "RunCounts",
    "WarmupReport",
]


class ArenaCounts(TypedDict, total=False):
    """The capture arena's counts (run.json's ``arena``): what its header counted (the native
    ``arena_counts`` while it is open, ``read_arena`` from its file) and the records still open
    when it was read."""

    dropped_records: int
    dropped_strings: int
    callback_errors: int
    chunks_used: int
    first_callback_error: str
    open_records: int


class CuptiCounts(TypedDict, total=False):
    """What CUPTI lost (run.json's ``cupti``): records it dropped (None: its stop failed) and
    records xsp could not decode, the native decode's buffer and record counts, why graph nodes
    went unrecorded, and a continuous session's failed starts and resume error."""

    dropped_records: int | None
    undecodable_records: int
    undecodable_by_kind: dict[str, int]  # open: the kinds that could not be decoded
    buffers: int
    buffers_requested: int
    buffers_grown: int
    buffers_completed_while_measuring: int
    records: int
    unknown_records: int
    unpaired_markers: int
    graph_nodes_unrecorded: str
    start_failures: int
    resume_error: str


class ProgramProfilerSummary(TypedDict, total=False):
    """What xsp stepped aside from while the program's own torch.profiler ran (run.json's
    ``program_profiler``, ``xsp.tracer.capture.hooks.coexist``)."""

    starts: int
    activities: list[str]
    memory_iterations: list[int]
    cupti_iterations: list[int]
    line: str
    spans_missing: bool
    errors: list[str]


class CounterLevelCounts(TypedDict):
    """Level counters' own section while it runs (run.json's ``counters``)."""

    iterations_profiled: int
    peaks_measured: dict[str, float]  # open: one per roof measured
    peaks_method: str
    calibration_s: float
    errors: list[str]


class InductorCache(TypedDict):
    """The graphs inductor compiled and saved to its cache with their provenance, and those it
    loaded from there (run.json's ``inductor_cache``)."""

    saved: int
    loaded: int


class MonitorCounts(TypedDict):
    """NVML's samples (run.json's ``monitor``)."""

    samples: int
    unavailable: str | None
    gpm_unavailable: str | None


class ApiOps(TypedDict):
    """How API calls joined their ops (run.json's ``api_ops``)."""

    by_correlation_id: int
    by_time: int
    by_correlation_id_pct: float


class GraphKernels(TypedDict):
    """Kernels of replayed CUDA graphs (run.json's ``graph_kernels``)."""

    replayed: int
    attributed_to_their_node: int


class CalibrationProbe(TypedDict):
    """One probe of the level-F calibration, timed off and on."""

    off_ns: float
    on_ns: float
    records: dict[str, float]  # open: the record kinds the probe wrote


class CalibrationResult(TypedDict, total=False):
    """The level-F calibration (run.json's ``calibration``)."""

    framework_ns_per_record: float
    module_ns_per_call: float
    probes: dict[str, CalibrationProbe]  # open: by probe name
    device: str
    calls: int
    rounds: int
    paired: bool
    framework_ns_per_record_first_iteration: float


class InterleaveReport(TypedDict, total=False):
    """The interleaved iterations (run.json's ``interleaved``): their times, untraced and
    traced, the pairs, the switch's median; or why there were none (``skipped``)."""

    untraced_ms: list[float | None]
    traced_ms: list[float | None]
    pairs: int
    switch_us: float | None
    skipped: str


class InterleaveEntry(TypedDict, total=False):
    """run.json's entry for the interleaved iterations (none when there were none)."""

    interleaved: InterleaveReport


class HostState(TypedDict, total=False):
    """Where the process ran at a moment (run.json's ``host``, by moment): its core, that core's
    clock, its allowed cores, the load, its context switches so far."""

    cpu: int
    cpu_mhz: float
    cpus_allowed: int
    load_1m: float
    voluntary_ctxt_switches: int
    nonvoluntary_ctxt_switches: int


class WarmupReport(TypedDict):
    """run.json's warm-up fields."""

    warmup_minimum: int
    warmup_settled: bool
    warmup_steps_ms: list[float]
    warmup_steps_dropped: int


class ContinuousMeta(TypedDict, total=False):
    """run.json's description of a continuous session (none for a fixed one)."""

    continuous: bool
    duration_s: float | None
    export_every_s: float
    sampling: dict[str, float | int | None]  # the sampling policy's own description


class RunCounts(TypedDict, total=False):
    """All a run counts before run.json takes it: the calibration, the levels' loss counts,
    the conversion's counts (or a continuous session's batches'), inductor's cache, NVML's
    samples, the OTLP spans sent, a continuous session's description."""

    calibration: CalibrationResult
    # the levels' own (``Level.counts()``)
    arena: ArenaCounts
    cupti: CuptiCounts
    ranges_left_open: int
    program_profiler: ProgramProfilerSummary
    counters: CounterLevelCounts
    # the conversion's (``Stored.counts``) or the batches' (``Totals.counts``)
    spans: int
    spans_by_level: dict[str, int]  # open: by level letter
    events_outside_iterations: int
    batches_stored: int
    iterations_stored: int
    next_span_id: int
    iterations_without_op_shapes: int
    api_ops: ApiOps
    graph_kernels: GraphKernels
    memory_events: int
    inductor_cache: InductorCache
    monitor: MonitorCounts
    otlp_spans_sent: int
    # a continuous session's (``ContinuousMeta``)
    continuous: bool
    duration_s: float | None
    export_every_s: float
    sampling: dict[str, float | int | None]  # the sampling policy's own description
