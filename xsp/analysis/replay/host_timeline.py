"""The replay's host timeline: the untraced host, taken from the shallowest run with level F
less the tracer's own cost (``xsp.analysis.replay``, step 2).

1. The F run's timeline is the host's, less the tracer's cost: every F record costs its
   calibrated share (``run.json``'s ``calibration``, measured by ``xsp.tracer.capture.calibrate``
   in the F run's process), half at its start and half at its end, so a time of the F run moves
   back by the cost of the record starts and ends before it in its step.
2. The deep run's F spans take those times by structural key, relative to their step; every other
   host span (L calls, spans the F run lacks) is placed by interpolating between the matched
   spans' starts and ends around it, so a launch call keeps its place inside its op and the op
   its untraced length.
3. Children stay inside their parents and after their earlier siblings: the calibrated cost can
   exceed a gap the F run measured, and two runs can nest an op differently.
4. Without an F run nothing measured the host's untraced length: a step's host lasts M's step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.derived import DerivedPer
from xsp.analysis.measurement.matching import keyed, level_sources, roots, tree_depths
from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.analysis.measurement.untraced import INTERLEAVED, untraced_steps
from xsp.core import schema
from xsp.core.columns import numbers
from xsp.core.intervals import find_rows, order_by

__all__ = [
    "HOST_BOUND_EXCESS",
    "HOST_BOUND_GPU_SHARE",
    "HOST_TIMELINE",
    "NO_CALIBRATION",
    "STEADY_DEVIATIONS",
    "STEADY_MIN_EXCESS",
    "Calibration",
    "calibration",
    "checked_against_own_steps",
    "host_timeline",
    "largest_cost_factor",
    "measured_steps",
    "owning_steps",
    "steady",
    "step_ranks",
]

#: An iteration is not steady when its step is this many robust deviations (1.4826 x MAD) above
#: the run's median, and at least STEADY_MIN_EXCESS above it: the first measured iteration after
#: the levels came on (234 ms against 51 ms in one MFLG run) is one.
STEADY_DEVIATIONS = 5.0
STEADY_MIN_EXCESS = 0.10


def steady(durations: np.ndarray) -> np.ndarray:
    """True for each step that is steady (see ``STEADY_DEVIATIONS``); all are when fewer than
    three."""
    values = np.asarray(durations, dtype=np.float64)
    if len(values) < 3:
        return np.ones(len(values), dtype=bool)
    median = float(np.median(values))
    spread = 1.4826 * float(np.median(np.abs(values - median)))
    limit = max(median + STEADY_DEVIATIONS * spread, median * (1 + STEADY_MIN_EXCESS))
    return values <= limit


@dataclass(frozen=True)
class Calibration:
    """The tracer's own cost per F record, taken off F spans' durations before the replay
    (measured by ``xsp.tracer.capture.calibrate`` in the F run's process).

    ``op_ns`` and ``module_ns`` are None when the F run recorded no calibration (older stores):
    host durations then keep the tracer's cost, and the report says so. ``first_op_ns`` is an op
    record's cost in the first measured iteration, where F records the ops' shapes too (None:
    the same as the others')."""

    op_ns: float | None
    module_ns: float | None
    source: str
    first_op_ns: float | None = None
    #: The probe's cost is multiplied by this after the checks against the F run's own steps
    #: (``checked_against_own_steps``, the replay's fit); None where neither applied.
    scale: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "framework_ns_per_record": self.op_ns,
            "framework_ns_per_record_first_iteration": self.first_op_ns,
            "module_ns_per_call": self.module_ns,
            "source": self.source,
            "scaled_to_own_steps": self.scale,
        }

    def scaled(self, factor: float, why: str) -> Calibration:
        def times(value: float | None) -> float | None:
            return None if value is None else round(value * factor, 1)

        return Calibration(
            times(self.op_ns),
            times(self.module_ns),
            f"{self.source}; {why}",
            times(self.first_op_ns),
            round((self.scale or 1.0) * factor, 3),
        )


#: How a calibration's source says that the F run measured none (a store older than the probe).
NO_CALIBRATION = "recorded no calibration"


def calibration(store: MeasurementStore, source: int | None) -> Calibration:
    """The F run's calibration from its run.json, if it recorded one."""
    if source is None:
        return Calibration(
            None, None, "no run with level F: the host lasts M's step, so only the GPU is checked"
        )
    run = store.runs[source]
    found = run.document.calibration or {}
    op, module = found.get("framework_ns_per_record"), found.get("module_ns_per_call")
    if op is None:
        return Calibration(None, None, f"the {run.levels} run {NO_CALIBRATION}")
    first = found.get("framework_ns_per_record_first_iteration")
    return Calibration(
        float(op),
        float(op if module is None else module),
        f"measured in the {run.levels} run's process",
        None if first is None else float(first),
    )


#: The F run's traced steps exceed its own untraced ones by more than this share, and the deep
#: run's GPU work fills less than ``HOST_BOUND_GPU_SHARE`` of the untraced step: the step is
#: host-bound, and F's whole cost shows in it.
HOST_BOUND_EXCESS = 0.05
HOST_BOUND_GPU_SHARE = 0.8


def checked_against_own_steps(
    calib: Calibration, store: MeasurementStore, source: int, table: pa.Table, deep: pa.Table
) -> Calibration:
    """The probe's cost per record, checked against the F run's own steps.

    The probe is a small network's step, whose ops launch and allocate more per record than many
    workloads' do (views, reshapes): on the H200 it put an op record of the GPT LM at 2.05 µs,
    where that MF process's traced steps exceeded its own untraced warm-up steps by 1.4 µs a
    record. Where a host-bound step shows F's cost whole (its traced steps exceed its untraced
    ones by more than ``HOST_BOUND_EXCESS`` and the deep run's GPU work, ``deep``, fills less
    than ``HOST_BOUND_GPU_SHARE`` of the untraced step), a probe's cost above that excess is
    scaled down to it. Never up, and never on a GPU-bound step, which hides part of the cost
    (ResNet-50 b64 training's MF steps still exceeded their untraced ones by 5%): the probe's
    figure stands there. M is not read, so the check against M stays free of it."""
    if calib.op_ns is None:
        return calib
    run = store.runs[source]
    own = untraced_steps(store)
    if own is None or own.source == INTERLEAVED:
        return calib  # the pairs' own fit lowers the cost where it must (replay.fit._fit)
    untraced = own.ms()
    level = texts(table.column("level"))
    kind = texts(table.column("kind"))
    ok = (kind == schema.KIND_STEP) & numbers(table.column("status_message").is_null())
    steps = numbers(table.column("dur_ns"))[ok] / 1e6
    if untraced is None or not len(steps):
        return calib
    traced = float(np.median(steps[steady(steps)]))
    framework = level == schema.LEVEL_FRAMEWORK
    modules = int(np.count_nonzero(framework & (kind == schema.KIND_MODULE)))
    ops = int(np.count_nonzero(framework)) - modules
    probe_ms = (ops * calib.op_ns + modules * (calib.module_ns or 0.0)) / len(steps) / 1e6
    excess = traced - untraced
    deep_level = texts(deep.column("level"))
    deep_steps = max(1, int(np.count_nonzero(texts(deep.column("kind")) == schema.KIND_STEP)))
    gpu_ms = numbers(deep.column("dur_ns"))[deep_level == schema.LEVEL_GPU].sum() / deep_steps / 1e6
    host_bound = gpu_ms < HOST_BOUND_GPU_SHARE * untraced
    if not host_bound or excess <= HOST_BOUND_EXCESS * untraced or excess >= probe_ms:
        return calib
    return calib.scaled(
        excess / probe_ms,
        f"scaled to the {run.levels} run's own steps: {traced:.3f} ms traced against "
        f"{untraced:.3f} ms untraced is {excess:.3f} ms of F's cost, where the probe's "
        f"{probe_ms:.3f} ms was",
    )


def host_timeline(
    store: MeasurementStore, calib: Calibration | None = None
) -> tuple[int, np.ndarray, np.ndarray, Calibration]:
    """The replay's host timeline (``_host_timeline``), once per store and calibration (None:
    the F run's own, checked): the replay and each what-if read the same one (never written
    to)."""
    return HOST_TIMELINE.of(store, calib)


def largest_cost_factor(store: MeasurementStore, calib: Calibration) -> float:
    """The factor of ``calib`` at which the F records' cost would fill the F run's whole traced
    step (median of its steady steps): beyond it the host would take no time at all."""
    _, source_of = level_sources(store)
    source = source_of.get(schema.LEVEL_FRAMEWORK)
    if source is None or not calib.op_ns:
        return 1.0
    table = store.run_spans(source)
    level = texts(table.column("level"))
    kind = texts(table.column("kind"))
    ok = (kind == schema.KIND_STEP) & numbers(table.column("status_message").is_null())
    steps = numbers(table.column("dur_ns"))[ok]
    framework = level == schema.LEVEL_FRAMEWORK
    modules = int(np.count_nonzero(framework & (kind == schema.KIND_MODULE)))
    ops = int(np.count_nonzero(framework)) - modules
    cost_ns = (ops * calib.op_ns + modules * (calib.module_ns or 0.0)) / max(1, len(steps))
    if not len(steps) or cost_ns <= 0:
        return 1.0
    return max(1.0, float(np.median(steps[steady(steps / 1e6)])) / cost_ns)


def _host_timeline(
    store: MeasurementStore, given: Calibration | None
) -> tuple[int, np.ndarray, np.ndarray, Calibration]:
    """(deep run index, each deep row's host start and end for the replay, the calibration):
    step 2 of the module's algorithm.

    1. The F run's own timeline is taken as the host's, less the tracer's cost: every F record
       costs its calibrated share, half at its start and half at its end, so a time ``t`` of the
       F run moves back by the cost of the record starts and ends before it in its iteration.
    2. Deep-run F spans take those times (matched by structural key), relative to their step.
    3. Every other host span (L calls, spans the F run lacks) is placed by interpolating between
       the matched spans' starts and ends around it, so a launch call keeps its place inside its
       op and the op its untraced length; past the last of them (the step's closing sync) it
       keeps its measured distance.

    What no calibration changes (the matching, the order of times) is found once per store
    (``_Placing``): the replay's fit asks for the timeline of nine calibrations.
    """
    runs, source_of = level_sources(store)
    deep_index = runs[-1][0]
    deep = keyed(store, deep_index)[0]
    start = numbers(deep.column("start_ns")).astype(np.int64, copy=False)
    end = start + numbers(deep.column("dur_ns")).astype(np.int64, copy=False)
    source = source_of.get(schema.LEVEL_FRAMEWORK)
    calib = calibration(store, source)
    if source is None:
        return deep_index, start.copy(), _host_length_from_m(store, deep, deep_index, end), calib
    placing = _HOST_PLACING.of(store, (deep_index, source))
    calib = given or checked_against_own_steps(calib, store, source, placing.source, deep)
    return deep_index, *placing.placed(calib), calib


class _Placing:
    """The deep run's host spans matched to the F run's, and the order of the times that their
    placement interpolates between: all that ``_host_timeline`` finds without a calibration."""

    def __init__(self, store: MeasurementStore, deep_index: int, source: int) -> None:
        deep, key, parent = keyed(store, deep_index)
        self.start = numbers(deep.column("start_ns")).astype(np.int64, copy=False)
        self.end = self.start + numbers(deep.column("dur_ns")).astype(np.int64, copy=False)
        self.source, keys, source_parent = keyed(store, source)
        self.clock = _CostClock(self.source, source_parent)
        level = texts(deep.column("level"))
        kind = texts(deep.column("kind"))
        self.owner = owning_steps(parent, kind)
        found = find_rows(keys, key)
        self.matched = (level == schema.LEVEL_FRAMEWORK) & (found >= 0)
        self.at = np.maximum(found, 0)
        self.source_owner = owning_steps(source_parent, texts(self.source.column("kind")))
        self.steps = np.nonzero(kind == schema.KIND_STEP)[0]
        self.in_source = found[self.steps] >= 0  # the step's end on the F run's timeline
        self.at_step = np.maximum(found[self.steps], 0)
        others = ~self.matched & (level != schema.LEVEL_GPU) & (kind != schema.KIND_STEP)
        order = np.argsort(self.owner, kind="stable")
        first = np.searchsorted(self.owner[order], np.arange(len(self.owner)))
        last = np.searchsorted(self.owner[order], np.arange(len(self.owner)), side="right")
        #: per step with spans to interpolate: (the step, its matched spans, the spans to place,
        #: the order of the interpolation's x and that x, sorted: the step's start, the matched
        #: spans' starts and ends, the step's end)
        self.interpolated: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for step in np.unique(self.owner[others]).tolist():
            members = order[first[step] : last[step]]
            knots = members[self.matched[members]]
            x = np.concatenate(
                ([self.start[step]], self.start[knots], self.end[knots], [self.end[step]])
            )
            by = np.argsort(x, kind="stable")
            self.interpolated.append((step, knots, members[others[members]], by, x[by]))
        host = (level != schema.LEVEL_GPU) & (kind != schema.KIND_STEP)
        self.parent = parent
        depth = tree_depths(store, deep_index)
        #: the host spans under a host parent, a level of the tree at a time, top-down
        self.levels: list[np.ndarray] = []
        for at in range(1, int(depth.max(initial=0)) + 1):
            rows = np.nonzero((depth == at) & host)[0]
            if len(rows := rows[host[parent[rows]]]):
                self.levels.append(rows)

    def placed(self, calib: Calibration) -> tuple[np.ndarray, np.ndarray]:
        """Each deep row's host start and end under ``calib`` (steps 2.1 to 2.3)."""
        start, end, owner, matched, at = self.start, self.end, self.owner, self.matched, self.at
        s_start, s_end = self.clock.moved(calib)
        anchor = s_start[self.source_owner[at]]
        out_start, out_end = start.copy(), end.copy()
        out_start[matched] = start[owner[matched]] + (s_start[at] - anchor)[matched]
        out_end[matched] = start[owner[matched]] + (s_end[at] - anchor)[matched]
        steps, at_step = self.steps, self.at_step
        out_end[steps] = np.where(
            self.in_source, start[steps] + s_end[at_step] - s_start[at_step], end[steps]
        )
        for step, knots, todo, by, x in self.interpolated:
            # placed by interpolation between the matched spans' starts and ends around it
            y = np.concatenate(([start[step]], out_start[knots], out_end[knots], [out_end[step]]))
            y = np.maximum.accumulate(y[by])
            out_start[todo] = np.round(np.interp(start[todo], x, y)).astype(np.int64)
            out_end[todo] = np.round(np.interp(end[todo], x, y)).astype(np.int64)
        # a span that lasted keeps at least a nanosecond (Jaeger "sanitizes" an empty one)
        out_end = np.maximum(out_end, out_start + (end > start))
        return _inside_parents(out_start, out_end, self.parent, self.levels)


def _inside_parents(
    start: np.ndarray, end: np.ndarray, parent: np.ndarray, levels: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Host spans kept inside their host parents, a level of ``levels`` at a time, top-down:
    the calibrated cost taken off a parent's end can exceed the gap it measured after its last
    child (810 ns a record against a 200 ns gap), and a child that outlasts its parent breaks
    every nested view."""
    start, end = start.copy(), end.copy()
    for rows in levels:
        up_start, up_end = start[parent[rows]], end[parent[rows]]
        lasted = end[rows] > start[rows]
        start[rows] = np.clip(start[rows], up_start, np.maximum(up_start, up_end - lasted))
        end[rows] = np.clip(end[rows], start[rows] + (lasted & (up_end > start[rows])), up_end)
        _after_siblings(rows, start, end, parent)
    return start, end


def _after_siblings(
    rows: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray
) -> None:
    """Each of ``rows`` starts no earlier than its earlier siblings end (in place): where the runs
    nest a span differently (an op under another in MF, beside it in MFLG), interpolation can
    overlap siblings, and the children of a span must not outlast it together."""
    rows = rows[order_by(parent[rows], start[rows])]
    group = np.cumsum(np.concatenate(([True], parent[rows][1:] != parent[rows][:-1]))) - 1
    base = start[parent[rows]]  # times relative to the parent's start, groups apart
    span = int((end[rows] - base).max(initial=0)) + 1
    shifted = end[rows] - base + group * span
    reach = np.concatenate(([0], np.maximum.accumulate(shifted)[:-1])) - group * span
    first = np.concatenate(([True], group[1:] != group[:-1]))
    earliest = np.where(first, 0, reach) + base
    up_end = end[parent[rows]]
    lasted = end[rows] > start[rows]
    # no room left: the last nanosecond of the parent (Jaeger "sanitizes" an empty span)
    start[rows] = np.minimum(np.maximum(start[rows], earliest), up_end - lasted)
    end[rows] = np.minimum(np.maximum(end[rows], start[rows] + lasted), up_end)


def _host_length_from_m(
    store: MeasurementStore, deep: pa.Table, deep_index: int, end: np.ndarray
) -> np.ndarray:
    """Without an F run nothing measured the host's untraced length: each step's host then
    lasts M's step of that iteration (M's median where M lacks it), so the check against M
    only tests the GPU side, as ``Calibration.source`` says."""
    measured, _ = measured_steps(store, deep_index)
    if not measured:
        return end.copy()
    kind = texts(deep.column("kind"))
    iteration = numbers(deep.column("iteration"), null=-1).astype(np.int64, copy=False)
    rank = step_ranks(deep)
    start = numbers(deep.column("start_ns")).astype(np.int64, copy=False)
    median = float(np.median(list(measured.values())))
    out = end.copy()
    for row in np.nonzero(kind == schema.KIND_STEP)[0]:
        key = (int(iteration[row]), int(rank[row]))
        out[row] = start[row] + round(measured.get(key, median) * 1e6)
    return out


class _CostClock:
    """The F run's record starts and ends in time order, and how many of each kind of record
    started or ended between each row's step start and the row's start, and its end: the cost
    of the records before a time is then those counts times a calibration's costs (step 2.1),
    three products a row for each calibration the fit tries. Each rank's own, since each rank's
    process paid for its own records (counted across the ranks of an iteration, a rank of a
    two-rank gloo job moved back twice its cost, 0.64 ms of a 3.3 ms step)."""

    #: The kinds of record a calibration prices apart: module calls, ops in the first measured
    #: iteration (they record shapes too), the other ops.
    KINDS = 3

    def __init__(self, table: pa.Table, parent: np.ndarray) -> None:
        self.start = numbers(table.column("start_ns")).astype(np.int64, copy=False)
        self.end = self.start + numbers(table.column("dur_ns")).astype(np.int64, copy=False)
        kind = texts(table.column("kind"))
        owner = owning_steps(parent, kind)
        iteration = numbers(table.column("iteration"), null=-1).astype(np.int64, copy=False)
        priced_as = np.where(kind == schema.KIND_MODULE, 0, np.where(iteration == 0, 1, 2))
        framework = texts(table.column("level")) == schema.LEVEL_FRAMEWORK
        rank = step_ranks(table)[owner]  # a row's step's (the iteration root of ranks: -1)
        #: per rank: (its rows, the records of each kind whose starts and ends fall between each
        #: row's step start and its start, the same up to its end, its step's start)
        self.ranks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for each in np.unique(rank).tolist():
            mine = rank == each
            records = np.nonzero(framework & mine)[0]
            times = np.concatenate((self.start[records], self.end[records]))
            by = np.argsort(times, kind="stable")
            times = times[by]
            kinds = np.concatenate((priced_as[records], priced_as[records]))[by]
            # half-records of each kind before each time
            before = np.zeros((self.KINDS, len(times) + 1), dtype=np.int32)
            for k in range(self.KINDS):
                np.cumsum(kinds == k, out=before[k, 1:])
            rows = np.nonzero(mine)[0]
            steps, step_of = np.unique(owner[rows], return_inverse=True)
            at_step = before[:, np.searchsorted(times, self.start[steps], side="left")][:, step_of]
            at_start, at_end = (
                before[:, np.searchsorted(times, t, side="left")]
                for t in (self.start[rows], self.end[rows])
            )
            step_start = self.start[steps][step_of]
            self.ranks.append((rows, at_start - at_step, at_end - at_step, step_start))

    def moved(self, calib: Calibration) -> tuple[np.ndarray, np.ndarray]:
        """Each row's start and end less the cost of the records before them in its step."""
        start, end = self.start, self.end
        if calib.op_ns is None:
            return start, end
        first_op_ns = calib.op_ns if calib.first_op_ns is None else calib.first_op_ns
        half = ((calib.module_ns or 0.0) / 2, first_op_ns / 2, calib.op_ns / 2)

        def cost(counts: np.ndarray) -> np.ndarray:  # not a matrix product: BLAS's threads
            found = counts[0] * half[0] + counts[1] * half[1] + counts[2] * half[2]
            return np.round(found).astype(np.int64)

        moved_start, moved_end = start.copy(), end.copy()
        # a cost above the time the records took (a fitted one can be) stops at the step's start
        for rows, to_start, to_end, floor in self.ranks:
            moved_start[rows] = np.maximum(start[rows] - cost(to_start), floor)
            moved_end[rows] = np.maximum(end[rows] - cost(to_end), floor)
        return moved_start, np.maximum(moved_end, moved_start)


def owning_steps(parent: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Each row's step (a multi-rank iteration's ranks each own theirs)."""
    return roots(np.where(kind == schema.KIND_STEP, -1, parent))


def step_ranks(table: pa.Table) -> np.ndarray:
    """Each row's rank (-1: a single-rank run's)."""
    if "rank" not in table.column_names:
        return np.full(table.num_rows, -1, dtype=np.int64)
    return numbers(table.column("rank"), null=-1).astype(np.int64, copy=False)


def measured_steps(
    store: MeasurementStore, deep_index: int
) -> tuple[dict[tuple[int, int], float], str | None]:
    """Each step (ms) of the shallowest run by (iteration, rank), if that run is not the deep
    run itself: a multi-rank iteration has a step on each rank."""
    runs = sorted(enumerate(store.runs), key=lambda item: len(item[1].levels))
    index, run = runs[0]
    if index == deep_index:
        return {}, None
    table = store.run_spans(index)
    kind = texts(table.column("kind"))
    ok = (kind == schema.KIND_STEP) & numbers(table.column("status_message").is_null())
    iteration = numbers(table.column("iteration"), null=-1).astype(np.int64, copy=False)
    rank = step_ranks(table)
    dur = numbers(table.column("dur_ns")).astype(np.int64, copy=False)
    rows = np.nonzero(ok)[0]
    keep = steady(dur[rows] / 1e6)
    found = {
        (int(iteration[r]), int(rank[r])): dur[r] / 1e6
        for r, k in zip(rows, keep, strict=True)
        if k
    }
    return found, run.levels


def _placing(store: MeasurementStore, at: tuple[int, int]) -> _Placing:
    return _Placing(store, *at)


#: The host timeline for a calibration (None: the store's own, checked) (``host_timeline``).
HOST_TIMELINE = DerivedPer("host_timeline", _host_timeline, needs=("structural_keys",))
#: The deep run's host spans matched to the F run's, per (deep run, F run).
_HOST_PLACING = DerivedPer("host_placing", _placing, needs=("structural_keys",))
