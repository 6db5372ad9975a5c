"""Memory over the step: the bytes the allocator held through one iteration, by the layer that
allocated them, with the peak and the layers whose allocations are still held at the peak.

Algorithm notes:

1. The events are level F's (``memory.parquet``) of the run ``memory.memory_run`` picks. The
   device is the one whose allocator held the most (a multi-rank job's: with its rank), the
   iteration the first whose peak is the run's peak; time 0 is that iteration's step start.
2. An allocation belongs to the layer (module path) its op ran in; one outside every layer to
   its phase (``(no layer: optimizer)``).
3. The events carry sizes, not addresses, so a free is paired with the latest allocation of
   the same size and device still held (last allocated, first freed: temporaries and the
   backward's release of saved activations both go that way). Sizes pair exactly; which layer
   of several owns a freed block is the one guess, and ``frees_with_choice`` counts the frees
   that had blocks of more than one layer to pick from. A free with no such allocation in the
   iteration releases bytes held from before the step.
4. Held from before the step is the allocator's total less what the iteration's layers hold:
   parameters, gradients and optimizer state from earlier steps, and allocations made outside
   any framework span (the store keeps only events inside one). So the bands always add up to
   the recorded total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.tables.memory import memory_run
from xsp.core import schema

__all__ = [
    "BEFORE",
    "CHART_LAYERS",
    "CHART_POINTS",
    "MEMORY_TIMELINE",
    "OTHERS",
    "SERIES_POINTS",
    "MemoryTimeline",
    "alive_at_peak",
    "bands",
    "device_name",
    "memory_timeline",
    "sample",
    "series",
    "sparkline",
]

#: Layers the chart draws as bands of their own (by bytes held at the peak); the rest are one.
CHART_LAYERS = 12
#: Points of the ``--json`` series (and of the chart, for iterations with more events).
SERIES_POINTS = 400
CHART_POINTS = 4000
BEFORE = "(held from before the step)"
OTHERS = "(other layers)"


@dataclass(frozen=True)
class MemoryTimeline:
    """One iteration's allocator events on one device, time-ordered. ``owner`` names the band
    each event's bytes move in or out of (an allocation's own layer, a free's paired
    allocation's, ``BEFORE`` for a free of a block older than the step); ``layer`` is the layer
    the event happened in."""

    levels: str
    device: str
    iteration: int
    time_ms: np.ndarray
    total_bytes: np.ndarray
    delta_bytes: np.ndarray
    layer: list[str]
    owner: list[str]
    peak: int  # index of the first event at the peak
    peak_where: str  # its layer, op and phase
    frees: int
    frees_with_choice: int
    layer_types: dict[str, str]

    @property
    def peak_bytes(self) -> int:
        return int(self.total_bytes[self.peak])

    @property
    def peak_ms(self) -> float:
        return float(self.time_ms[self.peak])

    def held(self, until: int) -> dict[str, int]:
        """Bytes each layer's allocations hold after event ``until`` (layers holding some),
        ``BEFORE`` with the rest of the allocator's total."""
        out: dict[str, int] = {}
        for owner, delta in zip(
            self.owner[: until + 1], self.delta_bytes[: until + 1].tolist(), strict=True
        ):
            if owner != BEFORE:
                out[owner] = out.get(owner, 0) + delta
        out = {k: v for k, v in out.items() if v}
        out[BEFORE] = int(self.total_bytes[until]) - sum(out.values())
        return out


def device_name(kind: str | None, index: int | None) -> str:
    """The allocator's device as a person names it: "CPU" (the CPU allocator's index is -1),
    "GPU 0" for cuda:0, else kind:index."""
    if kind == "cpu":
        return "CPU"
    if kind == "cuda" and index is not None and index >= 0:
        return f"GPU {index}"
    return f"{kind}:{index}"


def memory_timeline(store: MeasurementStore) -> MemoryTimeline | None:
    """The timeline of the measurement's peak iteration (module notes); None without allocator
    events. Once per store."""
    return MEMORY_TIMELINE.of(store)


def _timeline(store: MeasurementStore) -> MemoryTimeline | None:
    found = memory_run(store)
    if found is None:
        return None
    levels, events = found
    keys = ["rank", "device", "device_index"] if "rank" in events.column_names else []
    keys = keys or ["device", "device_index"]
    # 1. the device whose allocator held the most, and its first iteration at that peak
    top = events.group_by(keys).aggregate([("total_allocated", "max")])
    best = top.take([int(pc.index(top["total_allocated_max"], pc.max(top["total_allocated_max"])))])
    chosen = np.ones(events.num_rows, dtype=bool)
    for key in keys:
        chosen &= np.asarray(pc.equal(events[key], best[key][0]).fill_null(False))
    events = events.filter(pa.array(chosen))
    peaks = events.group_by("iteration").aggregate([("total_allocated", "max")])
    at_peak = pc.equal(peaks["total_allocated_max"], pc.max(peaks["total_allocated_max"]))
    iteration = int(pc.min(peaks["iteration"].filter(at_peak)).as_py())
    events = events.filter(pc.equal(events["iteration"], iteration))
    events = events.take(pc.sort_indices(events["time_ns"]))  # stable: stored order on ties
    time_ns = np.asarray(events["time_ns"], dtype=np.int64)
    delta = np.asarray(events["bytes"], dtype=np.int64)
    total = np.asarray(events["total_allocated"], dtype=np.int64)
    # 2. each event's layer
    paths = events["module_path"].cast(pa.string()).to_pylist()
    phases = events["phase"].cast(pa.string()).to_pylist()
    layer = [
        p if p is not None else f"(no layer: {ph or 'unknown'})"
        for p, ph in zip(paths, phases, strict=True)
    ]
    types = events["module_type"].to_pylist()
    layer_types = {p: t for p, t in zip(paths, types, strict=True) if p is not None and t}
    owner, frees, choice = _pair(delta.tolist(), layer)
    start = _step_start(store, levels, iteration, events)
    peak = int(np.argmax(total))
    ops = events["op_name"].cast(pa.string()).to_pylist()
    device = device_name(best["device"][0].as_py(), best["device_index"][0].as_py())
    if "rank" in keys:
        device = f"rank {best['rank'][0].as_py()} {device}"
    return MemoryTimeline(
        levels=levels,
        device=device,
        iteration=iteration,
        time_ms=(time_ns - (start if start is not None else time_ns[0])) / 1e6,
        total_bytes=total,
        delta_bytes=delta,
        layer=layer,
        owner=owner,
        peak=peak,
        peak_where=f"{layer[peak]}, {ops[peak]} ({phases[peak]})",
        frees=frees,
        frees_with_choice=choice,
        layer_types=layer_types,
    )


def _pair(delta: list[int], layer: list[str]) -> tuple[list[str], int, int]:
    """Note 3: each event's owner, the frees, and the frees that had several layers' blocks of
    their size to pick from."""
    held: dict[int, list[str]] = {}  # size -> owners of its held blocks, oldest first
    owners_of: dict[int, dict[str, int]] = {}  # size -> owner -> held blocks
    owner: list[str] = []
    frees = choice = 0
    for size, here in zip(delta, layer, strict=True):
        if size >= 0:
            held.setdefault(size, []).append(here)
            counts = owners_of.setdefault(size, {})
            counts[here] = counts.get(here, 0) + 1
            owner.append(here)
            continue
        frees += 1
        stack = held.get(-size)
        if not stack:
            owner.append(BEFORE)
            continue
        counts = owners_of[-size]
        choice += len(counts) > 1
        paired = stack.pop()
        counts[paired] -= 1
        if not counts[paired]:
            del counts[paired]
        owner.append(paired)
    return owner, frees, choice


def _step_start(
    store: MeasurementStore, levels: str, iteration: int, events: pa.Table
) -> int | None:
    """The start of the iteration's step span in the events' run (the rank's, if ranked)."""
    index = next(i for i, run in enumerate(store.runs) if run.levels == levels)
    spans = store.run_spans(index)
    rows = pc.and_(
        pc.equal(spans["kind"], schema.KIND_STEP), pc.equal(spans["iteration"], iteration)
    )
    if "rank" in events.column_names and events.num_rows:
        rows = pc.and_(rows, pc.equal(spans["rank"], events["rank"][0]))
    starts = spans["start_ns"].filter(rows)
    return int(pc.min(starts).as_py()) if len(starts) else None


def alive_at_peak(timeline: MemoryTimeline) -> pa.Table:
    """The layers whose allocations are held at the peak: bytes, blocks and share of the peak,
    most first; bytes held from before the step are in the note, not a row."""
    held = timeline.held(timeline.peak)
    blocks: dict[str, int] = {}
    for owner, delta in zip(
        timeline.owner[: timeline.peak + 1],
        timeline.delta_bytes[: timeline.peak + 1].tolist(),
        strict=True,
    ):
        if owner != BEFORE:
            blocks[owner] = blocks.get(owner, 0) + (1 if delta > 0 else -1)
    rows = sorted(((b, k) for k, b in held.items() if k != BEFORE and b > 0), reverse=True)
    peak = timeline.peak_bytes
    return pa.table(
        {
            "layer": pa.array([k for _, k in rows], pa.string()),
            "layer_type": pa.array([timeline.layer_types.get(k) for _, k in rows], pa.string()),
            "held_bytes": pa.array([b for b, _ in rows], pa.int64()),
            "held_allocations": pa.array([blocks.get(k, 0) for _, k in rows], pa.int64()),
            "share_of_peak_pct": pa.array(
                [100.0 * b / peak if peak else 0.0 for b, _ in rows], pa.float64()
            ),
        }
    )


def sample(total: np.ndarray, points: int) -> np.ndarray:
    """Indices of at most ``points`` events that keep the line's shape: the first and last,
    and each of ``points // 2`` equal runs' lowest and highest (so the peak, exactly)."""
    n = len(total)
    if n <= points:
        return np.arange(n)
    chosen = {0, n - 1, int(np.argmax(total))}
    for run in np.array_split(np.arange(n), max(1, (points - 3) // 2)):
        chosen.add(int(run[np.argmin(total[run])]))
        chosen.add(int(run[np.argmax(total[run])]))
    return np.asarray(sorted(chosen), dtype=np.int64)


def series(timeline: MemoryTimeline, points: int = SERIES_POINTS) -> dict[str, Any]:
    """The compact form ``xsp analyze --json`` carries: the peak, the bytes held from before the
    step, and at most ``points`` events as [ms from the step's start, allocated bytes, layer]."""
    rows = sample(timeline.total_bytes, points)
    return {
        "levels": timeline.levels,
        "device": timeline.device,
        "iteration": timeline.iteration,
        "events": len(timeline.total_bytes),
        "peak_bytes": timeline.peak_bytes,
        "peak_ms": timeline.peak_ms,
        "peak_in": timeline.peak_where,
        "held_from_before_step_bytes": timeline.held(timeline.peak)[BEFORE],
        "frees": timeline.frees,
        "frees_with_choice": timeline.frees_with_choice,
        "points": [
            [round(float(timeline.time_ms[i]), 6), int(timeline.total_bytes[i]), timeline.layer[i]]
            for i in rows.tolist()
        ],
    }


def bands(timeline: MemoryTimeline, layers: int = CHART_LAYERS) -> dict[str, np.ndarray]:
    """Bytes held after each event by the ``layers`` layers holding most at the peak (each),
    the other layers (together) and from before the step, in stacking order (bottom first)."""
    held = timeline.held(timeline.peak)
    ranked = sorted((k for k in held if k != BEFORE), key=lambda k: -held[k])[:layers]
    column = {k: i for i, k in enumerate(ranked)}
    others = len(ranked)
    n = len(timeline.owner)
    changes = np.zeros((n, others + 1), dtype=np.int64)
    for i, (owner, delta) in enumerate(
        zip(timeline.owner, timeline.delta_bytes.tolist(), strict=True)
    ):
        if owner != BEFORE:
            changes[i, column.get(owner, others)] = delta
    running = np.cumsum(changes, axis=0)
    out = {BEFORE: timeline.total_bytes - running.sum(axis=1)}
    for k, i in column.items():
        out[k] = running[:, i]
    out[OTHERS] = running[:, others]
    return out


def sparkline(timeline: MemoryTimeline, width: int = 60) -> str:
    """The allocated bytes over the step in ``width`` block characters (each the highest of its
    stretch of events), for the terminal."""
    total = timeline.total_bytes
    runs = np.array_split(np.arange(len(total)), min(width, len(total)))
    highs = np.asarray([total[r].max() for r in runs], dtype=np.float64)
    low, high = float(total.min()), float(total.max())
    marks = "▁▂▃▄▅▆▇█"
    scale = (highs - low) / (high - low) if high > low else np.ones(len(highs))
    return "".join(marks[min(int(s * len(marks)), len(marks) - 1)] for s in scale)


#: The memory over the step (``memory_timeline``).
MEMORY_TIMELINE = Derived("memory_timeline", _timeline, needs=("memory_events",))
