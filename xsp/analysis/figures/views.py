"""Per-iteration pictures of a reconstruction: the flame view (host spans as a time-ordered icicle,
every box as wide as its span lasts) and the timeline (host threads and GPU streams as rows, as
Perfetto draws them). Pure functions from spans to plotly figures; the report places them.

Algorithm notes:
1. The iteration shown is the one with the median model latency; the flame of a multi-rank job
   shows that step's rank (its ranks run side by side, and the timeline shows them all).
2. Flame: only host spans. GPU work runs asynchronously after its launch call has returned, so it
   lies outside that call and belongs on the timeline. Values are integer nanoseconds with
   ``branchvalues="total"``: a box's width is its own duration, never the sum of its children.
   The reconstruction lays a thread's siblings end to end inside their parent; a child on another
   thread that runs beside them (gloo's all-reduce beside backward) is left out, or the children
   would add up to more than their parent, and the caption counts it.
3. Under a parent whose children belong to several phases (forward, backward, optimizer), each
   run of two or more consecutive same-phase children is drawn inside a box of that phase,
   as wide as the run's extent: the backward pass's hundreds of autograd nodes sit under
   "backward", not as slivers under the step.
4. When the iteration has more spans than a browser draws fluidly, the shortest are left out
   by a duration threshold (a child never outlasts its parent, so none is left without its
   parent); the caption says how many and below what duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.figures.present import short_label
from xsp.core import schema

__all__ = [
    "FLAME_MAX_BOXES",
    "LEVEL_COLOURS",
    "PHASE_COLOUR",
    "TIMELINE_HOST_DEPTHS",
    "Flame",
    "flame",
    "flame_figure",
    "legend_html",
    "median_iteration",
    "median_step",
    "timeline_figure",
]

#: Boxes beyond this many in the flame view are left out, shortest first (plotly stays fluid).
FLAME_MAX_BOXES = 6000
#: Host rows of the timeline: nesting depths below the model span drawn per thread.
TIMELINE_HOST_DEPTHS = 3
#: One colour per level, in stack order (the legend of both views).
LEVEL_COLOURS = {
    schema.LEVEL_MODEL: "#4c6ef5",
    schema.LEVEL_FRAMEWORK: "#2f9e44",
    schema.LEVEL_LIBRARY: "#f59f00",
    schema.LEVEL_GPU: "#e03131",
}
PHASE_COLOUR = "#adb5bd"


@dataclass(frozen=True)
class Flame:
    """The boxes of one iteration's flame view, parents before children, siblings by time."""

    iteration: int
    ids: list[str]
    parents: list[str]
    labels: list[str]
    names: list[str]  # full names, for hover
    values_ns: list[int]
    levels: list[str]  # a level, or "phase" for a phase box
    layer_gpu_ns: list[int]  # a layer box's GPU time, forward + backward (-1: none)
    left_out: int  # spans below the duration threshold
    threshold_ns: int
    rank: int = -1  # the rank whose step is shown (-1: a single-rank job)
    beside: int = 0  # spans left out as running beside their siblings on another thread


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
    rows = {c: np.asarray(one.column(c).fill_null(0)) for c in columns}
    for c in ("name", "level", "kind", "phase"):
        rows[c] = np.asarray(one.column(c).cast(pa.string()).fill_null(""), dtype=object)
    for c in ("thread_id", "gpu_device", "gpu_stream", "rank", "layer_gpu_ns"):
        rows[c] = np.asarray(one.column(c).fill_null(-1), dtype=np.int64)
    return rows


def flame(spans: pa.Table, max_boxes: int = FLAME_MAX_BOXES) -> Flame | None:
    """The flame boxes of the median iteration (see the module notes)."""
    found = median_step(spans)
    if found is None:
        return None
    iteration, rank = found
    rows = _iteration_rows(spans, iteration)
    host = (rows["level"] != schema.LEVEL_GPU) & ((rows["rank"] == rank) | (rank < 0))
    beside = _beside(rows, host)
    host &= ~beside
    keep = np.nonzero(host)[0]
    durations = rows["dur_ns"][keep]
    threshold = 0
    if len(keep) > max_boxes:
        threshold = int(np.sort(durations)[::-1][max_boxes - 1]) + 1
        keep = keep[durations >= threshold]
    keep = keep[np.argsort(rows["start_ns"][keep], kind="stable")]
    left_out = int(host.sum()) - len(keep)
    present = {int(rows["span_id"][i]) for i in keep}
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for row in keep.tolist():
        up = int(rows["parent_span_id"][row])
        (children.setdefault(up, []) if up in present else roots).append(row)
    out = Flame(iteration, [], [], [], [], [], [], [], left_out, threshold, rank, int(beside.sum()))

    def add(
        box: str, parent: str, label: str, name: str, value: int, level: str, gpu: int = -1
    ) -> None:
        out.layer_gpu_ns.append(gpu)
        out.ids.append(box)
        out.parents.append(parent)
        out.labels.append(label)
        out.names.append(name)
        out.values_ns.append(value)
        out.levels.append(level)

    def visit(i: int, parent: str) -> None:
        box = str(int(rows["span_id"][i]))
        name = str(rows["name"][i])
        label = name
        if not rows["parent_span_id"][i]:  # the root: "step 3", or "iteration 3" above ranks
            root = "iteration" if rows["kind"][i] == schema.KIND_ITERATION else "step"
            label = f"{root} {iteration}"
        level, gpu = str(rows["level"][i]), int(rows["layer_gpu_ns"][i])
        add(box, parent, short_label(label), name, int(rows["dur_ns"][i]), level, gpu)
        kids = children.get(int(rows["span_id"][i]), [])
        phases = {rows["phase"][k] for k in kids}
        for run in _phase_runs(kids, rows["phase"]) if len(phases) > 1 else [kids]:
            if len(run) < 2 or len(phases) < 2:
                for k in run:
                    visit(k, box)
                continue
            first, last = run[0], run[-1]
            extent = int(rows["start_ns"][last] + rows["dur_ns"][last] - rows["start_ns"][first])
            phase = str(rows["phase"][first]) or "other"
            group = f"{box}/{phase}@{int(rows['start_ns'][first])}"
            add(group, box, f"{phase} ({len(run)})", f"{phase}: {len(run)} spans", extent, "phase")
            for k in run:
                visit(k, group)

    for root in roots:
        visit(root, "")
    _cover_children(out)
    return out


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
    ids = rows["span_id"]
    while True:  # what they hold goes with them
        held = host & ~out & np.isin(parent, ids[out])
        if not held.any():
            return out
        out |= held


def _cover_children(boxes: Flame) -> None:
    """A box at least as wide as its children together (plotly draws no icicle otherwise): the
    replay keeps children inside their parents, and a 1 ns span squeezed into a parent's last
    nanosecond can overshoot it by that nanosecond."""
    children: dict[str, int] = {}
    for i in range(len(boxes.ids) - 1, -1, -1):  # parents come before their children
        boxes.values_ns[i] = max(boxes.values_ns[i], children.get(boxes.ids[i], 0))
        children[boxes.parents[i]] = children.get(boxes.parents[i], 0) + boxes.values_ns[i]


def _phase_runs(kids: list[int], phase: np.ndarray) -> list[list[int]]:
    """Consecutive children (already in time order) grouped by phase."""
    runs: list[list[int]] = []
    for k in kids:
        if runs and phase[runs[-1][-1]] == phase[k]:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def flame_figure(spans: pa.Table) -> Any:
    """The flame view as a plotly icicle, or None without model spans."""
    import plotly.graph_objects as go

    boxes = flame(spans)
    if boxes is None:
        return None
    colours = [LEVEL_COLOURS.get(level, PHASE_COLOUR) for level in boxes.levels]
    hover = [
        f"{name}<br>{value / 1e6:.3f} ms · {level}"
        + (f"<br>layer GPU time (forward + backward): {gpu / 1e6:.3f} ms" if gpu >= 0 else "")
        for name, value, level, gpu in zip(
            boxes.names, boxes.values_ns, boxes.levels, boxes.layer_gpu_ns, strict=True
        )
    ]
    figure = go.Figure(
        go.Icicle(
            ids=boxes.ids,
            parents=boxes.parents,
            labels=boxes.labels,
            values=boxes.values_ns,
            branchvalues="total",
            sort=False,
            marker={"colors": colours},
            hovertext=hover,
            hoverinfo="text",
            textinfo="label",
            tiling={"orientation": "v"},
            maxdepth=7,
        )
    )
    step_ms = boxes.values_ns[0] / 1e6 if boxes.values_ns else 0.0
    notes = []
    if boxes.left_out:
        notes.append(
            f"{boxes.left_out:,} spans shorter than {boxes.threshold_ns / 1e3:.1f} µs left out"
        )
    if boxes.beside:
        notes.append(f"{boxes.beside:,} spans on threads running beside them left out (timeline)")
    which = f"Iteration {boxes.iteration}" + (f", rank {boxes.rank}" if boxes.rank >= 0 else "")
    figure.update_layout(
        title=(
            f"{which} (median latency, {step_ms:.3f} ms), reconstructed: width is duration, "
            "left to right in time. Click a box to zoom."
            + ("<br>" + "; ".join(notes) if notes else "")
        ),
        margin={"t": 60 if notes else 40, "l": 5, "r": 5, "b": 5},
        height=650,
    )
    return figure


def timeline_figure(spans: pa.Table) -> Any:
    """One iteration as rows of host threads (a row per nesting depth) and GPU streams, in ms
    from the step's start; one trace per level, so the legend names the levels."""
    import plotly.graph_objects as go

    iteration = median_iteration(spans)
    if iteration is None:
        return None
    rows = _iteration_rows(spans, iteration)
    root = int(np.nonzero(rows["parent_span_id"] == 0)[0][0])
    origin = int(rows["start_ns"][root])
    depth = _depths(rows["span_id"], rows["parent_span_id"])
    gpu = rows["level"] == schema.LEVEL_GPU
    lane = np.empty(len(depth), dtype=object)
    for i in range(len(depth)):
        # the ranks of a multi-rank job are processes of their own: their threads are distinct
        rank = f"rank {rows['rank'][i]} · " if rows["rank"][i] >= 0 else ""
        if gpu[i]:
            lane[i] = f"{rank}GPU {rows['gpu_device'][i]} · stream {rows['gpu_stream'][i]}"
        elif depth[i] == 0:
            lane[i] = "step"
        elif rows["kind"][i] == schema.KIND_STEP:
            lane[i] = f"{rank}step"
        else:
            lane[i] = f"{rank}thread {rows['thread_id'][i]} · depth {depth[i]}"
    shown = gpu | (depth <= TIMELINE_HOST_DEPTHS)
    order = sorted(
        set(lane[shown]),
        key=lambda name: (name.startswith("GPU"), name != "step", name),
    )
    figure = go.Figure()
    for level, colour in LEVEL_COLOURS.items():
        pick = np.nonzero(shown & (rows["level"] == level))[0]
        if not len(pick):
            continue
        figure.add_trace(
            go.Bar(
                name=level,
                orientation="h",
                y=list(lane[pick]),
                base=((rows["start_ns"][pick] - origin) / 1e6).tolist(),
                x=(rows["dur_ns"][pick] / 1e6).tolist(),
                marker={"color": colour, "line": {"width": 0}},
                hovertext=[f"{rows['name'][i]}<br>{rows['dur_ns'][i] / 1e6:.3f} ms" for i in pick],
                hoverinfo="text",
            )
        )
    figure.update_layout(
        title=f"Timeline of iteration {iteration}, reconstructed (ms from the step's start)",
        barmode="overlay",
        bargap=0.15,
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None},
        xaxis={"title": "ms"},
        legend={"title": "level", "orientation": "h", "y": 1.02, "yanchor": "bottom"},
        margin={"t": 60, "l": 5, "r": 5, "b": 5},
        height=140 + 26 * len(order),
    )
    return figure


def _depths(span_id: np.ndarray, parent_id: np.ndarray) -> np.ndarray:
    from xsp.core.intervals import depths, find_rows

    return depths(find_rows(span_id.astype(np.int64), parent_id.astype(np.int64)))


def legend_html() -> str:
    """The levels' colours, for the flame view (an icicle has no legend of its own)."""
    swatches = [
        f"<span style='display:inline-block;width:.9em;height:.9em;background:{colour};"
        f"margin:0 .3em 0 1em;vertical-align:middle'></span>{level}"
        for level, colour in [*LEVEL_COLOURS.items(), ("phase group", PHASE_COLOUR)]
    ]
    return f"<p class='legend'>Levels:{''.join(swatches)}</p>"
