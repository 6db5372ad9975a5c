"""A tracing session: the level set, the iterations, the warm-up, and where spans go.

Iterations are marked in one of three ways, all ending in ``begin_iteration``/``end_iteration``:

1. ``session.step()`` (``xsp.step()``): ends the open iteration, if any, and begins the next;
2. ``with session.iteration():`` (``xsp.iteration()``) around one iteration;
3. automatically, for unmodified scripts (``xsp.tracer.capture.iterations``): each call of a
   named function (``iteration_fn``), else optimizer steps (training) or, without any during the
   warm-up, calls of the root module (inference). An explicit marker switches this off.

Levels are switched on between iterations, before the first measured one, and switched off,
drained, converted and exported once the last measured iteration is over (at the next marker or
at ``close()``, so that no profiler range is cut in the middle). The session never raises into
the traced program: failures are logged, counted and written into the run's ``run.json``.

A continuous session (``iterations`` 0 or a duration: a service, docs/serving.md) runs that
cycle once per batch instead: every ``export_every_s`` seconds, at the end of an iteration, the
levels are switched off, drained and switched on again into a recycled arena, and the batch goes
to a background exporter (``xsp.tracer.export.batches``). Its sampling policy
(``xsp.tracer.capture.sampling``) switches the levels below M on or off as each iteration begins.
"""

from __future__ import annotations

import atexit
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from xsp.core.devices import resolve_device
from xsp.core.errors import ConfigError, XspError
from xsp.core.levelset import LevelSet, continuous_counters
from xsp.core.store import ProgramEnd, Status
from xsp.tracer.capture import graphs, interleave
from xsp.tracer.capture.continuous import Continuous, Lessee
from xsp.tracer.capture.level_stack import build_stack
from xsp.tracer.capture.levels import (
    check_levels,
)
from xsp.tracer.capture.markers import IterationMarkers
from xsp.tracer.capture.progress import Progress, ProgressCallback
from xsp.tracer.capture.recorders import Recorders
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_identity import identify
from xsp.tracer.capture.run_json import RunJson
from xsp.tracer.capture.run_output import RunOutput
from xsp.tracer.capture.run_record import RunRecord
from xsp.tracer.capture.schedule import Boundary, Phase, Schedule
from xsp.tracer.capture.warmup import WarmupClock
from xsp.tracer.export.batches import Totals
from xsp.tracer.export.finish import Losses
from xsp.tracer.export.sinks import Sink
from xsp.tracer.spec import (
    DEFAULT_EXPORT_EVERY_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    ProfileSpec,
    RunSpec,
)

__all__ = ["ProgressCallback", "Session", "current", "fail_message"]

_current: Session | None = None


def current() -> Session | None:
    """The session that ``xsp.step()`` and ``xsp.iteration()`` talk to, if any."""
    return _current


class Session:
    """Records ``iterations`` measured iterations after ``warmup`` untraced ones.

    Args:
        levels: a level set such as "M" or "MF".
        iterations: measured iterations to record; 0: until the session is closed (a service,
            docs/serving.md).
        warmup: iterations to run untraced first.
        out: a run directory (``RUN_DIR/<levels>``) to write, or None.
        sinks: further sinks (OTLP, in-memory).
        workload: a name for what runs, stored as ``xsp.workload``.
        device: "cpu", "cuda", "cuda:N" or None for the best available.
        auto_iterations: find an unmodified script's iterations (optimizer steps or root-module
            calls, ``xsp.tracer.capture.iterations``).
        iteration_fn: ``MODULE.QUALNAME`` of a function each call of which is one iteration
            (ConfigError when it cannot be found).
        resource: extra resource attributes.
        progress: called with (phase, done, total) after each iteration.
        op_shapes: record aten ops' input shapes and dtypes (level F).
        monitor: on CUDA, sample NVML (and GPM) during the measured iterations and summarize
            the samples onto each model span.
        before_levels: called just before the levels come on, after the untraced warm-up
            (the leveled runner waits there for the level set before to exit).
        rank, world_size: this process's rank in a multi-rank job and the job's size; its
            spans then join the other ranks' in one trace per iteration (same ``run_id``).
        settle: warm up past ``warmup`` until the step time is steady (``xsp.tracer.capture.
            warmup``): for loops the session drives (``while not session.done``), never for a
            script with a fixed number of steps, nor across ranks (they must measure the same
            iterations). Warm-up steps are timed either way and ``run.json`` says whether they
            settled.
        duration_s: stop measuring after this many seconds of it (the program runs on).
        sample_every, sample_rate, sample_run: the continuous session's sampling policy: 1
            iteration in N, at most R a second, in runs of K consecutive ones, recorded by the
            levels below M (``xsp.tracer.capture.sampling``).
        export_every_s: how often a continuous session stores the iterations finished since
            its last batch (``xsp.tracer.export.batches``).

    With ``iterations`` 0 or a ``duration_s`` the session is continuous: it stores batches of
    finished iterations in the background while the program runs, each a Parquet part of the
    run directory, and rewrites ``run.json`` as they land.
    """

    def __init__(
        self,
        levels: str = "M",
        iterations: int = DEFAULT_ITERATIONS,
        warmup: int = DEFAULT_WARMUP,
        out: str | Path | None = None,
        sinks: Sequence[Sink] = (),
        workload: str = "script",
        device: str | None = None,
        auto_iterations: bool = False,
        resource: Mapping[str, Any] | None = None,
        progress: ProgressCallback | None = None,
        run_id: str | None = None,
        measurement_id: str | None = None,
        op_shapes: bool = True,
        monitor: bool = True,
        before_levels: Callable[[], None] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        settle: bool = False,
        iteration_fn: str | None = None,
        duration_s: float | None = None,
        sample_every: int = 1,
        sample_rate: float | None = None,
        sample_run: int = 1,
        export_every_s: float = DEFAULT_EXPORT_EVERY_S,
    ) -> None:
        try:
            level_set = LevelSet(levels)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        spec = RunSpec(
            level_set,
            ProfileSpec(
                iterations=iterations,
                warmup=warmup,
                device=device,
                op_shapes=op_shapes,
                iteration_fn=iteration_fn,
                duration_s=duration_s,
                sample_every=sample_every,
                sample_rate=sample_rate,
                sample_run=sample_run,
                export_every_s=export_every_s,
            ),
            out=str(out) if out is not None else None,
            measurement_id=measurement_id,
            run_id=run_id,
            rank=rank,
            world_size=world_size,
            workload=workload,
        )
        self._setup(
            spec, sinks, auto_iterations, resource, progress, monitor, before_levels, settle
        )

    @classmethod
    def from_spec(
        cls,
        spec: RunSpec,
        sinks: Sequence[Sink] = (),
        auto_iterations: bool = False,
        resource: Mapping[str, Any] | None = None,
        progress: ProgressCallback | None = None,
        monitor: bool = True,
        before_levels: Callable[[], None] | None = None,
        settle: bool = False,
    ) -> Session:
        """The session of one level-set run as xsp's own processes start it: ``spec`` says
        what to record (``xsp.tracer.spec``), the other arguments are as above."""
        session = cls.__new__(cls)
        session._setup(
            spec, sinks, auto_iterations, resource, progress, monitor, before_levels, settle
        )
        return session

    def _setup(
        self,
        spec: RunSpec,
        sinks: Sequence[Sink],
        auto_iterations: bool,
        resource: Mapping[str, Any] | None,
        progress: ProgressCallback | None,
        monitor: bool,
        before_levels: Callable[[], None] | None,
        settle: bool,
    ) -> None:
        profile = spec.profile
        if profile.warmup < 0:
            raise ConfigError(f"bad warmup {profile.warmup}: must be 0 or more")
        self.spec = spec
        self.levels = spec.levels
        self.device = resolve_device(profile.device)
        self._errors = RunErrors()
        self._record = RunRecord()
        run = identify(spec, self.device, resource or {})
        self.run_id, self.measurement_id, self.workload = (
            run.run_id,
            run.measurement_id,
            run.workload,
        )
        self.rank, self.world_size, self.run_dir = run.rank, run.world_size, run.run_dir
        self.resource = run.resource
        self._output = RunOutput(run, sinks, self._errors)
        check_levels(self.levels, self.device)
        self.continuous = profile.continuous
        if self.continuous and self.levels.counters:
            raise ConfigError(continuous_counters(self.levels))
        self._context, self._stack = build_stack(spec, self.device, self.run_dir, self._errors)
        self._set_up_interleave()
        self._schedule = Schedule(
            profile.warmup,
            profile.iterations,
            continuous=self.continuous,
            interleave=self._interleave is not None,
        )
        self._markers = IterationMarkers(auto_iterations)
        self._progress = Progress(progress, self.continuous, self._errors)
        self._before_levels = before_levels
        self._closed = False
        self._started = False
        self._recorders = Recorders(
            self.levels,
            self.device,
            self._stack,
            self._context,
            self._output,
            self._errors,
            self._record,
            monitor=monitor,
            calibrates=profile.calibrate,
        )
        alone = (self.world_size or 1) == 1  # ranks must measure the same iterations
        self._warmup = WarmupClock(self.device, profile.warmup, settle=settle and alone)
        self._run_json = RunJson(
            self._output,
            self._record,
            self._errors,
            self._schedule,
            self._warmup,
            self._markers,
            self._interleave,
            self._interleave_skipped,
        )
        self._continuous = Continuous(
            profile,
            self._schedule,
            self._stack,
            self._context,
            self._output,
            self._errors,
            self._record,
            self._progress,
            self._run_json,
        )
        self.result: dict[str, Any] | None = None

    @property
    def program(self) -> ProgramEnd | None:
        """How the traced program ended, written into run.json (``exit_code``, ``exception``,
        ``interrupted``; the leveled runner adds ``signal`` for a killed process)."""
        return self._record.program

    @program.setter
    def program(self, program: ProgramEnd | None) -> None:
        self._record.program = program

    def _set_up_interleave(self) -> None:
        """Untraced iterations between the traced ones (the process that prices F's cost)."""
        self._interleave: interleave.Interleave | None = None
        self._interleave_skipped: str | None = None
        if not self.spec.profile.interleave:
            return
        reason = interleave.unavailable(self.levels, self.device, self.continuous)
        if reason is None:
            self._interleave = interleave.Interleave(self.device)
            self._stack.switched_per_iteration()  # before they come on: their wrappers know it
        else:
            self._interleave_skipped = reason

    @property
    def warmup(self) -> int:
        """Warm-up iterations: the minimum asked for, plus those settling took."""
        return self._schedule.warmup

    @property
    def iterations(self) -> int:
        return self._schedule.iterations

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Session:
        """Install the iteration hooks, become the current session, and register exit cleanup."""
        global _current
        if self._started:
            return self
        self._started = True
        if self.spec.profile.iteration_fn:  # ConfigError when it cannot be found
            self._markers.watch_function(self.spec.profile.iteration_fn, self)
        _current = self
        self._run_json.write(Status.RUNNING)
        atexit.register(self.close)
        if self.levels.gpu and self.device.startswith("cuda"):
            graphs.turn_levels_on_at_capture(_levels_on_at_capture)
        if self._schedule.levels_on_at_start:
            self._enable_levels()
        # after level F wraps module calls: the root module's iterations must begin outside F's
        # wrapper, so that the root's own span falls inside them
        self._markers.watch_model(self)
        return self

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(error=f"{exc_type.__name__}: {exc}" if exc_type is not None else None)

    def close(self, error: str | None = None, interrupted: bool = False) -> dict[str, Any] | None:
        """End the open iteration (marking it failed when ``error`` is given), export what was
        recorded and write ``run.json`` (status ``interrupted`` when ``interrupted``: Ctrl-C).
        Safe to call twice; returns the run's metadata."""
        global _current
        if self._closed:
            return self.result
        self._closed = True
        self._continuous.closed = True
        self._continuous.steady = False
        try:
            self._markers.settle()
            if self._schedule.open is not None:
                # a tail after the last step (a script that stepped fewer times than asked) is
                # kept, marked failed, so not counted as measured
                self.end_iteration(error=error or "the session closed inside this iteration")
            self._finish(error, interrupted)
        finally:
            self._markers.remove()
            if _current is self:
                _current = None
            atexit.unregister(self.close)
        return self.result

    # -- iteration markers ------------------------------------------------------------------------
    @property
    def measuring(self) -> bool:
        """The open iteration, or the next one to begin, is a measured one."""
        return self._schedule.measuring

    @property
    def is_open(self) -> bool:
        return self._schedule.open is not None

    @property
    def done(self) -> bool:
        """True once every measured iteration has been recorded."""
        return self._schedule.done

    @property
    def iteration_boundary(self) -> str | None:
        """What ended this run's iterations (``xsp.tracer.capture.iterations``), None while
        nothing has."""
        return self._markers.boundary(self._schedule.index)

    def begin_iteration(self) -> None:
        schedule, service = self._schedule, self._continuous
        if service.steady and schedule.open is None:  # a service's request: the short way
            # no schedule method on this path: a request pays for each Python call
            schedule.open = Phase.MEASURE
            measured = schedule.index - schedule.warmup
            on = service.policy.sample(measured)
            if on is not service.sampled_on:
                service.switch_sampling(on)
            for level in service.marker_levels:
                level.begin_iteration(measured)
            return
        if schedule.finish_due:
            self._finish(None)
        if schedule.open is not None or self._closed or schedule.done:
            if schedule.open is not None:
                self._misuse("begin_iteration while an iteration is open")
            return
        phase = schedule.begin()
        if phase is Phase.WARMUP and not schedule.levels_on:
            self._warmup.begin()
        elif phase is Phase.UNTRACED:
            self._begin_untraced()
        elif phase is Phase.MEASURE:
            if self._interleave is not None:
                self._interleave.begin()
            measured = schedule.measured
            if self.continuous:
                service.sample(measured)
            for level in self._stack.levels:
                level.begin_iteration(measured)

    def end_iteration(self, error: str | None = None, finish: bool = False) -> None:
        """End the open iteration (failed, when ``error`` says why). ``finish``: store the run
        now if that was its last measured iteration (``finish_if_done``)."""
        schedule, service = self._schedule, self._continuous
        if schedule.open is None:
            if finish:
                self.finish_if_done()
            return
        if schedule.open is Phase.UNTRACED:
            self._end_untraced(error)
            return
        if service.steady:  # as below, with what a steady state rules out left out
            measured = schedule.index - schedule.warmup
            for level in service.marker_levels_reversed:
                level.end_iteration(measured)
            if error is not None:
                self._record.failures[measured] = error
            schedule.open = None
            schedule.index += 1
            if time.monotonic() >= service.due:
                self._report_progress()
                service.after_iteration()
                service.check_steady()
                if finish:
                    self.finish_if_done()
            if service.lessee is not None and service.steady:
                service.lease()
            return
        measured = schedule.measured
        if schedule.open is Phase.MEASURE:
            for level in reversed(self._stack.levels):
                level.end_iteration(measured)
            if error is not None:
                self._record.failures[measured] = error
            if self._interleave is not None:
                self._interleave.end_traced(measured, error is not None)
        elif not schedule.levels_on:
            self._warmup.end()
        boundary = schedule.end()
        self._report_progress()
        if boundary is Boundary.LEVELS_ON:
            # Levels start one warm-up iteration early: their own start-up cost (CUPTI
            # instrumenting kernels, NVTX registering names; 180 ms on the first ResNet-50 MFLG
            # step on the H200) lands outside the measured window. What they record then falls
            # outside every iteration.
            if self._warmup.longer():
                schedule.extend_warmup()
            else:
                self._enable_levels()
        elif boundary is Boundary.CONTINUE:
            service.after_iteration()
        service.check_steady()
        if finish:
            self.finish_if_done()

    def step(self) -> None:
        """End the open iteration (if any) and begin the next one."""
        self._auto_off()
        self.end_iteration()
        self.begin_iteration()

    @contextlib.contextmanager
    def iteration(self) -> Iterator[None]:
        """Mark the body as one iteration; an exception marks it failed and propagates."""
        self._auto_off()
        self.begin_iteration()
        try:
            yield
        except BaseException as exc:
            self.end_iteration(error=f"{type(exc).__name__}: {exc}")
            raise
        self.end_iteration()

    # -- untraced iterations between the traced ones (``xsp.tracer.capture.interleave``) ------
    def _begin_untraced(self) -> None:
        """An untraced iteration before the next traced one: the levels below M off, timed."""
        if self._interleave is None:
            return
        began = time.perf_counter_ns()
        self._continuous.switch_sampling(False)
        self._interleave.switched(began)
        self._interleave.begin()

    def _end_untraced(self, error: str | None) -> None:
        """The untraced iteration is over: its time kept, the levels on again for the traced
        one. It is not a measured iteration: the levels never see it."""
        if self._interleave is None:
            return
        self._interleave.end_untraced(failed=error is not None)
        self._schedule.end()
        began = time.perf_counter_ns()
        self._continuous.switch_sampling(True)
        self._interleave.switched(began)

    # -- a continuous session (``xsp.tracer.capture.continuous``) --------------------------------
    def lease_to(self, lessee: Lessee) -> None:
        """Where the next iterations may be lent: ``lessee(next measured index, how many,
        monotonic deadline in ns, the device sync)`` records them itself
        (``Continuous.lease``)."""
        self._continuous.lessee = lessee

    def settle_leased(self, done: int, errors: list[tuple[int, str]]) -> None:
        """The iterations the root call recorded on its lease since the last marker: ``done``
        of them; ``errors`` for those that raised (measured index, "Type: message")."""
        self._schedule.skip(done)
        for index, error in errors:
            self._record.failures[index] = error

    # -- internals ----------------------------------------------------------------------------------
    def finish_if_done(self) -> None:
        """Store the run now if its last measured iteration is over (an automatic boundary
        calls this where no profiler range is open)."""
        if self._schedule.finish_due:
            try:
                self._finish(None)
            except Exception:
                self._misuse("finishing the run failed")

    def levels_on_for_capture(self) -> None:
        """A CUDA graph capture begins: its nodes must be recorded (``xsp.tracer.capture.
        graphs``), so levels that are still off come on now, in the warm-up."""
        if self._schedule.levels_on or self._closed or not self._started:
            return
        index = self._schedule.index
        self._record.levels_on_early = f"a CUDA graph capture in warm-up iteration {index}"
        self._enable_levels()

    def note(self, what: str) -> None:
        """Something an automatic boundary wants in ``run.json`` (logged once)."""
        self._misuse(what)

    def boundary_changed(self) -> None:
        """The warm-up's iterations so far ended at another boundary (a training loop's
        forward passes, before its first optimizer step): their times are not its step's."""
        if not self.measuring:
            self._warmup.restart()

    def _auto_off(self) -> None:
        self._markers.explicit()

    def add_error(self, message: str) -> None:
        """Record a failure outside the session's own work (a fix that could not apply) in
        run.json's ``errors``; tracing carries on."""
        self._errors.add(message)

    def _misuse(self, what: str) -> None:
        self._errors.misuse(what)

    def _report_progress(self) -> None:
        self._progress.report(self._schedule.index, self.warmup, self.iterations)

    def _enable_levels(self) -> None:
        if self._before_levels is not None:
            self._record.mark("ready")
            self._before_levels()
        self._schedule.levels_on = True
        self._recorders.switch_on()

    # -- the finish ----------------------------------------------------------------------------
    def _finish(self, error: str | None, interrupted: bool = False) -> None:
        """Switch levels off, convert what they recorded, export it, write run.json.

        The status is honest about what got lost: ``error`` when the workload failed or nothing
        usable was stored (no model level, conversion or the store failed), ``partial`` when
        something is missing (fewer iterations, a level that failed to stop or drain, a sink
        that failed, records CUPTI dropped or xsp could not decode), ``interrupted`` after a
        Ctrl-C; ``status_reasons`` says why, one line each (``RunJson.finished``)."""
        self._schedule.finish_due = False
        self._continuous.steady = False
        if self.result is not None:
            return
        self._record.mark("measured")
        self._record.note_host("measured")
        losses = Losses()
        if self.continuous:
            self._finish_continuous(error, interrupted, losses)
            return
        recorders = self._recorders
        stopped = self._stack.stop(losses)
        self._record.mark("stopped")
        counts = recorders.calibration_counts()
        raw = self._stack.drain(stopped, counts, losses)
        self._markers.remove()  # the run is over: no more iterations to find
        recorders.end_provenance(counts)
        samples = recorders.stop_monitor(counts)
        self._record.mark("drained")
        counts["spans"] = 0
        converted_ns, kept = self._output.store(
            raw, samples, self._record.failures, self._context, counts, losses
        )
        if converted_ns is not None:
            self._record.phases_ns["converted"] = converted_ns
        self._output.shut_down(counts, losses)
        self.result = self._run_json.finished(error, interrupted, counts, losses)
        if kept is None:
            self._context.discard_arena()  # stored (or nothing to keep): the raw records go

    def _finish_continuous(self, error: str | None, interrupted: bool, losses: Losses) -> None:
        recorders, batches = self._recorders, self._continuous.batches
        counts = recorders.calibration_counts()
        if self._schedule.levels_on:
            totals = batches.finish(self._record.failures, counts, losses)
        else:
            totals = Totals()
            counts.update(totals.counts())
        self._markers.remove()
        recorders.end_provenance(counts)
        recorders.stop_monitor(counts)  # a continuous session's model spans are not summarized
        self._record.mark("stored")
        self._output.shut_down(counts, losses)
        counts.update(self._continuous.meta())
        counts.update(self._output.otlp_sent())
        self.result = self._run_json.finished(error, interrupted, counts, losses, totals.iterations)
        self._context.discard_arena()


def _levels_on_at_capture() -> None:
    session = current()
    if session is not None:
        session.levels_on_for_capture()


def fail_message(exc: BaseException) -> str:
    """One line for an exception: its type and message."""
    if isinstance(exc, XspError):
        return str(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
