"""The F process's own untraced steps: what the replay's cost is fitted to and checked against.

The process that prices F's cost (the shallowest level set with F) runs an untraced iteration
before each traced one (``xsp.tracer.capture.interleave``; ``run.json``'s ``interleaved``), at
the same host speed as its traced ones. The replay's cost per F record is fitted to all of them
(``xsp.analysis.replay.fit``); its check (``xsp.analysis.replay.checks``) replays each pair's
traced iteration with the cost fitted to the pairs of the other fold (even and odd positions),
so that the check is never the fit read back.

Stores recorded before interleaving, and level sets that cannot interleave (F with CUPTI's
levels), have only their warm-up's last steps (levels off, before the traced ones): the fit uses
those, and nothing is held out to check it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.matching import level_sources
from xsp.analysis.measurement.store import MeasurementStore
from xsp.core import schema
from xsp.core.store import RunMeta

__all__ = [
    "INTERLEAVED",
    "RUN_KEY",
    "UNTRACED",
    "WARMUP",
    "WARMUP_TAIL",
    "Untraced",
    "untraced_steps",
    "warmup_tail_ms",
]

INTERLEAVED = "interleaved"
WARMUP = "warm-up"
#: How many of the F run's last warm-up steps stand for its untraced step where it kept no
#: pairs; the first warm-up step is left out as cold.
WARMUP_TAIL = 4
#: run.json's record of the pairs (``xsp.tracer.capture.interleave.RUN_KEY``).
RUN_KEY = "interleaved"


def warmup_tail_ms(meta: RunMeta) -> list[float]:
    """The last of a level-set process's warm-up steps (levels off). The first is left out as
    cold: the program's first step, or, where the boundary changed (a training loop's forward
    passes, then its optimizer steps: ``WarmupClock.restart``), the first optimizer step, which
    allocates the optimizer's state."""
    return list(meta.warmup_steps_ms or ())[1:][-WARMUP_TAIL:]


@dataclass(frozen=True)
class Untraced:
    """The F run's untraced steps. ``before[i]``: the untraced step run just before traced
    iteration ``i`` (interleaved); ``traced[i]``: that traced step, timed alike."""

    run: str
    source: str
    before: dict[int, float]
    traced: dict[int, float]
    warmup_ms: tuple[float, ...]
    #: why the F run kept no pairs (its level set could not interleave), if it said
    skipped: str | None = None

    @property
    def pairs(self) -> int:
        return len(self.before)

    def folds(self) -> tuple[frozenset[int], frozenset[int]] | None:
        """The paired iterations at even and at odd positions: each fold's replay is checked
        with the cost fitted to the other. None with fewer than two pairs."""
        if self.source != INTERLEAVED or self.pairs < 2:
            return None
        paired = sorted(self.before)
        return frozenset(paired[0::2]), frozenset(paired[1::2])

    def ms(self, iterations: frozenset[int] | None = None) -> float | None:
        """The median untraced step before ``iterations`` (None: all), or of the warm-up."""
        if self.source == INTERLEAVED:
            values = [v for i, v in self.before.items() if iterations is None or i in iterations]
        else:
            values = list(self.warmup_ms)
        return float(np.median(values)) if values else None

    def added_ms(self) -> float | None:
        """The median of each pair's traced less untraced step: F's cost where the host bounds
        the step, less where the GPU hides part of it."""
        added = [self.traced[i] - v for i, v in self.before.items() if i in self.traced]
        return float(np.median(added)) if added else None


def untraced_steps(store: MeasurementStore) -> Untraced | None:
    """The F run's untraced steps (None without an F run, or without any untraced step)."""
    return UNTRACED.of(store)


def _read(store: MeasurementStore) -> Untraced | None:
    _, source_of = level_sources(store)
    source = source_of.get(schema.LEVEL_FRAMEWORK)
    if source is None:
        return None
    run = store.runs[source]
    record = run.document.interleaved or {}
    untraced, traced = record.get("untraced_ms") or [], record.get("traced_ms") or []
    before = {
        i: float(u)
        for i, (u, t) in enumerate(zip(untraced, traced, strict=False))
        if isinstance(u, int | float) and isinstance(t, int | float)
    }
    warmup = tuple(float(v) for v in warmup_tail_ms(run.document))
    skipped = record.get("skipped") if isinstance(record.get("skipped"), str) else None
    if before:
        after = {i: float(traced[i]) for i in before}
        return Untraced(run.levels, INTERLEAVED, before, after, warmup)
    if not warmup:
        return None
    return Untraced(run.levels, WARMUP, {}, {}, warmup, skipped)


#: The F process's untraced steps (``untraced_steps``).
UNTRACED = Derived("untraced", _read)
