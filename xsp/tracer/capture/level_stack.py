"""A session's levels in stack order through their life: on, off, drained, handed over, sampled.

Every step goes level by level: one level that fails is reported (``RunErrors``, and the run's
``Losses`` where it costs records) and the others carry on. Which optional parts of the
interface a level has (``xsp.tracer.capture.levels.protocols``) is decided once per change of
the stack, not on a service's per-request path.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xsp.core.run_sections import RunCounts
from xsp.tracer.capture.levels import Level, LevelContext, build_levels, level_environment
from xsp.tracer.capture.levels.protocols import (
    CountsLosses,
    HandsOver,
    Priced,
    Sampled,
    StepTimer,
    SwitchedPerIteration,
)
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.export.batches import BatchDrain
from xsp.tracer.export.finish import LevelDrain, Losses, drain_levels
from xsp.tracer.spec import RunSpec

__all__ = ["LevelStack", "build_stack"]

log = logging.getLogger(__name__)


class LevelStack:
    """The levels that record, M first; a level that fails to start leaves the stack."""

    def __init__(self, levels: list[Level], errors: RunErrors) -> None:
        self._errors = errors
        self.levels = levels

    @property
    def levels(self) -> list[Level]:
        return self._levels

    @levels.setter
    def levels(self, levels: list[Level]) -> None:
        self._levels = levels
        self._unsampled = [level for level in levels if not isinstance(level, Sampled)]
        self.has_sampled = len(self._unsampled) < len(levels)

    def marker_levels(self, sampled_on: bool | None) -> list[Level]:
        """The levels that get the iteration markers: all of them while the levels below M
        record (or may: undecided); else those without a sampling switch (level M): a level
        sampled off records nothing at its markers."""
        return list(self._levels) if sampled_on is not False else list(self._unsampled)

    def step_timer(self, marker_levels: Sequence[Level]) -> StepTimer | None:
        """Level M, when it is the only level at the markers: what a lease times with."""
        if len(marker_levels) != 1 or not isinstance(marker_levels[0], StepTimer):
            return None
        return marker_levels[0]

    def priced(self) -> Priced | None:
        """The level whose cost the calibration prices (F), if it records."""
        return next((level for level in self._levels if isinstance(level, Priced)), None)

    def switched_per_iteration(self) -> None:
        """Tell the levels, before they come on, that they will be switched per iteration."""
        for level in self._levels:
            if isinstance(level, SwitchedPerIteration):
                level.switched_per_iteration()

    def enable(self, took: Callable[[str], None]) -> str | None:
        """Switch each level on, in stack order (``took`` timing each); those that fail leave
        the stack. Returns the first failure, if any."""
        enabled, failure = [], None
        for level in self._levels:
            try:
                level.enable()
                took(f"level {level.letter}")
                enabled.append(level)
            except Exception as exc:  # reported; the other levels still record
                message = f"level {level.letter} could not start: {exc}"
                log.error("xsp: %s", message)
                self._errors.add(message)
                failure = failure or message
        self.levels = enabled
        return failure

    def restart(self, stopped: list[Level]) -> list[str]:
        """Switch the levels a batch's end stopped on again, in stack order; those that fail
        leave the stack. Returns what failed, one line each."""
        enabled, failed = [], []
        for level in reversed(stopped):  # stack order again
            try:
                level.enable()
                enabled.append(level)
            except Exception as exc:
                message = f"level {level.letter} could not start again: {exc}"
                log.error("xsp: %s", message)
                self._errors.add(message)
                failed.append(message)
        self.levels = enabled
        return failed

    def sample(self, on: bool) -> None:
        """Switch the sampled levels (those below M) on or off for the next iterations."""
        for level in self._levels:
            if isinstance(level, Sampled):
                try:
                    level.sample(on)
                except Exception as exc:
                    self._errors.misuse(
                        f"level {level.letter} could not switch its sampling: {exc}"
                    )

    def stop(self, losses: Losses, levels: Sequence[Level] | None = None) -> list[Level]:
        """Switch the levels (``levels``, else all) off, deepest first; returns those that
        stopped."""
        stopped = []
        for level in reversed(self._levels if levels is None else levels):
            try:
                level.disable()
                stopped.append(level)
            except Exception as exc:
                self._failed_to_stop(level, exc, losses)
        return stopped

    def stop_handed_over(self, losses: Losses, handed_over: Sequence[Level]) -> None:
        """The levels a continuous session's last batch handed over are still installed: now
        they go."""
        self.stop(
            losses,
            [lv for lv in self._levels if lv in handed_over and isinstance(lv, HandsOver)],
        )

    def drain(self, stopped: list[Level], counts: RunCounts, losses: Losses) -> dict[str, Any]:
        """Each stopped level's records, by letter (open: the letters that drained), and its loss counts into ``counts``. Drains
        run once every level has stopped (see ``xsp.tracer.capture.levels``)."""

        def failed(message: str) -> None:
            self._errors.add(message)
            losses.missing.append(message)

        drains = [
            LevelDrain(level.letter, level.drain, functools.partial(self._loss_counts, level))
            for level in stopped
        ]
        return drain_levels(drains, counts, failed)

    def hand_over(self, losses: Losses) -> tuple[list[Level], dict[str, BatchDrain]]:
        """A batch's end, between iterations: each level stops writing it, deepest first, and
        hands over the drain of its records, which the exporter runs on its own thread
        (``HandsOver``); returns the levels that stopped and their drains. A level that cannot
        hand over (its records are not in the arena: level L on CPU) is disabled and drained
        here."""
        stopped: list[Level] = []
        drains: dict[str, BatchDrain] = {}
        for level in reversed(self._levels):
            if not isinstance(level, HandsOver):
                if self.stop(losses, [level]):
                    stopped.append(level)
                    counts: RunCounts = {}
                    raw = self.drain([level], counts, losses)
                    if level.letter in raw:
                        drains[level.letter] = _drained(raw[level.letter], counts)
                continue
            try:
                drains[level.letter] = level.handover()
                stopped.append(level)
            except Exception as exc:
                self._failed_to_stop(level, exc, losses)
        return stopped, drains

    def _failed_to_stop(self, level: Level, exc: Exception, losses: Losses) -> None:
        message = f"level {level.letter} failed to stop: {exc}"
        self._errors.add(message)
        losses.missing.append(message)
        log.exception("xsp: level %s failed to stop", level.letter)

    def _loss_counts(self, level: Level) -> RunCounts:
        """A level's own loss counts (CUPTI's dropped and undecodable records), if it has any."""
        if not isinstance(level, CountsLosses):
            return {}
        try:
            return level.counts().copy()
        except Exception as exc:
            self._errors.add(f"level {level.letter} could not count its losses: {exc}")
            return {}


def _drained(records: Any, counts: RunCounts) -> BatchDrain:
    """The drain of a level drained already."""
    return lambda contents: (records, counts)


def build_stack(
    spec: RunSpec, device: str, run_dir: Path | None, errors: RunErrors
) -> tuple[LevelContext, LevelStack]:
    """The levels ``spec`` asks for on ``device``, built with the context they share."""
    context = LevelContext(
        device,
        spec.levels,
        op_shapes=spec.profile.op_shapes,
        run_dir=run_dir,
        multi_rank=(spec.world_size or _distributed_world_size()) > 1,
        sample_run=spec.profile.sample_run,
    )
    for key, value in level_environment(context).items():  # xsp run sets them earlier
        os.environ.setdefault(key, value)
    levels = build_levels(spec.levels, context)
    # whatever the levels: every level set compiles the same code, and the first one's
    # compile, saved with its provenance in inductor's caches, serves the others
    context.provenance.install()
    return context, LevelStack(levels, errors)


def _distributed_world_size() -> int:
    """The size of an initialized torch.distributed job this process belongs to, else 1: a DDP
    script traced without ``rank``/``world_size`` still gets every iteration's collective sizes."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1
