"""What-if edits of the replay's graph (``xsp.analysis.replay``, step 5) and the times a replay
runs on: the graph's as measured, or with an edit applied."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from xsp.analysis.replay.graph import Graph

__all__ = ["STEPS_ONLY", "Timing", "WhatIf", "timing"]


@dataclass(frozen=True)
class WhatIf:
    """An edit of the replay's graph (step 5): what a fix would change, replayed.

    ``model`` says what the edit assumes, in words; ``drop_activities`` picks GPU activities
    that take no time, ``scale_activities`` each activity's duration factor (1: as measured;
    an op timed in isolation without and with a fix scales its kernels by the ratio),
    ``drop_host`` host spans whose time leaves the host timeline (what runs after them moves
    earlier), ``keep_host`` the share of its time each host span keeps (1: all of it; below 1
    its last part leaves the timeline, as a dropped span's whole time does; above 1 the span
    grows by the difference at its end and what runs after it moves later; give it to spans
    that do not nest), ``cut_host_ns`` the time each host span loses at its end, in ns (the
    same cut as ``keep_host``'s, given as a time: a fix that saves a launch saves its µs, not a
    share of the span; negative grows it), all from the deep run's spans;
    ``launch_at_step_start`` launches every activity at the step's start (one CUDA graph for
    the whole step)."""

    model: str
    drop_activities: Callable[[pa.Table], np.ndarray] | None = None
    scale_activities: Callable[[pa.Table], np.ndarray] | None = None
    drop_host: Callable[[pa.Table], np.ndarray] | None = None
    keep_host: Callable[[pa.Table], np.ndarray] | None = None
    cut_host_ns: Callable[[pa.Table], np.ndarray] | None = None
    launch_at_step_start: bool = False


#: No edit: a replay of the steps alone, without the critical path and the checks.
STEPS_ONLY = WhatIf("the steps alone")


@dataclass(frozen=True)
class Timing:
    """The times one replay runs on: the host timeline (warped: without the tracer's cost) and
    each activity's duration and device delays, the graph's or an edit's copies."""

    warped_start: np.ndarray
    warped_dur: np.ndarray
    gpu_dur: np.ndarray
    latency: np.ndarray
    gap: np.ndarray
    launch_at_step_start: bool = False


def timing(g: Graph, edit: WhatIf | None) -> Timing:
    """The graph's times with ``edit`` applied (None: as they are)."""
    gpu_dur, latency, gap = g.dur, g.latency, g.gap
    warped_start, warped_end = g.warped_start, g.warped_end
    if edit is not None and edit.scale_activities is not None:
        factor = np.maximum(np.asarray(edit.scale_activities(g.deep), dtype=np.float64), 0.0)
        scaled = g.gpu & (factor != 1.0)
        gpu_dur = gpu_dur.copy()
        gpu_dur[scaled] = np.round(gpu_dur[scaled] * factor[scaled]).astype(gpu_dur.dtype)
    if edit is not None and edit.drop_activities is not None:
        dropped = g.gpu & edit.drop_activities(g.deep)
        gpu_dur = gpu_dur.copy()
        gpu_dur[dropped] = 0
        latency, gap = latency.copy(), gap.copy()
        latency[dropped] = gap[dropped] = 0  # a dropped kernel takes its dispatch with it
    host_edits = (edit.drop_host, edit.keep_host, edit.cut_host_ns) if edit is not None else ()
    if edit is not None and any(e is not None for e in host_edits):
        keep = np.ones(len(g.gpu), dtype=np.float64)
        added = np.zeros(len(g.gpu), dtype=np.float64)
        if edit.keep_host is not None:
            keep = np.asarray(edit.keep_host(g.deep), dtype=np.float64)
        if edit.cut_host_ns is not None:
            length = (warped_end - warped_start).astype(np.float64)
            cut = np.asarray(edit.cut_host_ns(g.deep), dtype=np.float64)
            lost = np.maximum(cut, 0.0)
            keep = keep - np.divide(lost, length, out=np.zeros_like(lost), where=length > 0)
            added = np.maximum(-cut, 0.0)  # a time, not a share: a zero-length span grows too
        keep = np.maximum(keep, 0.0)
        if edit.drop_host is not None:
            dropped_host = edit.drop_host(g.deep)
            keep[dropped_host], added[dropped_host] = 0.0, 0.0
        keep[g.gpu], added[g.gpu] = 1.0, 0.0
        warped_start, warped_end = _cut_per_step(warped_start, warped_end, keep, added, g.members)
    return Timing(
        warped_start=warped_start,
        warped_dur=warped_end - warped_start,
        gpu_dur=gpu_dur,
        latency=latency,
        gap=gap,
        launch_at_step_start=edit is not None and edit.launch_at_step_start,
    )


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
    warped_start: np.ndarray,
    warped_end: np.ndarray,
    keep: np.ndarray,
    added_ns: np.ndarray,
    members: list[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The host timeline with each span's time past the share it ``keep``s taken out (or, past
    1, added at its end), and ``added_ns`` added at its end, each step by its own cuts (its
    untraced gaps too): the ranks of an iteration share a clock, and one rank's cut is no
    other rank's time. Each step keeps its start, and a grown span its own."""
    out_start, out_end = warped_start.copy(), warped_end.copy()
    for rows in members:  # each step's rows
        mine = rows[keep[rows] < 1.0]
        growing = (keep[rows] > 1.0) | (added_ns[rows] > 0)
        grown = rows[growing]
        if not len(mine) and not len(grown):
            continue
        length = warped_end[mine] - warped_start[mine]
        cut_start = warped_start[mine] + np.round(keep[mine] * length).astype(np.int64)
        cut_end = warped_end[mine]
        step_start = _without(warped_start[rows], cut_start, cut_end)
        step_end = _without(warped_end[rows], cut_start, cut_end)
        if len(grown):  # where each grown span now ends, and by how much
            at = _without(warped_end[grown], cut_start, cut_end)
            length = warped_end[grown] - warped_start[grown]
            added = np.round(np.maximum(keep[grown] - 1.0, 0.0) * length + added_ns[grown])
            at_start = step_start[growing] == at  # a zero-length span: its own time is no delay
            step_start = _with_added(step_start, at, added.astype(np.int64))
            step_end = _with_added(step_end, at, added.astype(np.int64))
            step_start[growing] -= np.where(at_start, added, 0).astype(np.int64)
        out_start[rows], out_end[rows] = step_start, step_end
    return out_start, out_end


def _with_added(times: np.ndarray, at: np.ndarray, added: np.ndarray) -> np.ndarray:
    """``times`` with ``added`` ns put into the clock at each time of ``at``: a time on or after
    an insertion point moves later by it (the grown span's own end, its parents' ends, the
    next span's start)."""
    order = np.argsort(at, kind="stable")
    points, before = at[order], np.concatenate(([0], np.cumsum(added[order])))
    return times + before[np.searchsorted(points, times, side="right")]
