"""The replayed step checked twice, or marked unchecked with the reason.

1. **In-process.** The replayed step against the F process's own untraced iterations, each
   pair's traced iteration replayed with F's cost fitted to the pairs of the other fold
   (``xsp.analysis.replay.fit.held_out_steps``), so that the fit is never read back. The host ran
   at the same speed there, so this check holds for every workload, host- or GPU-bound: within
   ``IN_PROCESS_TOLERANCE_PCT``. Its own 95% interval (the pairs bootstrapped) says how much
   the host's iteration-to-iteration spread alone moves it.
2. **Across processes.** The replayed step against M's 95% interval over its processes
   (``xsp.analysis.replay.m_interval``): inside it, the replay agrees with M as far as the host's
   variance between processes lets anything agree.

``checked`` is true only when both ran. Where one cannot run (no untraced pairs kept, one M
process, no M level set), ``unchecked`` says which and why in one line each, and the views
print the verdict as unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from xsp.analysis.measurement.matching import level_sources
from xsp.analysis.measurement.store import MeasurementStore, texts
from xsp.analysis.measurement.untraced import INTERLEAVED, Untraced, untraced_steps
from xsp.analysis.replay.m_interval import (
    COVERAGE,
    RESAMPLES,
    SEED,
    MInterval,
    MIntervalJson,
    Position,
)
from xsp.core import schema

#: The in-process check holds when the replay is within this share of the untraced steps.
IN_PROCESS_TOLERANCE_PCT = 2.0


__all__ = [
    "IN_PROCESS_TOLERANCE_PCT",
    "AcrossProcessesCheck",
    "InProcessCheck",
    "ReplayChecks",
    "ReplayChecksJson",
    "check_replay",
]


class InProcessJson(TypedDict):
    """``InProcessCheck`` in ``xsp analyze --json``: its fields, in their order."""

    run: str
    untraced_ms: float
    replayed_ms: float
    error_pct: float
    error_low_pct: float
    error_high_pct: float
    holds: bool
    tolerance_pct: float
    pairs: int
    checked_iterations: list[int]
    added_ms: float | None
    records_per_iteration: float | None
    added_ns_per_record: float | None


class AcrossProcessesJson(MIntervalJson):
    """``AcrossProcessesCheck`` in ``xsp analyze --json``: the interval, and the replay in it."""

    replayed_ms: float
    position: str


class ReplayChecksJson(TypedDict):
    """``ReplayChecks`` in ``xsp analyze --json``."""

    in_process: InProcessJson | None
    m_interval: AcrossProcessesJson | None
    checked: bool
    unchecked: list[str]


@dataclass(frozen=True)
class InProcessCheck:
    """The replayed step against the F process's own held-out untraced steps."""

    run: str
    untraced_ms: float
    replayed_ms: float
    error_pct: float
    error_low_pct: float
    error_high_pct: float
    holds: bool
    tolerance_pct: float
    pairs: int
    checked_iterations: tuple[int, ...]
    # each pair's traced less untraced step, per F record: the workload's own cost of a
    # record where the host bounds the step (a floor where the GPU hides part of it)
    added_ms: float | None
    records_per_iteration: float | None
    added_ns_per_record: float | None

    def as_dict(self) -> InProcessJson:
        return {
            "run": self.run,
            "untraced_ms": self.untraced_ms,
            "replayed_ms": self.replayed_ms,
            "error_pct": self.error_pct,
            "error_low_pct": self.error_low_pct,
            "error_high_pct": self.error_high_pct,
            "holds": self.holds,
            "tolerance_pct": self.tolerance_pct,
            "pairs": self.pairs,
            "checked_iterations": list(self.checked_iterations),
            "added_ms": self.added_ms,
            "records_per_iteration": self.records_per_iteration,
            "added_ns_per_record": self.added_ns_per_record,
        }


@dataclass(frozen=True)
class AcrossProcessesCheck:
    """The replayed step against M's interval over its processes."""

    interval: MInterval
    replayed_ms: float
    position: Position

    def as_dict(self) -> AcrossProcessesJson:
        return {
            **self.interval.as_dict(),
            "replayed_ms": self.replayed_ms,
            "position": self.position,
        }


@dataclass(frozen=True)
class ReplayChecks:
    """Both checks of the replayed step (None: it did not run), and why each that did not run
    could not (``xsp analyze --json``'s ``reconstruction.replay`` check fields)."""

    in_process: InProcessCheck | None = None
    m_interval: AcrossProcessesCheck | None = None
    unchecked: tuple[str, ...] = field(default_factory=tuple)

    @property
    def checked(self) -> bool:
        return self.in_process is not None and self.m_interval is not None and not self.unchecked

    def as_dict(self) -> ReplayChecksJson:
        return {
            "in_process": None if self.in_process is None else self.in_process.as_dict(),
            "m_interval": None if self.m_interval is None else self.m_interval.as_dict(),
            "checked": self.checked,
            "unchecked": list(self.unchecked),
        }


def check_replay(
    store: MeasurementStore,
    replayed: float | None,
    interval: MInterval | None,
    held_out: dict[int, float] | None,
) -> ReplayChecks:
    """Both checks of the replayed step ``replayed`` (the median of the steady iterations);
    ``held_out``: each pair's step replayed with the cost fitted to the other fold."""
    unchecked: list[str] = []
    own = untraced_steps(store)
    in_process = _in_process(store, own, held_out, unchecked)
    across: AcrossProcessesCheck | None = None
    if interval is None:
        unchecked.append(
            "across processes: no M level set, so nothing measured the untraced step across "
            "processes (run with --levels M,...)"
        )
    elif replayed is None:
        unchecked.append("across processes: no replayed step was steady")
    else:
        across = AcrossProcessesCheck(interval, replayed, interval.position(replayed))
        if interval.single:
            unchecked.append(
                "across processes: M ran in one process, so the host's variance between "
                "processes cannot be told apart from overhead (--m-processes 3 or more)"
            )
    return ReplayChecks(in_process, across, tuple(unchecked))


def _in_process(
    store: MeasurementStore,
    own: Untraced | None,
    held_out: dict[int, float] | None,
    unchecked: list[str],
) -> InProcessCheck | None:
    if own is None:
        unchecked.append(
            "in-process: no untraced steps of an F process (no level F, or a store without "
            "warm-up steps)"
        )
        return None
    if own.source != INTERLEAVED:
        why = own.skipped or (
            "it did not interleave: a store recorded before xsp did, a single level set, or "
            "--no-interleave"
        )
        unchecked.append(
            f"in-process: the {own.run} process kept no untraced iterations between its traced "
            f"ones ({why}); F's cost was fitted to its warm-up's untraced steps, so nothing is "
            "held out to check the replay against"
        )
        return None
    if held_out is None:
        unchecked.append(
            f"in-process: the {own.run} process kept {own.pairs} untraced/traced pair; the fit "
            "read it, so nothing is held out (measure 2 iterations or more)"
        )
        return None
    checked = sorted(i for i in held_out if i in own.before)
    if not checked:
        unchecked.append(f"in-process: none of the {own.run} process's pairs replayed steady")
        return None
    replayed_each = np.array([held_out[i] for i in checked])
    untraced_each = np.array([own.before[i] for i in checked])
    untraced, replayed = float(np.median(untraced_each)), float(np.median(replayed_each))
    error = 100.0 * (replayed - untraced) / untraced
    low, high = _error_interval(replayed_each, untraced_each)
    added = own.added_ms()
    records = _records_per_iteration(store)
    return InProcessCheck(
        run=own.run,
        untraced_ms=untraced,
        replayed_ms=replayed,
        error_pct=error,
        error_low_pct=low,
        error_high_pct=high,
        holds=abs(error) <= IN_PROCESS_TOLERANCE_PCT,
        tolerance_pct=IN_PROCESS_TOLERANCE_PCT,
        pairs=own.pairs,
        checked_iterations=tuple(checked),
        added_ms=added,
        records_per_iteration=records,
        added_ns_per_record=1e6 * added / records if added is not None and records else None,
    )


def _error_interval(replayed: np.ndarray, untraced: np.ndarray) -> tuple[float, float]:
    """The 95% interval (%) of the median replayed step against the median untraced one, the
    pairs resampled together (seeded): how far the host's own spread moves the check."""
    rng = np.random.default_rng(SEED)
    drawn = rng.integers(0, len(replayed), (RESAMPLES, len(replayed)))
    ratios = np.median(replayed[drawn], axis=1) / np.median(untraced[drawn], axis=1)
    tail = (1 - COVERAGE) / 2 * 100
    low, high = np.percentile(100.0 * (ratios - 1.0), [tail, 100 - tail])
    return float(low), float(high)


def _records_per_iteration(store: MeasurementStore) -> float | None:
    """The F run's F records (ops and modules) per traced iteration."""
    _, source_of = level_sources(store)
    source = source_of.get(schema.LEVEL_FRAMEWORK)
    if source is None:
        return None
    table = store.run_spans(source)
    level = texts(table.column("level"))
    kind = texts(table.column("kind"))
    steps = int(np.count_nonzero(kind == schema.KIND_STEP))
    framework = int(np.count_nonzero(level == schema.LEVEL_FRAMEWORK))
    return framework / steps if steps else None
