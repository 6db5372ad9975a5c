"""The replayed step as the report's flame view and timeline draw it: one table of boxes, every
span of the median step (host spans, and the kernels, copies and memsets the G run matched to
their launches), which ``step_view.js`` lays out on a canvas. Pure functions from spans to data.

Algorithm notes:
1. The step shown is the one with the median replayed (untraced) duration; the flame of a
   multi-rank job shows that step's rank (its ranks run side by side, and the timeline shows them
   all).
2. Flame, two widths. *Step time*: host spans where the replay put them, every box as wide as
   it lasts. *GPU time*: the same tree packed by the GPU time below each box, every activity a
   leaf under the launch call, op and layer that launched it (its parent by CUDA correlation id):
   an activity runs after its launch call returns, so it has no place on the host's clock.
3. The reconstruction lays a thread's siblings end to end inside their parent; a child on another
   thread that runs beside them (gloo's all-reduce beside backward) is left out of the flame, or
   the children would add up to more than their parent, and the caption counts it.
4. Under a parent whose children belong to several phases (forward, backward, optimizer), each
   run of two or more consecutive same-phase children is drawn inside a box of that phase,
   as wide as the run's extent: the backward pass's hundreds of autograd nodes sit under
   "backward", not as slivers under the step.
5. A layer's GPU time is its kernels' in the step, forward and backward (autograd tags backward
   kernels with the forward module's path), its sub-layers' included; its critical-path time is
   what the replay's critical path charged to it and its sub-layers in that step.
6. Timeline: a lane per host thread (a row per nesting depth, every depth) and per GPU stream;
   each activity links to its launch call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema

__all__ = [
    "FLAME_MAX_BOXES",
    "LEVEL_COLOURS",
    "PHASE_COLOUR",
    "StepView",
    "median_iteration",
    "median_step",
    "step_view",
]

#: Host boxes beyond this many are left out of the flame, shortest first (the canvas stays fluid).
FLAME_MAX_BOXES = 20000
#: One colour per level, in stack order (the legend of both views).
LEVEL_COLOURS = {
    schema.LEVEL_MODEL: "#4c6ef5",
    schema.LEVEL_FRAMEWORK: "#2f9e44",
    schema.LEVEL_LIBRARY: "#f59f00",
    schema.LEVEL_GPU: "#e03131",
}
PHASE_COLOUR = "#adb5bd"
PHASE = "phase"
#: ``StepView.flame_parent`` of a box the flame leaves out (beside, another rank, too short).
NOT_IN_FLAME = -2


@dataclass
class StepView:
    """The boxes of one step, parents before children and siblings by time in the flame's part.
    Times are integer nanoseconds from the step's start; -1 marks "none"."""

    iteration: int
    rank: int  # the rank whose step the flame shows (-1: a single-rank job)
    step_ns: int
    names: list[str] = field(default_factory=list)
    levels: list[str] = field(default_factory=list)  # a level, or "phase" for a phase box
    starts_ns: list[int] = field(default_factory=list)
    durs_ns: list[int] = field(default_factory=list)
    flame_parent: list[int] = field(default_factory=list)  # -1 the root, -2 not in the flame
    parent: list[int] = field(default_factory=list)  # the span's own parent (-1: none)
    rows: list[int] = field(default_factory=list)  # timeline row (-1: a phase box)
    gpu_ns: list[int] = field(default_factory=list)  # GPU time launched below (activity: own)
    layer_gpu_ns: list[int] = field(default_factory=list)  # a layer's, forward + backward
    critical_ns: list[int] = field(default_factory=list)  # a layer's time on the critical path
    layers: list[str] = field(default_factory=list)  # the layer (module path) a box ran for
    kinds: list[str] = field(default_factory=list)  # the span's kind ("phase": a phase box)
    lanes: list[tuple[str, int, int]] = field(default_factory=list)  # (name, first row, rows)
    left_out: int = 0  # host spans below the duration threshold (on the timeline only)
    threshold_ns: int = 0
    beside: int = 0  # spans left out as running beside their siblings on another thread

    @property
    def flame_boxes(self) -> list[int]:
        return [i for i, p in enumerate(self.flame_parent) if p != NOT_IN_FLAME]

    def to_json(self, mode: str) -> dict[str, Any]:
        """Columnar and compact for the page: names and levels as indices into their lists."""
        names: dict[str, int] = {}
        levels = [*LEVEL_COLOURS, PHASE]
        paths: dict[str, int] = {}
        return {
            "iteration": self.iteration,
            "rank": self.rank,
            "step_ns": self.step_ns,
            "mode": mode,
            "left_out": self.left_out,
            "threshold_ns": self.threshold_ns,
            "beside": self.beside,
            "levels": levels,
            "colours": [*LEVEL_COLOURS.values(), PHASE_COLOUR],
            "lanes": self.lanes,
            "n": [names.setdefault(n, len(names)) for n in self.names],
            "l": [levels.index(v) for v in self.levels],
            "s": self.starts_ns,
            "d": self.durs_ns,
            "p": self.flame_parent,
            "u": self.parent,
            "r": self.rows,
            "g": self.gpu_ns,
            "lg": self.layer_gpu_ns,
            "c": self.critical_ns,
            "m": [paths.setdefault(p, len(paths)) if p else -1 for p in self.layers],
            "names": list(names),
            "paths": list(paths),
        }


def median_step(spans: pa.Table) -> tuple[int, int] | None:
    """(iteration, rank) of the step with the median duration (rank -1: a single-rank job)."""
    steps = spans.filter(pc.equal(spans.column("kind"), schema.KIND_STEP))
    if not steps.num_rows:
        return None
    durations = np.asarray(steps.column("dur_ns"))
    row = int(np.argsort(durations, kind="stable")[len(durations) // 2])
    rank = steps.column("rank")[row].as_py()
    return int(steps.column("iteration")[row].as_py()), -1 if rank is None else int(rank)


def median_iteration(spans: pa.Table) -> int | None:
    """The iteration whose model span has the median duration."""
    found = median_step(spans)
    return None if found is None else found[0]


def _iteration_rows(spans: pa.Table, iteration: int) -> dict[str, np.ndarray]:
    one = spans.filter(pc.equal(spans.column("iteration"), iteration))
    columns = ("span_id", "parent_span_id", "start_ns", "dur_ns")
    rows = {c: np.asarray(one.column(c).fill_null(0)).astype(np.int64) for c in columns}
    for c in ("name", "level", "kind", "phase", "module_path"):
        rows[c] = np.asarray(one.column(c).cast(pa.string()).fill_null(""), dtype=object)
    for c in ("thread_id", "gpu_device", "gpu_stream", "rank"):
        rows[c] = np.asarray(one.column(c).fill_null(-1), dtype=np.int64)
    rows["up"] = _parent_rows(rows["span_id"], rows["parent_span_id"])
    rows["depth"] = _depths(rows["up"])
    return rows


def step_view(
    spans: pa.Table, critical_ns: dict[str, int] | None = None, max_boxes: int = FLAME_MAX_BOXES
) -> StepView | None:
    """The boxes of the median step (see the module notes); ``critical_ns``: the step's time on
    the critical path by layer path (each layer's own, ``critical_by_layer``)."""
    found = median_step(spans)
    if found is None:
        return None
    iteration, rank = found
    rows = _iteration_rows(spans, iteration)
    gpu = rows["level"] == schema.LEVEL_GPU
    mine = (rows["rank"] == rank) | (rank < 0)
    beside = _beside(rows, mine & ~gpu)
    host = mine & ~gpu & ~beside
    threshold = 0
    durations = rows["dur_ns"]
    if host.sum() > max_boxes:
        threshold = int(np.sort(durations[host])[::-1][max_boxes - 1]) + 1
    keep = (host & (durations >= threshold)) | (mine & gpu & ~_below(rows, beside))
    keep = _with_ancestors(keep, rows["up"], mine)
    view, row_of = _flame_order(rows, keep, iteration, rank)
    view.left_out = int(host.sum() - (keep & host).sum())
    view.threshold_ns = threshold
    view.beside = int(beside.sum())
    _timeline_rows(view, rows, row_of)
    _gpu_times(view, critical_ns or {})
    return view


def _parent_rows(span_id: np.ndarray, parent_id: np.ndarray) -> np.ndarray:
    from xsp.core.intervals import find_rows

    return find_rows(span_id.astype(np.int64), parent_id.astype(np.int64))


def _depths(up: np.ndarray) -> np.ndarray:
    from xsp.core.intervals import depths

    return depths(up)


def _below(rows: dict[str, np.ndarray], top: np.ndarray) -> np.ndarray:
    """``top`` and every span below one of them."""
    out = top.copy()
    while True:
        held = ~out & (rows["up"] >= 0) & out[np.maximum(rows["up"], 0)]
        if not held.any():
            return out
        out |= held


def _with_ancestors(keep: np.ndarray, up: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``keep`` and the ``allowed`` ancestors of what it keeps (an activity's launch call,
    however short; not a multi-rank iteration above its ranks' steps)."""
    keep = keep.copy()
    while True:
        parents = up[keep & (up >= 0)]
        missing = parents[~keep[parents] & allowed[parents]]
        if not len(missing):
            return keep
        keep[missing] = True


def _beside(rows: dict[str, np.ndarray], host: np.ndarray) -> np.ndarray:
    """The host spans (and what they hold) that run beside their siblings on another thread: a
    child not on the thread that holds most of its siblings, overlapping one that is (gloo's
    all-reduce on its own thread can outlast all of backward's autograd nodes together)."""
    out = np.zeros(len(host), dtype=bool)
    start, end = rows["start_ns"], rows["start_ns"] + rows["dur_ns"]
    parent, thread = rows["parent_span_id"], rows["thread_id"]
    for up in np.unique(parent[host]).tolist():
        kids = np.nonzero(host & (parent == up))[0]
        threads, at = np.unique(thread[kids], return_inverse=True)
        if len(threads) < 2:
            continue
        busiest = threads[np.argmax(np.bincount(at.reshape(-1)))]
        main = kids[thread[kids] == busiest]
        main = main[np.argsort(start[main])]
        reach = np.maximum.accumulate(end[main])
        for k in kids[thread[kids] != busiest].tolist():
            before = int(np.searchsorted(start[main], end[k], side="left"))
            out[k] = before > 0 and reach[before - 1] > start[k]
    return _below(rows, out) & host


def _flame_order(
    rows: dict[str, np.ndarray], keep: np.ndarray, iteration: int, rank: int
) -> tuple[StepView, list[int]]:
    """The flame's boxes, parents first and siblings by start, phase boxes inserted (note 4);
    then every other span of the iteration, for the timeline."""
    start = rows["start_ns"]
    roots = np.nonzero(keep & ~(keep[np.maximum(rows["up"], 0)] & (rows["up"] >= 0)))[0]
    origin = int(start[roots].min()) if len(roots) else 0
    step = np.nonzero((rows["kind"] == schema.KIND_STEP) & keep)[0]
    step_ns = int(rows["dur_ns"][step[0]]) if len(step) else 0
    view = StepView(iteration, rank, step_ns)
    children: dict[int, list[int]] = {}
    is_root = set(roots.tolist())
    for row in np.nonzero(keep)[0][np.argsort(start[keep], kind="stable")].tolist():
        children.setdefault(-1 if row in is_root else int(rows["up"][row]), []).append(row)
    index_of: dict[int, int] = {}

    def add(row: int, parent_box: int, name: str, level: str, s: int, d: int) -> int:
        view.names.append(name)
        view.levels.append(level)
        view.starts_ns.append(s - origin)
        view.durs_ns.append(d)
        view.flame_parent.append(parent_box)
        view.layers.append(str(rows["module_path"][row]) if row >= 0 else "")
        view.kinds.append(str(rows["kind"][row]) if row >= 0 else PHASE)
        if row >= 0:
            index_of[row] = len(view.names) - 1
        return len(view.names) - 1

    def visit(row: int, parent_box: int) -> None:
        name = str(rows["name"][row])
        if rows["up"][row] < 0:  # the root: "step 3", or "iteration 3" above ranks
            root = "iteration" if rows["kind"][row] == schema.KIND_ITERATION else "step"
            name = f"{root} {iteration}"
        box = add(
            row,
            parent_box,
            name,
            str(rows["level"][row]),
            int(start[row]),
            int(rows["dur_ns"][row]),
        )
        kids = children.get(row, [])
        phases = {rows["phase"][k] for k in kids if rows["level"][k] != schema.LEVEL_GPU}
        for run in _phase_runs(kids, rows["phase"]) if len(phases) > 1 else [kids]:
            if len(run) < 2 or len(phases) < 2:
                for k in run:
                    visit(k, box)
                continue
            first, last = run[0], run[-1]
            end = int(start[last] + rows["dur_ns"][last])
            phase = str(rows["phase"][first]) or "other"
            group = add(
                -1, box, f"{phase} ({len(run)})", PHASE, int(start[first]), end - int(start[first])
            )
            for k in run:
                visit(k, group)

    for root in children.get(-1, []):
        visit(root, -1)
    _cover_children(view)
    rest = np.nonzero(~keep)[0]
    for row in rest[np.argsort(start[rest], kind="stable")].tolist():
        add(
            row,
            NOT_IN_FLAME,
            str(rows["name"][row]),
            str(rows["level"][row]),
            int(start[row]),
            int(rows["dur_ns"][row]),
        )
    row_of = [-1] * len(view.names)  # each box's row in the iteration's table (-1: a phase box)
    for row, box in index_of.items():
        row_of[box] = row
    up = rows["up"]
    view.parent = [index_of.get(int(up[row]), -1) if row >= 0 else -1 for row in row_of]
    view.rows = [-1] * len(view.names)  # set by _timeline_rows
    return view, row_of


def _cover_children(view: StepView) -> None:
    """A box's extent reaches over its children's: the replay keeps children inside their
    parents, but a 1 ns span squeezed into a parent's last nanosecond can overshoot it by that
    nanosecond, and a phase box spans its run."""
    ends = [s + d for s, d in zip(view.starts_ns, view.durs_ns, strict=True)]
    for i in range(len(view.names) - 1, -1, -1):  # parents come before their children
        up = view.flame_parent[i]
        if up >= 0 and view.levels[i] != schema.LEVEL_GPU and ends[i] > ends[up]:
            ends[up] = ends[i]
            view.durs_ns[up] = ends[up] - view.starts_ns[up]


def _phase_runs(kids: list[int], phase: np.ndarray) -> list[list[int]]:
    """Consecutive children (already in time order) grouped by phase."""
    runs: list[list[int]] = []
    for k in kids:
        if runs and phase[runs[-1][-1]] == phase[k]:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def _timeline_rows(view: StepView, rows: dict[str, np.ndarray], row_of: list[int]) -> None:
    """A lane per (rank, host thread), a row per nesting depth in it; a lane per GPU stream."""
    lanes: dict[tuple, list[int]] = {}
    for box, row in enumerate(row_of):
        if row < 0:
            continue
        rank = int(rows["rank"][row])
        if rows["level"][row] == schema.LEVEL_GPU:
            key: tuple = (1, rank, int(rows["gpu_device"][row]), int(rows["gpu_stream"][row]))
        else:
            key = (0, rank, int(rows["thread_id"][row]))  # -1: the step (no thread of its own)
        lanes.setdefault(key, []).append(box)
    first = 0
    for key in sorted(lanes, key=lambda k: (k[0], min(view.starts_ns[b] for b in lanes[k]))):
        boxes = lanes[key]
        named = f"rank {key[1]} · " if key[1] >= 0 else ""
        if key[0]:
            named += f"GPU {key[2]} · stream {key[3]}"
            depth = {b: 0 for b in boxes}
        else:
            named += f"thread {key[2]}" if key[2] >= 0 else str(rows["kind"][row_of[boxes[0]]])
            low = min(int(rows["depth"][row_of[b]]) for b in boxes)
            depth = {b: int(rows["depth"][row_of[b]]) - low for b in boxes}
        for b in boxes:
            view.rows[b] = first + depth[b]
        count = max(depth.values()) + 1
        view.lanes.append((named, first, count))
        first += count


def _gpu_times(view: StepView, critical: dict[str, int]) -> None:
    """GPU time below each box, and each layer's GPU and critical-path time (notes 2 and 5)."""
    n = len(view.names)
    gpu = [
        d if v == schema.LEVEL_GPU else 0 for d, v in zip(view.durs_ns, view.levels, strict=True)
    ]
    # the flame's tree where it has the box, else the span's own parent (the timeline's)
    up = [
        p if p != NOT_IN_FLAME else u for p, u in zip(view.flame_parent, view.parent, strict=True)
    ]
    depth = [0] * n
    for i in range(n):  # a parent comes before its children in the flame's part
        depth[i] = depth[up[i]] + 1 if 0 <= up[i] < i else 0
    for i in sorted(range(n), key=lambda i: -depth[i]):
        if up[i] >= 0:
            gpu[up[i]] += gpu[i]
    view.gpu_ns = gpu
    own: dict[str, int] = {}
    for i in view.flame_boxes:
        if view.levels[i] == schema.LEVEL_GPU and view.layers[i]:
            own[view.layers[i]] = own.get(view.layers[i], 0) + view.durs_ns[i]
    view.layer_gpu_ns, view.critical_ns = [-1] * n, [-1] * n
    for i in view.flame_boxes:
        if view.kinds[i] != schema.KIND_MODULE:
            continue
        view.layer_gpu_ns[i] = _under(own, view.layers[i])
        if critical:
            view.critical_ns[i] = _under(critical, view.layers[i])


def _under(by_path: dict[str, int], path: str) -> int:
    """The sum over ``path`` and the paths below it (the root module's path is empty: all)."""
    prefix = path + "."
    return sum(v for p, v in by_path.items() if not path or p == path or p.startswith(prefix))
