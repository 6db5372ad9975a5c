"""Replay reconstruction: a causal model of the untraced step, checked against what M measured.

Fitting the traced runs' spans into M's step by shrinking gaps cannot be true for asynchronous GPU
work (a host timeline with MF's op durations put ResNet-50's backward launches 6 ms after the
kernels they launch). So the step is replayed, as trace-replay simulators do (Daydream, dPRO,
Lumos), from the deepest run's dependency graph with each node's time taken from the shallowest
run that measures it:

1. **Nodes and edges.** Host spans (F ops, modules, autograd nodes; L library and CUDA calls) in
   program order; launch -> activity by CUDA correlation id (an activity's parent is its launch
   call); stream order per (device, stream); a stream's wait on an event (``cudaStreamWaitEvent``)
   holds that stream's later work until the work queued on the event's stream before the event's
   record has ended; a synchronizing call waits for the work it names (a stream sync: that
   stream's; an event sync: the work before the event's record; device syncs and blocking copies:
   every activity launched before it); a collective ends once the last rank has arrived, plus its
   own transfer, joining the ranks of an iteration (``xsp.analysis.replay_collectives``: gloo's
   range on the host, where a thread that waited for it waits for its replayed end; NCCL's kernel
   on the GPU). Host threads run in turn: the step's thread hands its work to autograd's thread
   during backward and waits for it, so the threads' spans form one program order (two threads
   working at once would be serialized).
2. **Host times without the tracer's cost** (``xsp.analysis.host_timeline``). The host's timeline
   is the shallowest F run's, each time moved back by the calibrated cost of its own rank's F
   records that started and ended before it in its step (the level-set process timed a small
   training step in rounds of F off and on: ``run.json``'s ``calibration``); the deep run's
   spans take those times by structural key, and its L calls are placed between them by
   interpolation; children stay inside their parents. A sync keeps only what it took after the
   work it awaited ended.
3. **Replay.** The host issues in that order; a launch enqueues its activity at the launch
   call's end; a stream runs its activities in order, each once it is launched and the one before
   it has ended, with its G-run duration; a sync blocks the host until the awaited work has ended,
   and everything after it moves by that wait. The step ends at its marker's replayed time or
   when the GPU is done, whichever is later (M's step is bounded by a device sync). The ranks of
   an iteration replay together, again with the replayed arrivals until they hold. By
   construction no activity starts before its launch, none overlaps another of its stream, and
   all lie inside their step.
4. **Critical path.** Walked back from the step's end: an activity that waited for the one before
   it on its stream hands the path to it; one that waited for its launch hands it to the host at
   that launch; a sync that waited hands it to the activity it waited for; a thread's wait for its
   collectives is communication. Every nanosecond of the step gets one cause: GPU compute, host
   work, launch overhead (launch calls), sync (a sync's return after the GPU finished), data
   loading or communication.
5. **What-if** (``WhatIf``, ``what_if``). A fix is an edit of the graph, replayed: activities that
   take no time, host spans whose time leaves their own step's host clock (another rank's
   step, on the same clock, keeps its times), or every activity launched at
   the step's start; the suggestions' gains are the replayed step less the edited one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis import fit_cache
from xsp.analysis.host_timeline import (
    Calibration,
    host_timeline,
    largest_cost_factor,
    measured_steps,
    owning_steps,
    steady,
    step_ranks,
)
from xsp.analysis.m_interval import m_interval
from xsp.analysis.matching import keyed, tree_depths
from xsp.analysis.replay_checks import ReplayChecks, check_replay
from xsp.analysis.replay_collectives import Collectives, find_collectives, nccl_kernels
from xsp.analysis.store import MeasurementStore, text_in, texts
from xsp.analysis.untraced import untraced_steps
from xsp.core import schema
from xsp.core.columns import arrow, numbers, rows_table
from xsp.core.intervals import find_rows, inherit, order_by, stab

#: CUDA calls that block the host until GPU work has ended (a blocking copy waits for its own copy
#: and the work queued before it; a stream or event sync for the work of the stream or event it
#: names, where level L recorded it, else for every stream).
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoD_v2",
        "cuMemcpy",
    }
)
#: A stream's wait on an event (the cross-stream edge: the waiting stream's later work starts
#: once the work queued on the event's stream before its record has ended), and the record.
WAIT_CALLS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"})
RECORD_CALLS = frozenset(
    {
        "cudaEventRecord",
        "cudaEventRecordWithFlags",
        "cuEventRecord",
        "cuEventRecord_ptsz",
        "cuEventRecordWithFlags",
        "cuEventRecordWithFlags_ptsz",
    }
)

#: Causes on the critical path, in the order tables list them.
CAUSE_GPU = "gpu compute"
CAUSE_HOST = "host work"
CAUSE_LAUNCH = "launch overhead"
CAUSE_SYNC = "synchronization"
CAUSE_DATA = "data loading"
CAUSE_COMMUNICATION = "communication"
CAUSES = (CAUSE_GPU, CAUSE_HOST, CAUSE_LAUNCH, CAUSE_SYNC, CAUSE_DATA, CAUSE_COMMUNICATION)
#: The verdict each cause gives when it holds the largest share of the step.
VERDICTS = {
    CAUSE_GPU: "GPU-bound",
    CAUSE_HOST: "host-bound",
    CAUSE_LAUNCH: "launch-bound",
    CAUSE_SYNC: "sync-bound",
    CAUSE_DATA: "input-bound",
    CAUSE_COMMUNICATION: "communication-bound",
}


@dataclass
class Replay:
    """The replayed timeline of the deep run's spans and where each step's time went.

    ``start_ns``/``dur_ns`` hold every row of ``spans`` (the deep run's), replayed; ``steps``
    one row per iteration; ``path`` the critical path's segments (``row`` is the span charged)."""

    spans: pa.Table
    parent: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray
    calibration: Calibration
    measured_run: str | None  # the run whose step the replay is checked against (M)
    measured_step_ms: float | None  # its median over its steady steps
    steps: pa.Table  # iteration, replayed_ms, measured_ms, deep_ms, error_pct, steady
    path: pa.Table  # iteration, cause, row, dur_ns
    checks: dict[str, int] = field(default_factory=dict)
    #: the replayed step against the F process's held-out untraced steps and M's interval
    verified: ReplayChecks | None = None
    # per rank's step of a job whose collectives span ranks: the time its collectives waited
    # for the last rank to arrive (iteration, rank, wait_ns)
    collective_waits: list[dict[str, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """``xsp analyze --json``'s ``reconstruction.replay``."""
        rows = self.steps.to_pylist()
        replayed = _median_steady(rows)
        measured = self.measured_step_ms
        error = (
            100.0 * (replayed - measured) / measured if replayed is not None and measured else None
        )
        return {
            "step_ms": replayed,
            "measured_step_ms": measured,
            "measured_run": self.measured_run,
            "error_pct": error,
            "iterations": rows,
            "unsteady_iterations": [r["iteration"] for r in rows if not r["steady"]],
            "calibration": self.calibration.as_dict(),
            "checks": dict(self.checks),
            **(self.verified or ReplayChecks()).as_dict(),
            "collective_waits": list(self.collective_waits),
            "median_collective_wait_ms": self.median_waits_ms(),
        }

    def median_waits_ms(self) -> dict[int, float]:
        """Each rank's median wait a step (ms) for the last rank to arrive at its collectives."""
        waits: dict[int, list[int]] = {}
        for row in self.collective_waits:
            waits.setdefault(row["rank"], []).append(row["wait_ns"])
        return {rank: float(np.median(ns)) / 1e6 for rank, ns in sorted(waits.items())}

    def own_steps_ms(self) -> dict[int, float]:
        """Each rank's median own time a step (ms, over the steady steps): its replayed step
        less its wait for the last rank to arrive at its collectives, what it would take at its
        own pace."""
        kind = texts(self.spans.column("kind"))
        iteration = numbers(self.spans.column("iteration"), null=-1).astype(np.int64, copy=False)
        ranks = step_ranks(self.spans)
        steady = set(
            pc.filter(self.steps.column("iteration"), self.steps.column("steady")).to_pylist()
        )
        waits = {(w["iteration"], w["rank"]): w["wait_ns"] for w in self.collective_waits}
        own: dict[int, list[int]] = {}
        for row in np.nonzero(kind == "step")[0].tolist():
            step, rank = int(iteration[row]), int(ranks[row])
            if step in steady and rank >= 0:
                wait = waits.get((step, rank), 0)
                own.setdefault(rank, []).append(int(self.dur_ns[row]) - wait)
        return {rank: float(np.median(ns)) / 1e6 for rank, ns in sorted(own.items())}


def _median_steady(rows: list[dict[str, Any]]) -> float | None:
    kept = [r["replayed_ms"] for r in rows if r["steady"]]
    return float(np.median(kept)) if kept else None


def replay(store: MeasurementStore) -> Replay:
    """Replay every iteration of the measurement (see the module's algorithm); once per store."""
    if "replay" not in store.memo:
        store.memo["replay"] = _replay(store)
    return store.memo["replay"]


@dataclass(frozen=True)
class WhatIf:
    """An edit of the replay's graph (step 5): what a fix would change, replayed.

    ``model`` says what the edit assumes, in words; ``drop_activities`` picks GPU activities
    that take no time, ``drop_host`` host spans whose time leaves the host timeline (what runs
    after them moves earlier), ``keep_host`` the share of its time each host span keeps (1: all
    of it; its last part leaves the timeline, as a dropped span's whole time does), all from the
    deep run's spans; ``launch_at_step_start`` launches every activity at the step's start (one
    CUDA graph for the whole step)."""

    model: str
    drop_activities: Callable[[pa.Table], np.ndarray] | None = None
    drop_host: Callable[[pa.Table], np.ndarray] | None = None
    keep_host: Callable[[pa.Table], np.ndarray] | None = None
    launch_at_step_start: bool = False


def what_if(store: MeasurementStore, edit: WhatIf) -> float | None:
    """The replayed step (median of the steady iterations, ms) with ``edit`` applied; once per
    store and edit. The gain of a fix is ``replay(store).summary()["step_ms"]`` minus this."""
    memo = ("what_if", edit)
    if memo not in store.memo:
        result = _replay(store, edit)
        steps = result.steps
        kept = numbers(steps.column("steady")).astype(bool, copy=False)
        replayed = numbers(steps.column("replayed_ms"), null=np.nan).astype(np.float64, copy=False)[
            kept
        ]
        store.memo[memo] = float(np.median(replayed)) if len(replayed) else None
    return store.memo[memo]


def _without(times: np.ndarray, cut_start: np.ndarray, cut_end: np.ndarray) -> np.ndarray:
    """``times`` with the union of the [cut_start, cut_end) intervals taken out of the clock:
    a time moves back by the cut time before it (a time inside a cut lands on its start)."""
    if not len(cut_start):
        return times
    order = np.argsort(cut_start, kind="stable")
    begin, end = cut_start[order], np.maximum.accumulate(cut_end[order])
    fresh = np.ones(len(begin), dtype=bool)
    fresh[1:] = begin[1:] > end[:-1]
    group = np.cumsum(fresh) - 1
    merged_begin = begin[fresh]
    merged_end = np.zeros(len(merged_begin), dtype=np.int64)
    np.maximum.at(merged_end, group, end)
    before = np.concatenate(([0], np.cumsum(merged_end - merged_begin)))
    i = np.searchsorted(merged_begin, times, side="right") - 1
    inside = np.clip(
        times - merged_begin[np.maximum(i, 0)], 0, (merged_end - merged_begin)[np.maximum(i, 0)]
    )
    return times - np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)


def _cut_per_step(
    warped_start: np.ndarray, warped_end: np.ndarray, keep: np.ndarray, members: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The host timeline with each span's time past the share it ``keep``s taken out, each step
    by its own cuts (its untraced gaps too): the ranks of an iteration share a clock, and one
    rank's cut is no other rank's time. Each step keeps its start."""
    out_start, out_end = warped_start.copy(), warped_end.copy()
    for rows in members:  # each step's rows
        mine = rows[keep[rows] < 1.0]
        if not len(mine):
            continue
        length = warped_end[mine] - warped_start[mine]
        cut_start = warped_start[mine] + np.round(keep[mine] * length).astype(np.int64)
        cut_end = warped_end[mine]
        out_start[rows] = _without(warped_start[rows], cut_start, cut_end)
        out_end[rows] = _without(warped_end[rows], cut_start, cut_end)
    return out_start, out_end


@dataclass(frozen=True)
class _Graph:
    """What every replay of a store shares (steps 1 and 2): the deep run's spans as arrays, each
    step's rows and the measured device delays; built once (``_graph``), never written to: the
    replay and each what-if copy what they edit."""

    deep_index: int
    deep: pa.Table
    parent: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    warped_start: np.ndarray
    warped_end: np.ndarray
    calibration: Calibration
    is_call: np.ndarray  # CUDA runtime and driver calls (what launches an activity)
    gpu: np.ndarray
    is_sync: np.ndarray
    steps: np.ndarray
    owner: np.ndarray
    members: list[np.ndarray]  # each step's rows
    base: np.ndarray
    causes: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    lane: np.ndarray  # each activity's (device, stream) as a number (-1: not an activity)
    named: _Named
    latency: np.ndarray
    gap: np.ndarray
    iteration: np.ndarray
    collectives: Collectives  # collectives across ranks (gloo's, NCCL's), the host's waits


def _graph(store: MeasurementStore) -> _Graph:
    """The replay's graph, once per store: the replay and every what-if read the same one."""
    if "replay_graph" not in store.memo:
        store.memo["replay_graph"] = _fitted_graph(store)
    found: _Graph = store.memo["replay_graph"]
    return found


#: The replay of the F run's steps may exceed that process's own untraced steps by this share
#: before F's cost per record is fitted to them (``_fitted_graph``).
FIT_TOLERANCE_PCT = 1.0
#: Bisection rounds of the fit (the factor to 1/256 of its range).
FIT_ROUNDS = 8
#: The most the fit raises the probe's cost by. A workload's records cost up to a few times the
#: probe's (3.2x for ResNet-50 b64 channels_last training on the H200); a fit past this explains
#: with F's cost what the process's own drift did (on a loaded dev machine, an MF process's
#: untraced steps took 94 ms and its traced ones 864 ms, which a 1,292x cost "fitted" by
#: replaying a host that took no time at all).
FIT_MAX_FACTOR = 8.0


def _fitted_graph(store: MeasurementStore) -> _Graph:
    """The graph, with F's cost per record fitted to the F process's own untraced steps
    (``xsp.analysis.untraced``: the iterations interleaved with its traced ones, else its
    warm-up's) where the probe's figure replays them off by more than ``FIT_TOLERANCE_PCT``
    (step 2).

    The probe is a small network's step; a large workload's records can cost more each (on the
    H200, ResNet-50 b64 channels_last training replayed 12% above the MF process's untraced
    warm-up steps with the probe's 2.6 µs a record, its forward ops 35% slower in two of three
    traced steps), or less (the GPT LM's, 0.7 of the probe's). Where the replay of the F run's
    steps exceeds that process's own untraced steps, the cost is raised, by bisection, to the
    least at which it does so no more, up to ``FIT_MAX_FACTOR`` times the probe's; where it
    falls short of them, lowered to the most at which it reaches them (``_lowered``). It is left
    as the probe measured it where even a host that takes no time replays too slowly, or one
    that keeps all of F's cost too fast (the GPU side is then off), or where only more than
    ``FIT_MAX_FACTOR`` would do (the process drifted): the in-process check says so. M is not
    read, so the check against M stays free of it. The outcome is kept in the store for the
    next reader (``xsp.analysis.fit_cache``)."""
    graph = _base_graph(store)
    fit = _kept_fit(store, graph, None)
    if fit is None or fit.factor is None:
        return graph
    return replace(
        _with_cost(store, graph, fit.factor),
        calibration=graph.calibration.scaled(fit.factor, fit.why or ""),
    )


def _base_graph(store: MeasurementStore) -> _Graph:
    """The graph with the probe's cost (as checked), once per store: the fits start from it."""
    if "replay_base_graph" not in store.memo:
        store.memo["replay_base_graph"] = _build_graph(store)
    found: _Graph = store.memo["replay_base_graph"]
    return found


def _kept_fit(
    store: MeasurementStore, graph: _Graph, iterations: frozenset[int] | None
) -> fit_cache.Fit | None:
    """The fit of F's cost to the F process's own untraced steps before ``iterations`` (None:
    every one), read from the store's cache or fitted and kept; None where there is nothing to
    fit to (no untraced steps, no probe)."""
    own = untraced_steps(store)
    probe = graph.calibration
    if own is None or not probe.op_ns:
        return None
    untraced = own.ms(iterations)
    if untraced is None:
        return None
    # what the fit starts from besides the runs: its settings and the probe's cost as checked
    settings = (FIT_TOLERANCE_PCT, FIT_ROUNDS, FIT_MAX_FACTOR, probe, sorted(iterations or ()))
    kept_as = fit_cache.key(store, settings)
    fit = fit_cache.read(store, kept_as)
    if fit is None:
        fit = _fit(store, graph, untraced, iterations)
        fit_cache.write(store, kept_as, fit)
    return fit


def held_out_steps(store: MeasurementStore) -> dict[int, float] | None:
    """Each paired iteration's replayed step (ms, steady ones only) with F's cost fitted to the
    pairs of the other fold (``Untraced.folds``): what the in-process check compares with the
    untraced steps. None with fewer than two pairs."""
    own = untraced_steps(store)
    folds = own.folds() if own is not None else None
    if folds is None:
        return None
    graph = _base_graph(store)
    found: dict[int, float] = {}
    for fit_on, check_on in (folds, folds[::-1]):
        fit = _kept_fit(store, graph, fit_on)
        factor = fit.factor if fit is not None and fit.factor is not None else 1.0
        rows = _replay(store, _STEPS_ONLY, _with_cost(store, graph, factor)).steps.to_pylist()
        found.update(
            (r["iteration"], r["replayed_ms"])
            for r in rows
            if r["steady"] and r["iteration"] in check_on
        )
    return found


def _with_cost(store: MeasurementStore, graph: _Graph, factor: float) -> _Graph:
    """``graph`` with the host's times under the probe's cost times ``factor``."""
    if factor == 1.0:  # only the host's times change with the cost
        return graph
    scaled = graph.calibration.scaled(factor, "fitted")
    _, warped_start, warped_end, _ = host_timeline(store, scaled)
    return replace(graph, warped_start=warped_start, warped_end=warped_end)


def _fit(
    store: MeasurementStore, graph: _Graph, untraced: float, iterations: frozenset[int] | None
) -> fit_cache.Fit:
    """The factor on the probe's cost at which the replay of the F run's steps (those of
    ``iterations``; None: all) comes within ``FIT_TOLERANCE_PCT`` of ``untraced``, by bisection
    (``_fitted_graph``): raised where the probe's cost replays them too slowly, lowered where
    it replays them too fast (its records cost less than the workload's: the replayed step
    grows as less is taken off the host)."""

    def replayed(factor: float) -> float:
        steps = _replay(store, _STEPS_ONLY, _with_cost(store, graph, factor)).steps.to_pylist()
        rows = [r for r in steps if iterations is None or r["iteration"] in iterations]
        return _median_steady(rows) or 0.0

    target = untraced * (1 + FIT_TOLERANCE_PCT / 100)
    floor = untraced * (1 - FIT_TOLERANCE_PCT / 100)
    with_probe = replayed(1.0)
    if with_probe < floor:
        return _lowered(replayed, floor, untraced, with_probe)
    if with_probe <= target:
        return fit_cache.Fit(None)
    low = 1.0
    high = largest = largest_cost_factor(store, graph.calibration)
    for _ in range(FIT_ROUNDS):
        if low >= FIT_MAX_FACTOR:
            break  # the least is past it already
        middle = (low + high) / 2
        if replayed(middle) > target:
            low = middle
        else:
            high = middle
    # past FIT_MAX_FACTOR it is not F's cost but the process's drift, which the in-process
    # check reports; and a bracket that never came down from the largest is checked there
    # last, not first (one replay fewer where it holds): a host that takes no time at all may
    # still be too slow
    if high > FIT_MAX_FACTOR or (high == largest and replayed(high) > target):
        return fit_cache.Fit(None)
    return fit_cache.Fit(high, _fitted_why(untraced, with_probe))


def _lowered(
    replayed: Callable[[float], float], floor: float, untraced: float, with_probe: float
) -> fit_cache.Fit:
    """The greatest factor below 1 at which the replay reaches ``floor``; none where even a
    host that keeps all of F's cost replays faster (the GPU side is then off)."""
    if replayed(0.0) < floor:
        return fit_cache.Fit(None)
    low, high = 0.0, 1.0  # replayed(low) >= floor > replayed(high)
    for _ in range(FIT_ROUNDS):
        middle = (low + high) / 2
        if replayed(middle) >= floor:
            low = middle
        else:
            high = middle
    # never quite 0: a cost of 0 reads as "no calibration" downstream
    return fit_cache.Fit(max(low, 0.5**FIT_ROUNDS), _fitted_why(untraced, with_probe))


def _fitted_why(untraced: float, with_probe: float) -> str:
    return (
        f"fitted to within {FIT_TOLERANCE_PCT:g}% of the {untraced:.3f} ms of the F process's own "
        f"untraced steps, which the probe's cost replayed to {with_probe:.3f} ms"
    )


def _build_graph(store: MeasurementStore) -> _Graph:
    deep_index, warped_start, warped_end, calib = host_timeline(store)
    deep, _, parent = keyed(store, deep_index)
    start = numbers(deep.column("start_ns")).astype(np.int64, copy=False)
    dur = numbers(deep.column("dur_ns")).astype(np.int64, copy=False)
    level = texts(deep.column("level"))
    kind = texts(deep.column("kind"))
    names = deep.column("name")
    gpu = level == schema.LEVEL_GPU
    is_sync = (level == schema.LEVEL_LIBRARY) & text_in(names, SYNC_CALLS)
    steps = np.nonzero(kind == schema.KIND_STEP)[0]
    owner = owning_steps(parent, kind)  # a multi-rank iteration's ranks: a step each
    base = _sync_base(start, dur, parent, owner, gpu, is_sync)
    communicating = nccl_kernels(names, gpu)  # NCCL's kernels: communication
    depth = tree_depths(store, deep_index)
    causes = _causes(parent, depth, kind, gpu, is_sync, communicating)
    device = numbers(deep.column("gpu_device"), null=-1).astype(np.int64, copy=False)
    stream = numbers(deep.column("gpu_stream"), null=-1).astype(np.int64, copy=False)
    library = level == schema.LEVEL_LIBRARY
    named = _Named(
        stream=np.where(library, stream, -1),
        event=numbers(deep.column("cuda_event"), null=-1).astype(np.int64, copy=False)
        if "cuda_event" in deep.column_names
        else np.full(len(start), -1, dtype=np.int64),
        is_wait=library & text_in(names, WAIT_CALLS),
        is_record=library & text_in(names, RECORD_CALLS),
    )
    held = _measured_holds(start, dur, parent, owner, gpu, named, stream)
    latency, gap = _device_delays(
        start, dur, parent, kind, gpu, is_sync, owner, device, stream, held
    )
    lane = np.full(len(start), -1, dtype=np.int64)
    act = np.nonzero(gpu)[0]
    if len(act):
        pairs = np.stack([device[act], stream[act]], axis=1)
        lane[act] = np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], steps)
    ends = np.searchsorted(owner[order], steps, side="right")
    return _Graph(
        deep_index,
        deep,
        parent,
        start,
        dur,
        warped_start,
        warped_end,
        calib,
        text_in(deep.column("kind"), (schema.KIND_RUNTIME, schema.KIND_DRIVER)),
        gpu,
        is_sync,
        steps,
        owner,
        [order[lo:hi] for lo, hi in zip(bounds, ends, strict=True)],
        base,
        causes,
        device,
        stream,
        lane,
        named,
        latency,
        gap,
        numbers(deep.column("iteration"), null=-1).astype(np.int64, copy=False),
        find_collectives(deep, parent, depth, owner, start, dur, gpu, communicating),
    )


#: No edit: a replay of the steps alone, without the critical path and the checks.
_STEPS_ONLY = WhatIf("the steps alone")


def _replay(
    store: MeasurementStore, edit: WhatIf | None = None, graph: _Graph | None = None
) -> Replay:
    g = graph or _graph(store)
    deep, parent, start, dur, gpu, steps = g.deep, g.parent, g.start, g.dur, g.gpu, g.steps
    owner, causes, device, stream = g.owner, g.causes, g.device, g.stream
    latency, gap = g.latency, g.gap
    warped_start, warped_end = g.warped_start, g.warped_end
    gpu_dur = dur
    if edit is not None and edit.drop_activities is not None:
        dropped = gpu & edit.drop_activities(deep)
        gpu_dur = dur.copy()
        gpu_dur[dropped] = 0
        latency, gap = latency.copy(), gap.copy()
        latency[dropped] = gap[dropped] = 0  # a dropped kernel takes its dispatch with it
    if edit is not None and (edit.drop_host is not None or edit.keep_host is not None):
        keep = np.ones(len(gpu), dtype=np.float64)
        if edit.keep_host is not None:
            keep = np.clip(np.asarray(edit.keep_host(deep), dtype=np.float64), 0.0, 1.0)
        if edit.drop_host is not None:
            keep[edit.drop_host(deep)] = 0.0
        keep[gpu] = 1.0
        warped_start, warped_end = _cut_per_step(warped_start, warped_end, keep, g.members)
    warped_dur = warped_end - warped_start
    out_start = start.copy()
    out_dur = dur.copy()
    charged_rows: list[np.ndarray] = []
    charged_ns: list[np.ndarray] = []
    step_rows = []

    def run_step(position: int, arrivals: np.ndarray | None) -> _Iteration:
        sim = _Iteration(
            int(steps[position]),
            g.members[position],
            parent,
            warped_start,
            warped_dur,
            gpu_dur,
            start,
            latency,
            gap,
            gpu,
            g.is_sync,
            g.base,
            g.is_call,
            stream,
            g.lane,
            g.named,
            g.collectives,
            arrivals,
        )
        sim.run(launch_at_step_start=edit is not None and edit.launch_at_step_start)
        return sim

    sims, arrivals = _across_ranks(run_step, len(steps), g.collectives)
    for sim in sims:
        out_start[sim.rows] = sim.start
        out_dur[sim.rows] = sim.dur
        if edit is None:  # a what-if needs only its step
            path_rows, path_ns = sim.critical_path()
            charged_rows.append(path_rows)
            charged_ns.append(path_ns)
    iteration, rank = g.iteration, step_ranks(deep)
    waits = [
        {
            "iteration": int(iteration[sim.step]),
            "rank": int(rank[sim.step]),
            "wait_ns": int(np.maximum(sim.last_arrival - sim.work_start, 0).sum()),
        }
        for sim in sims
        if arrivals is not None and len(sim.work_index)
    ]
    measured, measured_run = measured_steps(store, g.deep_index)
    # against M's median: the iterations of different processes do not pair up
    measured_ms = float(np.median(list(measured.values()))) if measured else None
    interval = m_interval(store) if measured_run == "M" else None
    if interval is not None:  # M over its processes, where it ran in several
        measured_ms = interval.median_ms
    replayed_ms = out_dur[steps] / 1e6
    deep_ms = dur[steps] / 1e6
    keep = steady(deep_ms) & steady(replayed_ms)
    for position, step in enumerate(steps):
        it = int(iteration[step])
        replayed = float(replayed_ms[position])
        step_rows.append(
            {
                "iteration": it,
                "replayed_ms": replayed,
                "measured_ms": measured.get((it, int(rank[step]))),
                "deep_ms": float(deep_ms[position]),
                "error_pct": 100.0 * (replayed - measured_ms) / measured_ms
                if measured_ms
                else None,
                "steady": bool(keep[position]),
            }
        )
    path_rows = np.concatenate(charged_rows) if charged_rows else np.zeros(0, np.int64)
    path = pa.Table.from_arrays(
        [
            arrow(iteration[path_rows], pa.int64()),
            _cause_column(causes[path_rows]),
            arrow(path_rows, pa.int64()),
            arrow(np.concatenate(charged_ns) if charged_ns else np.zeros(0, np.int64), pa.int64()),
        ],
        names=["iteration", "cause", "row", "dur_ns"],
    )
    checks = (  # a what-if needs only its steps
        _checks(out_start, out_dur, parent, gpu, steps, owner, device, stream)
        if edit is None
        else {}
    )
    return Replay(
        deep,
        parent,
        out_start,
        out_dur,
        g.calibration,
        measured_run,
        measured_ms,
        rows_table(
            step_rows,
            schema=pa.schema(
                [
                    ("iteration", pa.int64()),
                    ("replayed_ms", pa.float64()),
                    ("measured_ms", pa.float64()),
                    ("deep_ms", pa.float64()),
                    ("error_pct", pa.float64()),
                    ("steady", pa.bool_()),
                ]
            ),
        ),
        path,
        checks,
        check_replay(store, step_rows, interval, held_out_steps(store)) if edit is None else None,
        waits,
    )


def _across_ranks(
    run_step: Callable[[int, np.ndarray | None], _Iteration], count: int, found: Collectives
) -> tuple[list[_Iteration], np.ndarray | None]:
    """Every step replayed, the ranks of an iteration joined by their collectives: first each
    with its collectives' waits as measured, then again with each collective ending after the
    last rank's replayed arrival, until the arrivals hold (a collective's arrivals move only
    with the ones before it, so as many rounds as an iteration has collectives, and one more,
    at most; a round replays only the steps whose collectives' arrivals moved). Returns the
    steps and each work's last arrival (None: no collective spans ranks)."""
    sims = [run_step(position, None) for position in range(count)]
    if not found.linked:
        return sims, None
    arrivals: np.ndarray | None = None
    for _ in range(found.most_in_a_step + 1):
        arrived = np.zeros(len(found.work), dtype=np.int64)
        for sim in sims:
            arrived[sim.work_index] = sim.arrived
        latest = found.last_arrivals(arrived)
        moved = np.ones(len(latest), dtype=bool) if arrivals is None else latest != arrivals
        if not moved.any():
            break
        arrivals = latest
        for position, sim in enumerate(sims):
            if moved[sim.work_index].any():
                sims[position] = run_step(position, arrivals)
    return sims, arrivals


def _cause_column(causes: np.ndarray) -> pa.Array:
    """A string column of causes (each one of ``CAUSES``), built as codes into ``CAUSES``: a
    string a row took 0.13 s of ``xsp summary``."""
    codes = np.zeros(len(causes), np.int32)
    for code, cause in enumerate(CAUSES):
        codes[causes == cause] = code
    names = arrow(list(CAUSES), pa.string())
    return pa.DictionaryArray.from_arrays(arrow(codes), names).cast(pa.string())


def _causes(
    parent: np.ndarray,
    depth: np.ndarray,
    kind: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
    communicating: np.ndarray,
) -> np.ndarray:
    """The cause each span's time is charged to on the critical path (step 4); a step's own
    (untraced gaps between its spans) is host work, NCCL's kernels (``communicating``) are
    communication."""
    causes = np.full(len(kind), CAUSE_HOST, dtype=object)
    for marked, cause in (
        (kind == schema.KIND_COLLECTIVE, CAUSE_COMMUNICATION),
        (kind == schema.KIND_DATA_LOADING, CAUSE_DATA),
    ):  # a span inside a collective's or a batch's range is its time
        inside = inherit(np.where(marked, 1, -1), parent, depth) > 0
        causes[inside] = cause
    launcher = np.zeros(len(kind), dtype=bool)
    launcher[parent[gpu & (parent >= 0)]] = True
    causes[launcher & np.isin(kind, (schema.KIND_RUNTIME, schema.KIND_DRIVER))] = CAUSE_LAUNCH
    causes[is_sync] = CAUSE_SYNC
    causes[gpu] = CAUSE_GPU
    causes[communicating] = CAUSE_COMMUNICATION
    return causes


def _device_delays(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    kind: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
    owner: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
    held: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each activity's device-side delays, as the deep run measured them: its latency (from its
    launch to its start, where it waited for the launch) and its dispatch gap (from the end of the
    one before it on its stream, or of another stream's work it waited for through an event,
    ``held``, where it was queued behind that). An activity measured one way
    takes the median of the other way's. A GPU runs back-to-back kernels about a microsecond
    apart; ResNet-50's ~560 queued kernels a step add up to 0.7 ms. A negative gap (programmatic
    dependent launch lets a kernel start before the one before it ends) is taken as none, as a
    stream's activities do not overlap in the replay."""
    latency = np.zeros(len(start), dtype=np.int64)
    gap = np.zeros(len(start), dtype=np.int64)
    act = np.nonzero(gpu)[0]
    if not len(act):
        return latency, gap
    order = act[np.lexsort((start[act], stream[act], device[act], owner[act]))]
    launcher = np.maximum(parent[order], 0)
    by_call = (parent[order] >= 0) & np.isin(
        kind[launcher], (schema.KIND_RUNTIME, schema.KIND_DRIVER)
    )
    # as the replay launches it: at a call's end, at a blocking copy's start
    launched = np.where(
        by_call & ~is_sync[launcher], start[launcher] + dur[launcher], start[launcher]
    )
    ends = start[order] + dur[order]
    same = (
        (owner[order][1:] == owner[order][:-1])
        & (device[order][1:] == device[order][:-1])
        & (stream[order][1:] == stream[order][:-1])
    )
    prev_end = np.concatenate(([-1], np.where(same, ends[:-1], -1)))
    prev_end = np.maximum(prev_end, held[order])  # an event wait held it: not a dispatch gap
    queued = (prev_end >= 0) & (prev_end > launched)
    own_gap = np.maximum(start[order] - prev_end, 0)
    own_latency = np.maximum(start[order] - launched, 0)
    timed = ~queued & by_call
    median_gap = int(np.median(own_gap[queued])) if queued.any() else 0
    median_latency = int(np.median(own_latency[timed])) if timed.any() else 0
    gap[order] = np.where(queued, own_gap, median_gap)
    latency[order] = np.where(timed, own_latency, median_latency)
    return latency, gap


def _measured_holds(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    owner: np.ndarray,
    gpu: np.ndarray,
    named: _Named,
    stream: np.ndarray,
) -> np.ndarray:
    """For the first activity a stream's wait on an event holds (the next one launched on the
    waiting stream after the wait), when the work it waited for ended in the deep run: the last
    activity queued on the event's stream before the event's last record; -1 elsewhere."""
    held = np.full(len(start), -1, dtype=np.int64)
    waits = np.nonzero(named.is_wait & (named.event >= 0) & (named.stream >= 0))[0]
    if not len(waits):
        return held
    records = np.nonzero(named.is_record & (named.event >= 0) & (named.stream >= 0))[0]
    act = np.nonzero(gpu)[0]
    launcher = parent[act]
    launched = np.where(
        launcher >= 0, start[np.maximum(launcher, 0)] + dur[np.maximum(launcher, 0)], start[act]
    )
    lanes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (step, stream) -> by launch
    keys = np.stack([owner[act], stream[act]], axis=1)
    for key in {tuple(k) for k in keys.tolist()}:
        mine = np.nonzero((keys[:, 0] == key[0]) & (keys[:, 1] == key[1]))[0]
        mine = mine[np.argsort(launched[mine], kind="stable")]
        lanes[key] = (act[mine], launched[mine])
    by_event: dict[tuple[int, int], list[int]] = {}
    for r in records[np.argsort(start[records], kind="stable")].tolist():
        by_event.setdefault((int(owner[r]), int(named.event[r])), []).append(r)
    for w in waits.tolist():
        earlier = [
            r for r in by_event.get((int(owner[w]), int(named.event[w])), []) if start[r] < start[w]
        ]
        if not earlier:
            continue
        record = earlier[-1]
        rows, times = lanes.get((int(owner[w]), int(named.stream[record])), (act[:0], launched[:0]))
        queued = rows[times <= start[record]]
        rows, times = lanes.get((int(owner[w]), int(named.stream[w])), (act[:0], launched[:0]))
        after = np.searchsorted(times, start[w] + dur[w], side="left")
        if not len(queued) or after >= len(rows):
            continue
        first = int(rows[after])
        held[first] = max(int(held[first]), int((start[queued] + dur[queued]).max()))
    return held


def _sync_base(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    owner: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
) -> np.ndarray:
    """What each sync took after the GPU work before it had ended (measured in the deep run):
    the sync's own cost, which the replay keeps while it recomputes the wait."""
    base = np.zeros(len(start), dtype=np.int64)
    syncs = np.nonzero(is_sync)[0]
    if not len(syncs):
        return base
    act = np.nonzero(gpu)[0]
    act_end = start[act] + dur[act]
    act_owner = owner[act]
    act_launch = np.where(parent[act] >= 0, start[np.maximum(parent[act], 0)], start[act])
    for s in syncs:
        before = (act_owner == owner[s]) & (act_launch <= start[s] + dur[s])
        done = int(act_end[before].max()) if before.any() else int(start[s])
        base[s] = int(np.clip(start[s] + dur[s] - max(done, int(start[s])), 0, dur[s]))
    return base


@dataclass(frozen=True)
class _Named:
    """What level L's CUDA calls name (-1: nothing): the stream a sync, stream wait or event
    record names, and its event; which calls are waits and which are records."""

    stream: np.ndarray
    event: np.ndarray
    is_wait: np.ndarray
    is_record: np.ndarray


class _Iteration:
    """One step's replay (step 3, ``run``: its activities a stretch at a time) and its critical
    path (step 4, ``critical_path``: a walk back from the step's end)."""

    def __init__(
        self,
        step: int,
        members: np.ndarray,
        parent: np.ndarray,
        warped_start: np.ndarray,
        warped_dur: np.ndarray,
        measured_dur: np.ndarray,
        measured_start: np.ndarray,
        latency: np.ndarray,
        gap: np.ndarray,
        gpu: np.ndarray,
        is_sync: np.ndarray,
        sync_base: np.ndarray,
        is_call: np.ndarray,
        stream: np.ndarray,
        lane: np.ndarray,
        named: _Named,
        collectives: Collectives,
        arrivals: np.ndarray | None,
    ) -> None:
        self.sync_base = sync_base
        self.named = named
        self.step = int(step)
        self.parent = parent
        self.is_call = is_call
        host = members[~gpu[members] & (members != step)]
        self.host = host[order_by(warped_start[host], -warped_dur[host])]
        self.activities = members[gpu[members]]
        self.is_sync = is_sync
        self.ws = warped_start
        self.wd = warped_dur
        self.step_start = int(measured_start[step])
        self.work_index = (
            np.nonzero(np.isin(collectives.work, members))[0]
            if len(collectives.work)
            else np.zeros(0, np.int64)
        )
        # where the step's marker ends on the host timeline: a range may outlast it (the
        # optimizer's, by the tracer's own boundary work; gloo's all-reduce, recorded up to
        # 1.8 ms past its step on the dev machine), and M's step ends at its marker too
        self.marker_end = int(warped_start[step] + warped_dur[step])
        self.stream = stream
        self.lane = lane
        self.measured_dur = measured_dur
        self.latency = latency
        self.gap = gap
        self.collectives = collectives
        self.arrivals = arrivals  # each work's last arrival across ranks (None: as measured)

    # -- step 3 --------------------------------------------------------------------------------
    def run(self, launch_at_step_start: bool = False) -> None:
        """Step 3. Activities replay in launch order in stretches: between two events (a sync,
        which moves what follows by its wait, and a stream's wait on an event, which holds its
        stream's next work) each stream runs its activities as a recurrence, end = max(ready,
        previous end + gap) + duration, solved for the whole stretch at once with a running
        maximum (the replay took 5 ms a ResNet-50 step one activity at a time)."""
        ws, wd, parent, host, named = self.ws, self.wd, self.parent, self.host, self.named
        sync_rows = host[self.is_sync[host]]
        syncs = sync_rows.tolist()
        sync_start = ws[sync_rows].tolist()
        acts = self.activities
        launcher = parent[acts]
        # an activity is launched at its launch call's end; a blocking copy's at the call's
        # start, and one whose parent is an op (a level set without L) at the op's start
        at_end = self.is_call[launcher] & ~self.is_sync[launcher]
        launch = np.where(at_end, ws[launcher] + wd[launcher], ws[launcher]).astype(np.int64)
        if launch_at_step_start:
            launch = np.full(len(acts), self.step_start, dtype=np.int64)
        order = np.argsort(launch, kind="stable")
        acts, launch, launcher = acts[order], launch[order], launcher[order]
        self.act_rows = acts
        self.act_launcher = launcher
        n = len(acts)
        by_sync = self.is_sync[launcher]
        act_stream = self.stream[acts]
        lane_of = self.lane[acts]
        lanes = np.unique(lane_of).tolist()
        lane_rows = {k: np.nonzero(lane_of == k)[0] for k in lanes}
        lane_stream = {k: int(act_stream[rows[0]]) for k, rows in lane_rows.items()}
        streams = set(act_stream.tolist())
        stream_rows = {s: np.nonzero(act_stream == s)[0] for s in streams}
        latency = self.latency[acts]
        gap = self.gap[acts]
        measured = self.measured_dur[acts]
        # NCCL's kernels: each starts spinning when launched and free, and ends once the last
        # rank's has started, plus its transfer (as measured, waits included, in the first round)
        coll = self.collectives
        on_gpu = self.work_index[coll.on_gpu[self.work_index]]
        kernel_at = find_rows(acts, coll.work[on_gpu])
        arrive = np.full(n, -1, dtype=np.int64)
        if self.arrivals is not None and len(on_gpu):
            measured = measured.copy()
            measured[kernel_at] = coll.transfer_ns[on_gpu]
            arrive[kernel_at] = self.arrivals[on_gpu]
        self.kernel_at = kernel_at
        self.act_launch = np.zeros(n, dtype=np.int64)
        self.act_start = np.zeros(n, dtype=np.int64)
        self.act_end = np.zeros(n, dtype=np.int64)
        # the one before on its stream, where it (not the launch) held the activity back
        self.act_prev = np.full(n, -1, dtype=np.int64)
        act_end = self.act_end
        self.sync_wait: dict[int, tuple[int, int]] = {}  # sync row -> (awaited act, its end)
        delays: list[int] = []  # each sync's added wait, in warped order
        lane_last = dict.fromkeys(lanes, -1)  # each lane's last replayed activity
        held_by: dict[int, int] = {}  # stream -> the activity its next work waits for
        delta = 0
        done = 0  # activities replayed so far
        rows = host[named.is_record[host] & (named.event[host] >= 0)]
        records = list(
            zip(
                named.event[rows].tolist(),
                ws[rows].tolist(),
                named.stream[rows].tolist(),
                strict=True,
            )
        )
        rows = host[named.is_wait[host] & (named.event[host] >= 0) & (named.stream[host] >= 0)]
        waits = list(
            zip(
                ws[rows].tolist(),
                named.event[rows].tolist(),
                named.stream[rows].tolist(),
                strict=True,
            )
        )
        # the activity before which each wait takes effect: the first launched after it
        wait_at = np.searchsorted(launch, ws[rows], side="right").tolist()
        next_wait = 0

        def before_record(event: int, at: int) -> int | None:
            """The last activity queued on ``event``'s stream before its last record before
            ``at`` (-1: none), or None when this step recorded the event on no stream."""
            record = next((r for r in reversed(records) if r[0] == event and r[1] < at), None)
            if record is None or record[2] < 0:
                return None
            queued = stream_rows.get(record[2], acts[:0])
            bound = min(done, int(np.searchsorted(launch, record[1], side="right")))
            last = int(np.searchsorted(queued, bound)) - 1
            return int(queued[last]) if last >= 0 else -1

        def stretch(lo: int, hi: int) -> None:
            """Replay activities lo..hi-1: no sync or wait among them, so ``delta`` and
            ``held_by`` hold, and each lane's activities form one recurrence."""
            for lane in lanes:
                mine = lane_rows[lane]
                mine = mine[(mine >= lo) & (mine < hi)]
                if not len(mine):
                    continue
                at = launch[mine] + delta
                ready = at + latency[mine]
                held = held_by.get(lane_stream[lane], -1)
                held_end = int(act_end[held]) if held >= 0 else -1
                prev = lane_last[lane]
                waiting = np.maximum(np.maximum(ready, held_end), -1)
                floor = np.maximum(waiting, arrive[mine])  # an NCCL kernel: the last arrival
                dur, step = measured[mine], gap[mine] + measured[mine]
                total = np.cumsum(step)
                # end_k = total_k + max(the previous end, max over j <= k of floor_j + dur_j
                # - total_j): the latest start that held each activity, carried forward
                reach = np.maximum.accumulate(floor + dur - total)
                if prev >= 0:
                    reach = np.maximum(reach, int(act_end[prev]))
                end = total + reach
                begin = end - dur
                before = np.concatenate(([prev], mine[:-1]))
                before_end = np.concatenate(([act_end[prev] if prev >= 0 else 0], end[:-1]))
                queued = np.where(before >= 0, before_end + gap[mine], -1)
                # an NCCL kernel is drawn from when it began to spin
                begin = np.where(arrive[mine] >= 0, np.maximum(waiting, queued), begin)
                self.act_launch[mine] = at
                self.act_start[mine] = begin
                act_end[mine] = end
                self.act_prev[mine] = np.where(
                    held_end > np.maximum(ready, queued),
                    held,  # another stream's work held it: an edge
                    np.where(queued >= ready, before, -1),
                )
                lane_last[lane] = int(mine[-1])

        def replay_until(limit: float) -> None:
            """Replay the activities launched before ``limit`` (at it: a blocking copy's)."""
            nonlocal done, next_wait
            stop = int(np.searchsorted(launch, limit, side="left")) if limit < np.inf else n
            while stop < n and launch[stop] == limit and by_sync[stop]:
                stop += 1
            while done < stop:
                while next_wait < len(waits) and wait_at[next_wait] <= done:
                    at, event, waiting = waits[next_wait]
                    next_wait += 1
                    awaited = before_record(event, at)
                    held = held_by.get(waiting, -1)
                    if (
                        awaited is not None
                        and awaited >= 0
                        and (held < 0 or act_end[awaited] > act_end[held])
                    ):
                        held_by[waiting] = awaited
                upto = min(stop, wait_at[next_wait]) if next_wait < len(waits) else stop
                stretch(done, upto)
                done = upto

        def awaited_by(sync: int) -> np.ndarray:
            """The replayed activities ``sync`` waits for: the work before its event's record,
            its stream's, or (naming neither, or a stream this step never used) every one."""
            if named.event[sync] >= 0:
                awaited = before_record(int(named.event[sync]), int(ws[sync]))
                if awaited is not None:
                    return np.array([awaited] if awaited >= 0 else [], dtype=np.int64)
            if named.stream[sync] >= 0 and int(named.stream[sync]) in streams:
                mine = stream_rows[int(named.stream[sync])]
                return mine[mine < done]
            return np.arange(done)

        thread_waits = coll.waits.get(self.step, [])
        gap_at = [
            int(ws[w.after] + wd[w.after]) if w.after >= 0 else int(ws[self.step])
            for w in thread_waits
        ]
        events = sorted(
            [(at, 0, sync) for sync, at in zip(syncs, sync_start, strict=True)]
            + [(at, 1, k) for k, at in enumerate(gap_at)]
        )
        event_starts: list[int] = []
        moved: list[int] = []  # the cumulative delay after each event
        self.waited_on_collectives: list[tuple[int, int, int]] = []  # (from, to, work row)

        def work_end(index: int) -> int:
            """A collective's replayed end on this rank: its last arrival (or its own start,
            if later) and its transfer."""
            row = int(coll.work[index])
            begin = int(ws[row])
            before = bisect_left(event_starts, begin)
            begin += moved[before - 1] if before else 0
            last = (
                begin + int(coll.wait_ns[index])
                if self.arrivals is None
                else int(self.arrivals[index])
            )
            return max(last, begin) + int(coll.transfer_ns[index])

        for at, is_collective, which in events:
            replay_until(at)
            real = at + delta
            ready = real
            if is_collective:  # a thread's wait for its collectives (the gap before resume)
                wait = thread_waits[which]
                finish, last = max((work_end(int(i)), int(i)) for i in wait.works)
                ready = max(real, finish)
                if ready > real:  # the critical path charges the wait to the collective
                    self.waited_on_collectives.append((real, ready, int(coll.work[last])))
                length = max(0, int(ws[wait.resume]) - at)
                change = (ready - real) + wait.wake_ns - length
            else:
                sync = which
                awaited = awaited_by(sync) if done else acts[:0]
                if len(awaited):
                    last = int(awaited[np.argmax(act_end[awaited])])  # the first of equal ends
                    finish = int(act_end[last])
                    if finish > real:
                        ready = finish
                        self.sync_wait[sync] = (last, finish)
                # the sync's replayed length against the one it has on the host timeline
                # (which holds the F run's own wait)
                change = (ready - real) + int(self.sync_base[sync]) - int(self.wd[sync])
            delays.append(change)
            delta += change
            event_starts.append(at)
            moved.append(delta)
        replay_until(np.inf)
        self.sync_rows = syncs
        self.sync_starts = np.asarray(event_starts, dtype=np.int64)
        self.sync_delays = np.cumsum(delays, dtype=np.int64) if delays else np.zeros(0, np.int64)
        # host spans move by the waits of the syncs that began before them
        begin = self._shift(ws[host], inclusive=False)
        end = self._shift(ws[host] + wd[host], inclusive=False)
        # a collective's work ends once the last rank has arrived, plus its transfer; a rank
        # arrives at its call (gloo), or when its NCCL kernel starts
        index = self.work_index
        on_gpu = coll.on_gpu[index]
        self.work_start = self._shift(ws[coll.work[index]], inclusive=False)
        self.arrived = self._shift(ws[coll.call[index]], inclusive=False)
        self.work_start[on_gpu] = self.arrived[on_gpu] = self.act_start[self.kernel_at]
        self.last_arrival = (
            self.work_start + coll.wait_ns[index]
            if self.arrivals is None
            else self.arrivals[index].astype(np.int64)
        )
        host_works = index[~on_gpu]
        if len(host_works):
            end[find_rows(host, coll.work[host_works])] = (
                np.maximum(self.last_arrival[~on_gpu], self.work_start[~on_gpu])
                + coll.transfer_ns[host_works]
            )
        marker_end = int(self._shift(np.array([self.marker_end]), inclusive=False)[0])
        marker_end = max(marker_end, self.step_start)
        host_end = min(int(end.max()), marker_end) if len(host) else self.step_start
        gpu_end = int(self.act_end.max()) if n else self.step_start
        self.host_end = host_end
        self.tail = marker_end - host_end  # the marker's own sync and return, after the host
        self.gpu_end = gpu_end
        self.step_end = max(marker_end, gpu_end)
        # drawn inside its step, a span that lasted in its last nanosecond at least (a host
        # whose F cost took it all can place spans past the step's end)
        lasted = end > begin
        begin = np.minimum(begin, self.step_end - lasted)
        end = np.clip(end, begin + lasted, self.step_end)
        # every row of the step, replayed: its host spans, its activities and the step itself
        self.rows = np.concatenate((host, acts, [self.step]))
        self.start = np.concatenate((begin, self.act_start, [self.step_start]))
        self.dur = np.concatenate(
            (end - begin, self.act_end - self.act_start, [self.step_end - self.step_start])
        )
        self.host_begin, self.host_finish = begin, end

    def _shift(self, times: np.ndarray, inclusive: bool) -> np.ndarray:
        """``times`` (warped) plus the waits of the syncs that started before them."""
        if not len(self.sync_starts):
            return times.astype(np.int64)
        count = np.searchsorted(self.sync_starts, times, side="right" if inclusive else "left")
        added = np.where(count > 0, self.sync_delays[np.maximum(count - 1, 0)], 0)
        return (times + added).astype(np.int64)

    # -- step 4 --------------------------------------------------------------------------------
    def critical_path(self) -> tuple[np.ndarray, np.ndarray]:
        """(charged rows, ns) of the step's critical path, walked back from its end. The host's
        stretches between waited syncs are charged piece by piece in one slice each; the walk
        over activities charges one row at a time, into lists (an array each took 60% of it)."""
        p_begin, p_end, p_row = self._host_pieces()
        waited = np.nonzero(np.isin(p_row, list(self.sync_wait)))[0]
        rows: list[np.ndarray] = []
        durs: list[np.ndarray] = []
        one_rows: list[int] = []  # single charges since the last slice, in the walk's order
        one_ns: list[int] = []

        def charge(row: int, ns: int) -> None:
            if ns > 0:
                one_rows.append(row)
                one_ns.append(ns)

        def flush() -> None:
            if one_rows:
                rows.append(np.array(one_rows, dtype=np.int64))
                durs.append(np.array(one_ns, dtype=np.int64))
                one_rows.clear()
                one_ns.clear()

        act_prev, act_end = self.act_prev.tolist(), self.act_end.tolist()
        act_start, act_launch = self.act_start.tolist(), self.act_launch.tolist()
        act_rows, act_launcher = self.act_rows.tolist(), self.act_launcher.tolist()
        t = self.step_end
        act = -1
        if len(act_rows) and self.gpu_end >= self.host_end + self.tail:
            act = int(np.argmax(self.act_end))
            charge(self.step, t - self.gpu_end)  # the closing sync's return
            t = self.gpu_end
        else:
            charge(self.step, min(self.tail, t - self.step_start))
            t -= self.tail
        while t > self.step_start:
            if act >= 0:
                prev = act_prev[act]
                if prev >= 0:  # stream-bound: the one before held it, its dispatch gap too
                    begin = act_end[prev]
                    charge(act_rows[act], t - begin)
                    t, act = begin, prev
                    continue
                # it waited for its launch: the launch's latency, then the host at the launch
                charge(act_rows[act], t - act_start[act])
                t = act_start[act]
                launched = act_launch[act]
                charge(act_launcher[act], t - launched)
                t, act = launched, -1
                continue
            if not len(p_begin) or t <= p_begin[0]:
                charge(self.step, t - self.step_start)  # before the host's first span
                break
            i = min(int(np.searchsorted(p_end, t, side="left")), len(p_end) - 1)
            j = (
                int(waited[np.searchsorted(waited, i, side="right") - 1])
                if (len(waited) and waited[0] <= i)
                else -1
            )
            lo = j + 1
            if lo <= i:  # the host's work back to the waited sync (or its first span)
                ends = np.minimum(p_end[lo : i + 1], t)
                flush()
                rows.append(p_row[lo : i + 1])
                durs.append(np.maximum(ends - p_begin[lo : i + 1], 0))
            if j < 0:
                charge(self.step, int(p_begin[0]) - self.step_start)
                break
            awaited, finish = self.sync_wait[int(p_row[j])]
            sync_end = min(int(p_end[j]), t)
            charge(int(p_row[j]), sync_end - max(finish, int(p_begin[j])))  # its return
            act, t = awaited, min(finish, sync_end)
        flush()
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        all_rows, all_durs = np.concatenate(rows), np.concatenate(durs)
        keep = all_durs > 0
        return all_rows[keep].astype(np.int64), all_durs[keep].astype(np.int64)

    def _host_pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The replayed host timeline from the step's start to the host's end as consecutive
        pieces (begin, end, innermost span; the step where no span covers it). A collective's
        work range (gloo's, on its own thread) covers only the pieces in which a thread waited
        for it: the backward work it ran beside is the host's."""
        working = ~np.isin(self.host, self.collectives.work)
        rows = self.host[working]
        begins, ends = self.host_begin[working], self.host_finish[working]
        if not len(begins):
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        waits = np.asarray(self.waited_on_collectives, dtype=np.int64).reshape(-1, 3)
        bounds = np.sort(np.concatenate(([self.step_start], begins, ends, waits[:, :2].ravel())))
        bounds = bounds[np.concatenate(([True], bounds[1:] != bounds[:-1]))]  # np.unique's
        bounds = bounds[(bounds >= self.step_start) & (bounds <= max(ends.max(), self.step_start))]
        p_begin, p_end = bounds[:-1], bounds[1:]
        middle = p_begin + (p_end - p_begin) // 2
        zeros = np.zeros(len(begins), dtype=np.int64)
        inner = stab(zeros, begins, ends, np.zeros(len(middle), np.int64), middle)
        p_row = np.where(inner >= 0, rows[np.maximum(inner, 0)], self.step)
        for begin, end, work in waits.tolist():
            p_row[(p_row == self.step) & (p_begin >= begin) & (p_end <= end)] = work
        return p_begin, p_end, p_row


def _checks(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    gpu: np.ndarray,
    steps: np.ndarray,
    owner: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
) -> dict[str, int]:
    """What the replay guarantees by construction, counted: activities before their launch
    call, overlapping another of their stream, and anything outside its step."""
    act = np.nonzero(gpu)[0]
    launcher = parent[act]
    before = int(np.count_nonzero((launcher >= 0) & (start[act] < start[np.maximum(launcher, 0)])))
    order = act[np.lexsort((start[act], stream[act], device[act], owner[act]))]
    same = (
        (owner[order][1:] == owner[order][:-1])
        & (device[order][1:] == device[order][:-1])
        & (stream[order][1:] == stream[order][:-1])
    )
    overlap = int(np.count_nonzero(same & (start[order][1:] < (start + dur)[order][:-1])))
    step_start = start[owner]
    step_end = start[owner] + dur[owner]
    outside = int(np.count_nonzero((start < step_start) | (start + dur > step_end)))
    return {
        "activities_before_launch": before,
        "activities_overlapping_on_a_stream": overlap,
        "spans_outside_their_step": outside,
    }
