"""The reconstruction's layout: host spans nest inside their parents, GPU activities keep lanes.

Host spans (model, framework, library levels) run synchronously inside their parent on one
thread, so they are laid out top-down inside it. GPU activities (kernels, copies, sets) run
asynchronously, after their launch call has returned (almost all of them), on a (device, stream)
lane of their own, so they are laid out per lane against the step, not inside their launch call.

Host layout, per parent, children in measured order:
1. each child takes its accurate duration (from its level's shallowest run);
2. the gaps measured in the deep run (before the first child, between children, after the last)
   shrink in proportion when the parent's accurate duration leaves less room, and never grow;
3. when even gapless the children are longer than their parent (a shallower parent measured
   without the overhead its deeper children carry), they shrink in proportion and sit gapless.

GPU layout, per lane of one iteration, activities in measured order:
1. every activity keeps its G-run duration, and lane order is kept, so no two overlap;
2. the measured gaps (from the step's start, and between activities) are scaled by the largest
   factor f in [0, 1] for which the lane ends inside the reconstructed step, while no activity
   starts before its launch call's reconstructed start;
3. when no factor fits (launch calls placed too late for the work queued behind them), the lane is
   pushed back from the step's end, and the activities that then start before their launch call
   are counted (``LaneReport.launch_violations``); when a lane's activities alone outlast the
   step, their durations shrink in proportion (``LaneReport.scaled_lanes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xsp.tracer.convert.intervals import depths

#: Bisection rounds for the gap factor; 2**-30 of a step is well under a nanosecond.
_FACTOR_ROUNDS = 30


@dataclass
class LaneReport:
    """What the GPU layout had to give up, for the reconstruction's notes."""

    lanes: int = 0
    compressed_lanes: int = 0  # gaps shrank (f < 1)
    launch_violations: int = 0  # activities placed before their launch call's start
    scaled_lanes: int = 0  # activities alone outlasted the step: durations shrank


def layout_host(
    parent: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    new_dur: np.ndarray,
    host: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(new start, new duration) of every host row (``host`` true); other rows are returned as
    given. Roots keep their start."""
    new_start = start.copy()
    new_dur = new_dur.copy()
    depth = depths(parent)
    end = start + dur
    for level in range(1, int(depth.max()) + 1 if len(depth) else 0):
        kids = np.nonzero((depth == level) & host)[0]
        if not len(kids):
            continue
        kids = kids[np.lexsort((start[kids], parent[kids]))]
        up = parent[kids]
        first = np.ones(len(kids), dtype=bool)
        first[1:] = up[1:] != up[:-1]
        last = np.ones(len(kids), dtype=bool)
        last[:-1] = first[1:]
        previous_end = np.where(first, start[up], np.roll(end[kids], 1))
        gap = np.maximum(0, start[kids] - previous_end)
        tail = np.maximum(0, end[up] - end[kids]) * last
        groups, group = np.unique(up, return_inverse=True)
        gaps = np.bincount(group, gap + tail, len(groups))
        busy = np.bincount(group, new_dur[kids], len(groups))
        room = new_dur[groups] - busy
        with np.errstate(divide="ignore", invalid="ignore"):
            gap_scale = np.where(gaps > 0, np.clip(room / gaps, 0.0, 1.0), 0.0)
            fit = np.where((room < 0) & (busy > 0), new_dur[groups] / busy, 1.0)
        new_dur[kids] = np.floor(new_dur[kids] * fit[group]).astype(np.int64)
        step = np.round(gap * gap_scale[group]).astype(np.int64)
        advance = step + new_dur[kids]
        before = np.cumsum(advance) - advance  # sum over all earlier kids in this pass
        group_base = before[first][group]
        new_start[kids] = new_start[up] + (before - group_base) + step
    return new_start, new_dur


def layout_lane(
    step_start: int,
    step_dur: int,
    offsets: np.ndarray,
    dur: np.ndarray,
    launch: np.ndarray,
    report: LaneReport,
) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) of one lane's activities inside the step [step_start, +step_dur].

    ``offsets``: measured start of each activity relative to its own run's step start, in lane
    order; ``dur``: G-run durations; ``launch``: the reconstructed start of each launch call (the
    step's start where an activity has none)."""
    report.lanes += 1
    dur = dur.astype(np.int64)
    if dur.sum() > step_dur:
        report.scaled_lanes += 1
        dur = np.floor(dur * (step_dur / dur.sum())).astype(np.int64)
    ends = np.concatenate(([0], offsets[:-1] + dur[:-1]))
    gap = np.maximum(0, offsets - ends).astype(np.float64)
    step_end = step_start + step_dur

    def lane_ends(factor: float) -> np.ndarray:
        # end_i = max(end_{i-1} + f*gap_i, launch_i) + dur_i, unrolled into one running maximum
        reach = np.cumsum(np.round(gap * factor).astype(np.int64) + dur)
        return reach + np.maximum(step_start, np.maximum.accumulate(launch + dur - reach))

    end = lane_ends(1.0)
    if end[-1] > step_end:
        report.compressed_lanes += 1
        low, high = 0.0, 1.0
        end = lane_ends(0.0)
        if end[-1] <= step_end:
            for _ in range(_FACTOR_ROUNDS):
                middle = (low + high) / 2
                trial = lane_ends(middle)
                low, high = (middle, high) if trial[-1] <= step_end else (low, middle)
            end = lane_ends(low)
        else:
            # push back from the step's end: end_i = min(end_i, end_{i+1} - dur_{i+1})
            done = np.cumsum(dur)
            latest = np.minimum.accumulate((end - done)[::-1])[::-1]
            end = done + np.minimum(latest, step_end - done[-1])
            report.launch_violations += int(np.count_nonzero(end - dur < launch))
    return end - dur, dur
