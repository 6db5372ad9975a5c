"""A kernel-changing fix's gain from its ops timed in isolation: each touched op's kernels (and
its backward node's) keep the share of their recorded time that the isolated timing keeps with
the fix, its host span loses the host time the fix saved a call, and the step is replayed with
those durations (``xsp.analysis.replay.WhatIf``).

Algorithm notes:

1. The factors. For each case (``xsp.analysis.estimates.cases``), forward: the fixed median
   over the base median, as ``xsp estimate`` timed them on the measurement's device; backward
   likewise. On a GPU, the host's side per part too: the time a call saves with the fix (base
   less fixed, per call issued back to back); a file without host times saves none. A case
   without a timing keeps its time (factors 1, nothing saved) and is counted as missing.
2. On a GPU measurement (level G) the GPU factor scales the op's GPU activities, those below
   it down to its kernels (a convolution's transposes included: the fix's time is the NHWC
   kernel's alone), and the op's own host span loses the saved host time at its end
   (``cut_host_ns``: the launches in that part are issued at its new end), both in one
   what-if: a host-bound step (BERT b1 inference) moves by the host's change alone. On a CPU
   measurement the one factor scales the op's host span: the op runs on the host. Only the
   outermost touched span of a subtree is edited (an autograd node's spans can nest), so that
   no time is cut twice. Kernels take a ratio rather than the isolated time itself, so that the
   recorded durations (which the replay is checked on) stay the scale; the host on a GPU takes
   the time saved, since what a fix saves there is work of a fixed size (a split-K reduction's
   launch, cuBLAS's heuristics), not a share of the op's dispatch: an isolated call's host time
   moved 1.6x between processes (BERT b1's GEMMs on the H100, 17.9 and 28.8 µs) while the time
   TF32 saved stayed 2.8-3.1 µs, and a ratio gave 0.19-0.39 ms where the fix gained 0.15-0.17
   ms alternating in one process.
3. The gain is the replayed step (median of the steady iterations) less the edited replay's,
   as for every what-if; it is not the sum of the ops' changes where the GPU waits for the
   host, or the host for the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from xsp.analysis.estimates.cases import Affected, affected
from xsp.analysis.measurement.derived import DerivedPer
from xsp.analysis.measurement.matching import keyed, tree_depths
from xsp.analysis.measurement.store import MeasurementStore, text_equals
from xsp.analysis.replay import WhatIf, replay, what_if
from xsp.analysis.replay.critical_path import has_gpu
from xsp.core import schema
from xsp.core.intervals import inherit
from xsp.core.store.op_timings import OpTimings, read_timings, timings_path

__all__ = [
    "ISOLATION",
    "CaseFactors",
    "IsolationEstimate",
    "RowFactors",
    "case_factors",
    "isolation_edit",
    "isolation_estimate",
    "kernels_to_scale",
    "row_factors",
]

#: How an estimate from isolated timings starts its ``estimate`` text.
ISOLATION = "measured in isolation"


@dataclass(frozen=True)
class IsolationEstimate:
    """A fix's replayed gain from its ops' isolated timings: ``gain_ms`` and ``step_ms`` (the
    replayed step without the fix), ``ops_per_iteration`` touched ops a step, ``cases``
    distinct ones timed, ``missing`` without a timing; ``model`` says it in words."""

    fix: str
    gain_ms: float
    step_ms: float
    ops_per_iteration: float
    cases: int
    missing: int
    model: str


@dataclass(frozen=True)
class CaseFactors:
    """Per case (module note 1): ``forward``/``backward`` the share of its time the timed op
    keeps with the fix (on a GPU its kernels'), ``host_saved_forward``/``host_saved_backward``
    the host time a call saves on a GPU, ns (0 where not timed); ``missing`` cases have no
    timing."""

    forward: np.ndarray
    backward: np.ndarray
    host_saved_forward: np.ndarray
    host_saved_backward: np.ndarray
    missing: int


@dataclass(frozen=True)
class RowFactors:
    """Per deep-run row (module note 2): ``activities`` the duration factor of each GPU
    activity, ``host`` the share of its time each host span keeps (a CPU measurement's), 1
    elsewhere; ``host_cut_ns`` the time each host span loses (a GPU measurement's), 0
    elsewhere."""

    activities: np.ndarray
    host: np.ndarray
    host_cut_ns: np.ndarray


def case_factors(found: Affected, timings: OpTimings) -> CaseFactors:
    """Each case's factors (module note 1)."""
    by_key = timings.by_key()
    n = len(found.cases)
    forward, backward = np.ones(n), np.ones(n)
    host_forward, host_backward = np.zeros(n), np.zeros(n)
    missing = 0
    for i, case in enumerate(found.cases):
        timing = by_key.get(case.key)
        if timing is None:
            missing += 1
            continue
        forward[i] = _ratio(timing.fixed_forward_us, timing.base_forward_us)
        backward[i] = _ratio(timing.fixed_backward_us, timing.base_backward_us)
        host_forward[i] = _saved_ns(timing.base_host_us, timing.fixed_host_us)
        host_backward[i] = _saved_ns(timing.base_backward_host_us, timing.fixed_backward_host_us)
    return CaseFactors(forward, backward, host_forward, host_backward, missing)


def _ratio(fixed: float | None, base: float | None) -> float:
    return fixed / base if fixed is not None and base else 1.0


def _saved_ns(base_us: float | None, fixed_us: float | None) -> float:
    return (base_us - fixed_us) * 1e3 if base_us is not None and fixed_us is not None else 0.0


def row_factors(store: MeasurementStore, found: Affected, timings: OpTimings) -> RowFactors:
    """Each deep-run row's factors (module note 2): on a GPU measurement an activity takes its
    nearest touched op's or backward node's GPU factor, and the outermost touched span loses
    its host saving; on a CPU one the outermost touched span takes its timed factor."""
    factors = case_factors(found, timings)
    n = len(found.forward_case)
    owner = np.full(n, -1, dtype=np.int64)  # 2 * case (forward), 2 * case + 1 (backward)
    fwd, bwd = found.forward_case >= 0, found.backward_case >= 0
    owner[bwd] = 2 * found.backward_case[bwd] + 1
    owner[fwd] = 2 * found.forward_case[fwd]
    parent = keyed(store, found.run_index)[2]
    nearest = inherit(owner, parent, tree_depths(store, found.run_index))
    outermost = (owner >= 0) & ((parent < 0) | (nearest[np.maximum(parent, 0)] < 0))
    on_gpu = has_gpu(store)
    kernel_of = _interleaved(factors.forward, factors.backward)
    if not on_gpu:
        host = np.where(outermost, kernel_of[np.maximum(owner, 0)], 1.0)
        return RowFactors(np.ones(n), host, np.zeros(n))
    saved_of = _interleaved(factors.host_saved_forward, factors.host_saved_backward)
    gpu = text_equals(store.run_spans(found.run_index).column("level"), schema.LEVEL_GPU)
    activities = np.where(gpu & (nearest >= 0), kernel_of[np.maximum(nearest, 0)], 1.0)
    host_cut_ns = np.where(outermost & ~gpu, saved_of[np.maximum(owner, 0)], 0.0)
    return RowFactors(activities, np.ones(n), host_cut_ns)


def _interleaved(forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """Case i's forward factor at 2i, its backward's at 2i + 1."""
    return np.ravel(np.column_stack([forward, backward]))


def isolation_edit(store: MeasurementStore, found: Affected, timings: OpTimings) -> WhatIf:
    """The what-if that replays ``found``'s ops with their isolated timings' ratios."""
    factors = row_factors(store, found, timings)
    on_gpu = has_gpu(store)

    def of(values: np.ndarray) -> Callable[[pa.Table], np.ndarray]:
        def per_row(spans: pa.Table) -> np.ndarray:
            if spans.num_rows != len(values):  # the graph's deep run is the cases' run
                raise ValueError("the replay's deep run is not the run the cases were read from")
            return values

        return per_row

    host_timed = any(t.base_host_us is not None for t in timings.timings)
    what = "host time scaled by that ratio"
    if on_gpu:
        what = "kernels scaled by the GPU's ratio" + (
            " and its host span cut by the host time saved a call" if host_timed else ""
        )
    model = (
        f"{ISOLATION}: each op {timings.fix} changes (and its backward) timed without and "
        f"with it on {timings.device} (torch {timings.torch}), its {what}, the step replayed"
    )
    if not on_gpu:
        return WhatIf(model, keep_host=of(factors.host))
    return WhatIf(
        model, scale_activities=of(factors.activities), cut_host_ns=of(factors.host_cut_ns)
    )


def isolation_estimate(store: MeasurementStore, fix: str) -> IsolationEstimate | None:
    """The fix's gain from the timings ``xsp estimate`` wrote into the measurement
    (``RUN/estimates/<fix>.json``); None where there are none, where they match none of its
    ops, or where a GPU measurement has no kernels to scale (no level G). Kept per store and
    file version: ``xsp estimate`` asks before and after writing it."""
    path = timings_path(store.root, fix)
    version = path.stat().st_mtime_ns if path.is_file() else None
    return _ESTIMATES.of(store, (fix, version))


def kernels_to_scale(store: MeasurementStore) -> bool:
    """Whether the measurement's touched ops can be scaled: a GPU measurement's kernels
    (level G), or a CPU measurement's host spans."""
    if has_gpu(store):
        return True
    devices = {str(run.resource.get("xsp.device", "") or "") for run in store.runs}
    return not any(device.startswith("cuda") for device in devices)


def _isolation_estimate(
    store: MeasurementStore, key: tuple[str, int | None]
) -> IsolationEstimate | None:
    fix, version = key
    timings = read_timings(store.root, fix) if version is not None else None
    if timings is None or not kernels_to_scale(store):
        return None
    found = affected(store, fix)
    missing = case_factors(found, timings).missing
    if not found.cases or missing == len(found.cases):
        return None
    step_ms = replay(store).result().step_ms
    edit = isolation_edit(store, found, timings)
    edited = what_if(store, edit)
    if step_ms is None or edited is None:
        return None
    return IsolationEstimate(
        fix=fix,
        gain_ms=step_ms - edited,
        step_ms=step_ms,
        ops_per_iteration=sum(c.per_iteration for c in found.cases),
        cases=len(found.cases),
        missing=missing,
        model=edit.model,
    )


#: Each fix's isolation estimate, once per store (``isolation_estimate``).
_ESTIMATES = DerivedPer("isolation_estimate", _isolation_estimate, needs=("replay_graph",))
