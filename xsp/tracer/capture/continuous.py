"""A continuous session's work between iterations (a service, docs/serving.md): its sampling
policy, the short way through the markers once it is steady, the iterations it lends the root
call, and its batches (``BatchRotation``) until its duration is over.

The session's per-request path reads this object's public fields itself (``steady``,
``policy``, ``sampled_on``, ``marker_levels``, ``due``, ``lessee``): a request pays for every
Python call, so nothing here sits between the markers and the levels.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from xsp.core.run_sections import ContinuousMeta
from xsp.core.store import Status
from xsp.tracer.capture.batch_rotation import BatchRotation, signals_held
from xsp.tracer.capture.hooks.context import OTEL_TRACE
from xsp.tracer.capture.level_stack import LevelStack
from xsp.tracer.capture.levels import Level, LevelContext
from xsp.tracer.capture.levels.protocols import StepTimer
from xsp.tracer.capture.progress import Progress
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_json import RunJson
from xsp.tracer.capture.run_output import RunOutput
from xsp.tracer.capture.run_record import RunRecord
from xsp.tracer.capture.sampling import SamplingPolicy
from xsp.tracer.capture.schedule import Schedule
from xsp.tracer.export.batches import Totals
from xsp.tracer.spec import ProfileSpec

__all__ = ["LEASE_WITHOUT_SAMPLING", "Continuous", "Lessee"]

#: A lease of a session with no sampled level: its deadline ends it first.
LEASE_WITHOUT_SAMPLING = 1 << 40

#: The root call's ``lease``: (next measured index, how many, monotonic deadline in ns, the
#: device sync); it records those iterations itself.
Lessee = Callable[[int, int, int, Any], None]


class Continuous:
    """One continuous session's sampling, lease and batches (module docs)."""

    def __init__(
        self,
        profile: ProfileSpec,
        schedule: Schedule,
        stack: LevelStack,
        context: LevelContext,
        output: RunOutput,
        errors: RunErrors,
        record: RunRecord,
        progress: Progress,
        run_json: RunJson,
    ) -> None:
        self._profile = profile
        self._schedule = schedule
        self._stack = stack
        self._output = output
        self._errors = errors
        self._record = record
        self._progress = progress
        self._run_json = run_json
        self.policy = SamplingPolicy(
            profile.sample_every, profile.sample_rate, run=profile.sample_run
        )
        #: the levels below M record the open (or next) iteration; None: not decided yet (after
        #: a batch's hand-over), so the next iteration's policy switches every level
        self.sampled_on: bool | None = True
        # the short way through the markers (check_steady): the levels they go to, and when
        # the next progress report, batch or the duration's end is due (monotonic)
        self.steady = False
        self.closed = False  # the session closed: never steady again
        self.marker_levels: list[Level] = []
        self.marker_levels_reversed: list[Level] = []
        self._lease_timer: StepTimer | None = None  # level M, alone at the markers
        self.due = 0.0
        #: the root call's ``lease`` (``Session.lease_to``): iterations it records without the
        #: markers
        self.lessee: Lessee | None = None
        self.batches = BatchRotation(output, stack, context, errors, self._stored_so_far)
        self._measure_end: float | None = None  # monotonic: the duration's end

    def check_steady(self) -> None:
        """Whether the next iterations may take the short way through the markers: a continuous
        session measuring without an end in sight, past its first measured iteration, with its
        levels on (``Schedule.unbounded``). Then the session has only three things to do
        between iterations, each decided by one comparison: its sampling policy's
        (``marker_levels``: the levels that get this iteration's markers), and, once ``due``
        (monotonic) has passed, a progress report and a batch or the duration's end."""
        self.steady = not self.closed and self._schedule.unbounded
        if not self.steady:
            return
        due = self.batches.started + self._profile.export_every_s
        if self._measure_end is not None:
            due = min(due, self._measure_end)
        progress_due = self._progress.next_due
        if progress_due is not None:
            due = min(due, progress_due)
        self.due = due
        self._mark_levels()

    def lease(self) -> None:
        """Lend the root call the next iterations that would record level M's step and nothing
        else: its sampled levels off (or none), no application span to join (the program has
        not imported OpenTelemetry), M's markers the only ones. Up to the next sampled one, and
        until the next thing due (a progress line, a batch, the duration's end): the root call
        comes back through the markers then, which first count what it recorded
        (``Session.settle_leased``)."""
        timer = self._lease_timer
        if timer is None or OTEL_TRACE in sys.modules or self.lessee is None:
            return
        measured = self._schedule.measured  # the next iteration's
        if self._stack.has_sampled:
            count = self.policy.unsampled_from(measured)
        else:
            count = LEASE_WITHOUT_SAMPLING
        if count:
            self.lessee(measured, count, int(self.due * 1e9), timer.sync)

    def _mark_levels(self) -> None:
        """The levels that get the iteration markers (``LevelStack.marker_levels``), and level
        M when it is the only one (a lease's)."""
        self.marker_levels = self._stack.marker_levels(self.sampled_on)
        self.marker_levels_reversed = self.marker_levels[::-1]
        self._lease_timer = self._stack.step_timer(self.marker_levels)

    def sample(self, measured: int) -> None:
        """Switch the levels below M on or off for the iteration beginning (its policy)."""
        on = self.policy.sample(measured)
        if measured == 0:
            self._measure_end = (
                time.monotonic() + self._profile.duration_s
                if self._profile.duration_s is not None
                else None
            )
            self.batches.started = time.monotonic()
        if on != self.sampled_on:
            self.switch_sampling(on)

    def switch_sampling(self, on: bool) -> None:
        """The levels below M record from the next iteration on, or not."""
        self.sampled_on = on
        if self.steady:
            self._mark_levels()
        self._stack.sample(on)

    def after_iteration(self) -> None:
        """After a measured iteration: stop once the duration is over, else store a batch when
        one is due (``export_every_s``)."""
        now = time.monotonic()
        if self._measure_end is not None and now >= self._measure_end:
            self._schedule.stop_measuring()
        elif now - self.batches.started >= self._profile.export_every_s:
            try:
                self._rotate()
            except Exception:
                self._errors.misuse("storing a batch of iterations failed")

    def _rotate(self) -> None:
        """Hand the iterations finished since the last batch to the exporter and start the next
        batch: levels off, drained, the arena recycled, levels on again (between iterations)."""
        with signals_held():  # a Ctrl-C now would cut a batch in two
            self._rotate_held()

    def _rotate_held(self) -> None:
        stopped = self.batches.hand_over(self._record.failures)
        self.batches.restart(stopped)
        # F's enable() records, L and G's waits for a sampled iteration (CUPTI starts then,
        # before the iteration's markers): the next iteration's policy switches them all
        self.sampled_on = None
        self.check_steady()

    def _stored_so_far(self, totals: Totals) -> None:
        """run.json while a continuous session runs: what its batches stored so far."""
        counts = totals.counts()
        counts.update(self.meta())
        counts.update(self._output.otlp_sent())
        self._run_json.write(Status.RUNNING, measured=totals.iterations, counts=counts)

    def meta(self) -> ContinuousMeta:
        """run.json's description of a continuous session (none for a fixed one)."""
        if not self._schedule.continuous:
            return {}
        profile = self._profile
        return {
            "continuous": True,
            "duration_s": profile.duration_s,
            "export_every_s": profile.export_every_s,
            "sampling": self.policy.describe(),
        }
