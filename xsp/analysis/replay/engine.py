"""The discrete replay of every step of a graph (``xsp.analysis.replay``, steps 3 and 4): each
rank's step replayed (``Iteration``), the ranks of an iteration joined by their collectives, and
the outcome gathered into a ``Replay``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.analysis.replay.causes import cause_column
from xsp.analysis.replay.checks import ReplayChecks
from xsp.analysis.replay.collectives import Collectives
from xsp.analysis.replay.edits import Timing, WhatIf, timing
from xsp.analysis.replay.graph import Graph
from xsp.analysis.replay.host_timeline import (
    Calibration,
    measured_steps,
    steady,
    step_ranks,
)
from xsp.analysis.replay.iteration import Iteration
from xsp.analysis.replay.m_interval import MInterval, m_interval
from xsp.analysis.replay.result import (
    Guarantees,
    IterationResult,
    RankWait,
    ReplayResult,
    median_steady_ms,
)
from xsp.core.columns import arrow, numbers, rows_table

__all__ = ["Replay", "replay_graph"]

#: The replay's per-iteration table (``Replay.steps``).
_STEPS_SCHEMA = pa.schema(
    [
        ("iteration", pa.int64()),
        ("replayed_ms", pa.float64()),
        ("measured_ms", pa.float64()),
        ("deep_ms", pa.float64()),
        ("error_pct", pa.float64()),
        ("steady", pa.bool_()),
    ]
)


@dataclass
class Replay:
    """The replayed timeline of the deep run's spans and where each step's time went.

    ``start_ns``/``dur_ns`` hold every row of ``spans`` (the deep run's), replayed, the
    iterations laid end to end from the deep run's first step's start; ``steps``
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
    #: what the replay guarantees by construction, counted (None: a what-if's, not counted)
    guarantees: Guarantees | None = None
    #: M's interval over its processes, where M is what the replay is checked against
    interval: MInterval | None = None
    #: the replayed step against the F process's held-out untraced steps and M's interval
    verified: ReplayChecks | None = None
    #: per rank's step of a job whose collectives span ranks: the time its collectives waited
    #: for the last rank to arrive
    collective_waits: tuple[RankWait, ...] = ()

    def iterations(self) -> tuple[IterationResult, ...]:
        return tuple(IterationResult(**row) for row in self.steps.to_pylist())

    def result(self) -> ReplayResult:
        """The replayed step against the measured one, typed."""
        iterations = self.iterations()
        replayed = median_steady_ms(iterations)
        measured = self.measured_step_ms
        error = (
            100.0 * (replayed - measured) / measured if replayed is not None and measured else None
        )
        return ReplayResult(
            step_ms=replayed,
            measured_step_ms=measured,
            measured_run=self.measured_run,
            error_pct=error,
            iterations=iterations,
            calibration=self.calibration,
            guarantees=self.guarantees,
            verified=self.verified or ReplayChecks(),
            collective_waits=self.collective_waits,
            median_collective_wait_ms=self.median_waits_ms(),
        )

    def summary(self) -> dict[str, object]:
        """``xsp analyze --json``'s ``reconstruction.replay`` (``result().to_json()``)."""
        return self.result().to_json()

    def median_waits_ms(self) -> dict[int, float]:
        """Each rank's median wait a step (ms) for the last rank to arrive at its collectives."""
        waits: dict[int, list[int]] = {}
        for row in self.collective_waits:
            waits.setdefault(row.rank, []).append(row.wait_ns)
        return {rank: float(np.median(ns)) / 1e6 for rank, ns in sorted(waits.items())}

    def own_steps_ms(self) -> dict[int, float]:
        """Each rank's median own time a step (ms, over the steady steps): its replayed step
        less its wait for the last rank to arrive at its collectives, what it would take at its
        own pace."""
        kind = texts(self.spans.column("kind"))
        iteration = numbers(self.spans.column("iteration"), null=-1).astype(np.int64, copy=False)
        ranks = step_ranks(self.spans)
        steady_ones = set(
            pc.filter(self.steps.column("iteration"), self.steps.column("steady")).to_pylist()
        )
        waits = {(w.iteration, w.rank): w.wait_ns for w in self.collective_waits}
        own: dict[int, list[int]] = {}
        for row in np.nonzero(kind == "step")[0].tolist():
            step, rank = int(iteration[row]), int(ranks[row])
            if step in steady_ones and rank >= 0:
                wait = waits.get((step, rank), 0)
                own.setdefault(rank, []).append(int(self.dur_ns[row]) - wait)
        return {rank: float(np.median(ns)) / 1e6 for rank, ns in sorted(own.items())}


def replay_graph(store: MeasurementStore, g: Graph, edit: WhatIf | None = None) -> Replay:
    """Every step of ``g`` replayed with ``edit`` applied (None: as measured, with the critical
    path and the guarantees counted; a what-if needs only its steps). The checks against the
    untraced steps are the caller's (``xsp.analysis.replay.replay``)."""
    times = timing(g, edit)
    sims, arrivals = _across_ranks(
        lambda position, arrived: _run_step(g, times, position, arrived),
        len(g.steps),
        g.collectives,
    )
    out_start, out_dur = g.start.copy(), g.dur.copy()
    for sim in sims:
        out_start[sim.rows] = sim.start
        out_dur[sim.rows] = sim.dur
    _chain_iterations(g, out_start, out_dur)
    measured, measured_run = measured_steps(store, g.deep_index)
    # against M's median: the iterations of different processes do not pair up
    measured_ms = float(np.median(list(measured.values()))) if measured else None
    interval = m_interval(store) if measured_run == "M" else None
    if interval is not None:  # M over its processes, where it ran in several
        measured_ms = interval.median_ms
    return Replay(
        g.deep,
        g.parent,
        out_start,
        out_dur,
        g.calibration,
        measured_run,
        measured_ms,
        _step_rows(g, out_dur, measured, measured_ms),
        _path_table(g, sims if edit is None else []),
        _guarantees(g, out_start, out_dur) if edit is None else None,
        interval,
        None,
        _rank_waits(g, sims) if arrivals is not None else (),
    )


def _chain_iterations(g: Graph, start: np.ndarray, dur: np.ndarray) -> None:
    """Lay the replayed iterations end to end, in place: each iteration (its ranks' steps
    together, and every row of it) moves so that it starts where the one before it ended, as
    the untraced program runs them. Each was replayed from the deep run's step, which the
    tracer's cost spread apart (207 ms of gaps over ResNet-50 b64's 20 steps), and a timeline
    tool (HTA, Perfetto) would count those gaps as idle GPU. A shift moves a whole iteration,
    so nothing within it, its ranks' collectives included, changes; the first stays where the
    deep run began it."""
    steps = g.steps
    if len(steps) < 2:
        return
    iterations, at = np.unique(g.iteration[steps], return_inverse=True)
    at = at.reshape(-1)
    begin = np.full(len(iterations), np.iinfo(np.int64).max, dtype=np.int64)
    end = np.full(len(iterations), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(begin, at, start[steps])
    np.maximum.at(end, at, start[steps] + dur[steps])
    # iteration k begins at iteration k-1's end, itself moved: a running sum of the lengths
    length = end - begin
    chained = begin[0] + np.concatenate(([0], np.cumsum(length[:-1])))
    shift = chained - begin
    rows = np.nonzero(np.isin(g.iteration, iterations))[0]
    start[rows] += shift[np.searchsorted(iterations, g.iteration[rows])]


def _run_step(g: Graph, times: Timing, position: int, arrivals: np.ndarray | None) -> Iteration:
    sim = Iteration(g, times, position, arrivals)
    sim.run()
    return sim


def _across_ranks(
    run_step: Callable[[int, np.ndarray | None], Iteration], count: int, found: Collectives
) -> tuple[list[Iteration], np.ndarray | None]:
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


def _step_rows(
    g: Graph,
    out_dur: np.ndarray,
    measured: dict[tuple[int, int], float],
    measured_ms: float | None,
) -> pa.Table:
    """One row per step: replayed, measured (M's of its iteration and rank), the deep run's,
    the error against M's median, and whether it is steady."""
    rank = step_ranks(g.deep)
    replayed_ms = out_dur[g.steps] / 1e6
    deep_ms = g.dur[g.steps] / 1e6
    keep = steady(deep_ms) & steady(replayed_ms)
    rows = []
    for position, step in enumerate(g.steps):
        it = int(g.iteration[step])
        replayed = float(replayed_ms[position])
        rows.append(
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
    return rows_table(rows, schema=_STEPS_SCHEMA)


def _path_table(g: Graph, sims: list[Iteration]) -> pa.Table:
    """The steps' critical paths: each charged row, its cause and nanoseconds."""
    charged = [sim.critical_path() for sim in sims]
    rows = np.concatenate([r for r, _ in charged]) if charged else np.zeros(0, np.int64)
    ns = np.concatenate([n for _, n in charged]) if charged else np.zeros(0, np.int64)
    return pa.Table.from_arrays(
        [
            arrow(g.iteration[rows], pa.int64()),
            cause_column(g.causes[rows]),
            arrow(rows, pa.int64()),
            arrow(ns, pa.int64()),
        ],
        names=["iteration", "cause", "row", "dur_ns"],
    )


def _rank_waits(g: Graph, sims: list[Iteration]) -> tuple[RankWait, ...]:
    """Each rank's step's wait for the last rank to arrive at its collectives."""
    rank = step_ranks(g.deep)
    return tuple(
        RankWait(
            iteration=int(g.iteration[sim.step]),
            rank=int(rank[sim.step]),
            wait_ns=int(np.maximum(sim.last_arrival - sim.work_start, 0).sum()),
        )
        for sim in sims
        if len(sim.work_index)
    )


def _guarantees(g: Graph, start: np.ndarray, dur: np.ndarray) -> Guarantees:
    """What the replay guarantees by construction, counted: activities before their launch
    call, overlapping another of their stream, and anything outside its step."""
    parent, owner, device, stream = g.parent, g.owner, g.device, g.stream
    act = np.nonzero(g.gpu)[0]
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
    return Guarantees(
        activities_before_launch=before,
        activities_overlapping_on_a_stream=overlap,
        spans_outside_their_step=outside,
    )
