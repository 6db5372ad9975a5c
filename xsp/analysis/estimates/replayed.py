"""A kernel-changing fix's gain from its ops timed in isolation: each touched op (and its backward
node) keeps the share of its recorded time that its isolated timing keeps with the fix, and the
step is replayed with those durations (``xsp.analysis.replay.WhatIf``).

Algorithm notes:

1. The factors. For each case (``xsp.analysis.estimates.cases``), forward: the fixed median
   over the base median, as ``xsp estimate`` timed them on the measurement's device; backward
   likewise. A case without a timing keeps its time (factor 1) and is counted as missing.
2. On a GPU measurement (level G) the factor scales the op's GPU activities, those below it
   down to its kernels (a convolution's transposes included: the fix's time is the NHWC
   kernel's alone); the host's launches keep their times. On a CPU measurement it scales the
   op's host span: the op runs on the host. A ratio is applied rather than the isolated time
   itself, so that the recorded durations (which the replay is checked on) stay the scale.
3. The gain is the replayed step (median of the steady iterations) less the edited replay's,
   as for every what-if; it is not the sum of the ops' changes where the GPU waits for the
   host, or the host for the GPU.
"""

from __future__ import annotations

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
    "IsolationEstimate",
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


def case_factors(found: Affected, timings: OpTimings) -> tuple[np.ndarray, np.ndarray, int]:
    """(forward factor, backward factor) per case, and how many cases have no timing."""
    by_key = timings.by_key()
    forward = np.ones(len(found.cases))
    backward = np.ones(len(found.cases))
    missing = 0
    for i, case in enumerate(found.cases):
        timing = by_key.get(case.key)
        if timing is None:
            missing += 1
            continue
        forward[i] = _ratio(timing.fixed_forward_us, timing.base_forward_us)
        backward[i] = _ratio(timing.fixed_backward_us, timing.base_backward_us)
    return forward, backward, missing


def _ratio(fixed: float | None, base: float | None) -> float:
    return fixed / base if fixed is not None and base else 1.0


def row_factors(store: MeasurementStore, found: Affected, timings: OpTimings) -> np.ndarray:
    """Each deep-run row's factor (module note 2): on a GPU measurement its activities' (an
    activity takes its nearest touched op's or backward node's), on a CPU one the touched ops'
    and nodes' own; 1 elsewhere."""
    forward, backward, _ = case_factors(found, timings)
    n = len(found.forward_case)
    owner = np.full(n, -1, dtype=np.int64)  # 2 * case (forward), 2 * case + 1 (backward)
    fwd, bwd = found.forward_case >= 0, found.backward_case >= 0
    owner[bwd] = 2 * found.backward_case[bwd] + 1
    owner[fwd] = 2 * found.forward_case[fwd]
    factor_of = np.ravel(np.column_stack([forward, backward]))
    if not has_gpu(store):
        return np.where(owner >= 0, factor_of[np.maximum(owner, 0)], 1.0)
    spans = store.run_spans(found.run_index)
    parent = keyed(store, found.run_index)[2]
    owner = inherit(owner, parent, tree_depths(store, found.run_index))
    gpu = text_equals(spans.column("level"), schema.LEVEL_GPU)
    return np.where(gpu & (owner >= 0), factor_of[np.maximum(owner, 0)], 1.0)


def isolation_edit(store: MeasurementStore, found: Affected, timings: OpTimings) -> WhatIf:
    """The what-if that replays ``found``'s ops with their isolated timings' ratios."""
    factors = row_factors(store, found, timings)
    on_gpu = has_gpu(store)

    def of(spans: pa.Table) -> np.ndarray:
        if spans.num_rows != len(factors):  # the graph's deep run is the cases' run
            raise ValueError("the replay's deep run is not the run the cases were read from")
        return factors

    what = "kernels" if on_gpu else "host time"
    model = (
        f"{ISOLATION}: each op {timings.fix} changes (and its backward) timed without and "
        f"with it on {timings.device} (torch {timings.torch}), its {what} scaled by that "
        "ratio, the step replayed"
    )
    if on_gpu:
        return WhatIf(model, scale_activities=of)
    return WhatIf(model, keep_host=of)


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
    _, _, missing = case_factors(found, timings)
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
