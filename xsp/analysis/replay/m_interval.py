"""M across processes: the untraced step as a median with a 95% interval.

A host-bound step moved by up to ±25% between processes with nothing changed on the lent H100
and H200 hosts, so one M process is one draw (``xsp.tracer.run.m_processes`` times M in several).
The interval is a two-stage bootstrap, as for data nested in groups: each resample draws the
processes with replacement, then each drawn process's steady steps with replacement, and takes
the median of what it drew; the interval is the 2.5th to 97.5th percentile of ``RESAMPLES`` such
medians (seeded, so the same store gives the same interval). Resampling the processes first makes
the interval as wide as the processes disagree: with one process it holds the spread of its
iterations alone, which cannot tell the host's variance from the tracer's overhead
(``MInterval.single``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.analysis.replay.host_timeline import steady
from xsp.core import schema
from xsp.core.columns import numbers
from xsp.core.errors import StoreError
from xsp.core.store import MANIFEST, Status, open_run, read_manifest

__all__ = [
    "COVERAGE",
    "MANIFEST_KEY",
    "MODEL_ONLY",
    "M_PROCESS_STEPS",
    "RESAMPLES",
    "SEED",
    "MInterval",
    "MIntervalJson",
    "Position",
    "interval",
    "m_interval",
    "process_steps",
    "steady_steps_ms",
]

#: Bootstrap resamples, the interval's coverage, and the generator's seed.
RESAMPLES = 2000
COVERAGE = 0.95
SEED = 0
#: The manifest's list of the further M processes (``xsp.tracer.run.m_processes``).
MANIFEST_KEY = "m_processes"
MODEL_ONLY = "M"


class MIntervalJson(TypedDict):
    """``MInterval`` in ``xsp analyze --json``."""

    median_ms: float
    low_ms: float
    high_ms: float
    processes: int
    process_medians_ms: list[float]
    iterations: int
    coverage: float


class Position(StrEnum):
    """Where a step lies against M's interval (a ``str``: JSON and the lines hold the word)."""

    INSIDE = "inside"
    ABOVE = "above"
    BELOW = "below"


@dataclass(frozen=True)
class MInterval:
    """M's median step over its processes' steady steps and the interval of that median."""

    median_ms: float
    low_ms: float
    high_ms: float
    process_medians_ms: tuple[float, ...]
    iterations: int

    @property
    def processes(self) -> int:
        return len(self.process_medians_ms)

    @property
    def single(self) -> bool:
        """One process: the interval holds its iterations' spread, not the host's."""
        return self.processes < 2

    def contains(self, ms: float) -> bool:
        return self.low_ms <= ms <= self.high_ms

    def position(self, ms: float) -> Position:
        """Where ``ms`` lies against the interval."""
        if ms > self.high_ms:
            return Position.ABOVE
        return Position.BELOW if ms < self.low_ms else Position.INSIDE

    def as_dict(self) -> MIntervalJson:
        return {
            "median_ms": self.median_ms,
            "low_ms": self.low_ms,
            "high_ms": self.high_ms,
            "processes": self.processes,
            "process_medians_ms": list(self.process_medians_ms),
            "iterations": self.iterations,
            "coverage": COVERAGE,
        }

    def describe(self) -> str:
        """One line: the median, its interval and each process's median."""
        each = ", ".join(f"{ms:.3f}" for ms in self.process_medians_ms)
        return (
            f"M over {self.processes} process{'es' if self.processes != 1 else ''}: "
            f"{self.median_ms:.3f} ms, {COVERAGE:.0%} interval {self.low_ms:.3f}-"
            f"{self.high_ms:.3f} ms (process medians {each} ms)"
        )


def steady_steps_ms(table: pa.Table) -> np.ndarray:
    """A run's complete steps (ms) that are steady (``host_timeline.steady``)."""
    kind = texts(table.column("kind"))
    ok = (kind == schema.KIND_STEP) & numbers(table.column("status_message").is_null())
    steps = numbers(table.column("dur_ns"))[ok].astype(np.float64) / 1e6
    return steps[steady(steps)] if len(steps) else steps


def process_steps(store: MeasurementStore) -> list[np.ndarray]:
    """Each M process's steady steps (ms): the measurement's own M run first, then the further
    processes its manifest lists that were ok. Empty without an M run."""
    return M_PROCESS_STEPS.of(store)


def _process_steps(store: MeasurementStore) -> list[np.ndarray]:
    first = next((i for i, run in enumerate(store.runs) if run.levels == MODEL_ONLY), None)
    if first is None:
        return []
    groups = [steady_steps_ms(store.run_spans(first))]
    manifest_path = store.root / MANIFEST
    listed = read_manifest(manifest_path).m_processes if manifest_path.exists() else None
    for entry in listed or ():
        if entry.status != Status.OK:
            continue
        path = entry.path
        if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/"):
            store.warnings.append(f"{manifest_path}: {MANIFEST_KEY} lists a bad path {path!r}")
            continue
        try:
            steps = steady_steps_ms(open_run(store.root / path / MODEL_ONLY).spans())
        except StoreError as exc:
            store.warnings.append(f"M process {entry.process}: {exc}; left out")
            continue
        if len(steps):
            groups.append(steps)
    return [g for g in groups if len(g)]


#: Each M process's steady steps (``process_steps``).
M_PROCESS_STEPS = Derived("m_process_steps", _process_steps)


def m_interval(store: MeasurementStore) -> MInterval | None:
    """M's median and interval over its processes (None without an M run with steps)."""
    groups = process_steps(store)
    return interval(groups) if groups else None


def interval(groups: list[np.ndarray]) -> MInterval:
    """The median of every group's values pooled, and its two-stage bootstrap interval."""
    k = len(groups)
    longest = max(len(g) for g in groups)
    rng = np.random.default_rng(SEED)
    # each group's values resampled RESAMPLES times, padded with NaN to the longest group
    drawn = np.full((k, RESAMPLES, longest), np.nan)
    for g, values in enumerate(groups):
        drawn[g, :, : len(values)] = values[rng.integers(0, len(values), (RESAMPLES, len(values)))]
    chosen = rng.integers(0, k, (RESAMPLES, k))  # the processes each resample draws
    pooled = drawn[chosen, np.arange(RESAMPLES)[:, None], :].reshape(RESAMPLES, -1)
    medians = np.nanmedian(pooled, axis=1)
    tail = (1 - COVERAGE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    every = np.concatenate(groups)
    return MInterval(
        median_ms=float(np.median(every)),
        low_ms=float(low),
        high_ms=float(high),
        process_medians_ms=tuple(float(np.median(g)) for g in groups),
        iterations=len(every),
    )
