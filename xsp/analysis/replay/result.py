"""The replay's outcome as typed values (``Replay.result``), and their JSON: ``xsp analyze
--json``'s ``reconstruction.replay`` (``ReplayResult.to_json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from xsp.analysis.replay.checks import AcrossProcessesCheck, InProcessCheck, ReplayChecks
from xsp.analysis.replay.host_timeline import Calibration

__all__ = ["Guarantees", "IterationResult", "RankWait", "ReplayResult", "median_steady_ms"]


@dataclass(frozen=True)
class IterationResult:
    """One step replayed: against M's median (``error_pct``) and its own measured step."""

    iteration: int
    replayed_ms: float
    measured_ms: float | None  # M's step of the same iteration and rank, where M has it
    deep_ms: float  # the deep run's own (traced) step
    error_pct: float | None
    steady: bool


@dataclass(frozen=True)
class Guarantees:
    """What the replay guarantees by construction, counted (each 0 where it holds)."""

    activities_before_launch: int
    activities_overlapping_on_a_stream: int
    spans_outside_their_step: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class RankWait:
    """One rank's step of a job whose collectives span ranks: how long its collectives waited
    for the last rank to arrive."""

    iteration: int
    rank: int
    wait_ns: int


def median_steady_ms(iterations: tuple[IterationResult, ...]) -> float | None:
    """The median replayed step over the steady iterations (None: none was steady)."""
    kept = [i.replayed_ms for i in iterations if i.steady]
    return float(np.median(kept)) if kept else None


@dataclass(frozen=True)
class ReplayResult:
    """The replayed step against the measured one, its checks, and the ranks' waits."""

    step_ms: float | None  # the median of the steady iterations' replayed steps
    measured_step_ms: float | None  # M's median (over its processes, where several)
    measured_run: str | None  # the run whose step the replay is checked against
    error_pct: float | None
    iterations: tuple[IterationResult, ...]
    calibration: Calibration
    guarantees: Guarantees | None  # None: a what-if's replay, which does not count them
    verified: ReplayChecks
    collective_waits: tuple[RankWait, ...]
    median_collective_wait_ms: dict[int, float]  # rank -> its median wait a step

    @property
    def unsteady_iterations(self) -> list[int]:
        return [i.iteration for i in self.iterations if not i.steady]

    @property
    def in_process(self) -> InProcessCheck | None:
        return self.verified.in_process

    @property
    def m_interval(self) -> AcrossProcessesCheck | None:
        return self.verified.m_interval

    @property
    def checked(self) -> bool:
        return self.verified.checked

    @property
    def unchecked(self) -> tuple[str, ...]:
        return self.verified.unchecked

    def to_json(self) -> dict[str, Any]:
        """``xsp analyze --json``'s ``reconstruction.replay``."""
        return {
            "step_ms": self.step_ms,
            "measured_step_ms": self.measured_step_ms,
            "measured_run": self.measured_run,
            "error_pct": self.error_pct,
            "iterations": [asdict(i) for i in self.iterations],
            "unsteady_iterations": self.unsteady_iterations,
            "calibration": self.calibration.as_dict(),
            "checks": {} if self.guarantees is None else self.guarantees.as_dict(),
            **self.verified.as_dict(),
            "collective_waits": [asdict(w) for w in self.collective_waits],
            "median_collective_wait_ms": dict(self.median_collective_wait_ms),
        }
