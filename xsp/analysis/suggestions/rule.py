"""What a suggestion rule is: its name, how it reads a measurement, the fix that answers it and
why that fix's measured gain can differ from the rule's estimate. ``xsp verify`` reads the fix
and the note from here, so a rule is declared in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xsp.analysis.measurement.store import MeasurementStore

__all__ = ["Rule", "Suggestion"]


@dataclass(frozen=True)
class Suggestion:
    """What a rule found: its advice, the evidence, and the expected gain with its model."""

    rule: str
    advice: str
    evidence: str
    gain_ms_per_iteration: float | None
    share_pct: float | None
    estimate: str = "the time its evidence covers on the replayed step"


@dataclass(frozen=True)
class Rule:
    """A suggestion rule.

    ``evaluate`` reads a store into zero or one suggestion named ``name``; ``fix`` names the fix
    of ``xsp.tracer.workloads.fixes`` that answers it (None: it needs a change to the program's
    code); ``estimate_note`` says why the estimate and the fix's measurement can differ, the
    closing note of a verified row whose estimate lies outside the measured interval."""

    name: str
    evaluate: Callable[[MeasurementStore], Suggestion | None]
    fix: str | None = None
    estimate_note: str | None = None
