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
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from xsp.core import schema, store
from xsp.core.devices import resolve_device
from xsp.core.errors import ConfigError, XspError
from xsp.core.levelset import LevelSet, continuous_counters
from xsp.core.records import MonitorSamples
from xsp.tracer.capture import graphs, interleave
from xsp.tracer.capture import iterations as boundaries
from xsp.tracer.capture.batch_rotation import BatchRotation, signals_held
from xsp.tracer.capture.calibrate import Calibration
from xsp.tracer.capture.context import OTEL_TRACE
from xsp.tracer.capture.host_state import host_state
from xsp.tracer.capture.level_stack import LevelStack
from xsp.tracer.capture.levels import (
    Level,
    LevelContext,
    build_levels,
    check_levels,
    level_environment,
)
from xsp.tracer.capture.levels.protocols import StepTimer
from xsp.tracer.capture.monitor import GpuMonitor
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_output import RunOutput, RunStatus, run_resource, run_status
from xsp.tracer.capture.sampling import SamplingPolicy
from xsp.tracer.capture.schedule import Boundary, Phase, Schedule
from xsp.tracer.capture.warmup import WarmupClock
from xsp.tracer.export.batches import Totals
from xsp.tracer.export.finish import Losses, RunIdentity
from xsp.tracer.export.sinks import Sink
from xsp.tracer.spec import (
    DEFAULT_EXPORT_EVERY_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    ProfileSpec,
    RunSpec,
)

__all__ = ["ProgressCallback", "Session", "current", "fail_message"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int], None]  # (phase, done, total)
#: A continuous session reports its measured iterations at most this often.
PROGRESS_EVERY_S = 0.5
#: A lease of a session with no sampled level: its deadline ends it first.
LEASE_WITHOUT_SAMPLING = 1 << 40

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
        sample_every, sample_rate: the continuous session's sampling policy: every Nth
            iteration, at most R a second, recorded by the levels below M
            (``xsp.tracer.capture.sampling``).
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
        self._output = RunOutput(self._identify(spec, resource or {}), sinks, self._errors)
        check_levels(self.levels, self.device)
        self.continuous = profile.continuous
        if self.continuous and self.levels.counters:
            raise ConfigError(continuous_counters(self.levels))
        self._stack = LevelStack(self._build_levels(spec), self._errors)
        self._set_up_interleave()
        self._schedule = Schedule(
            profile.warmup,
            profile.iterations,
            continuous=self.continuous,
            interleave=self._interleave is not None,
        )
        self._set_up_markers(auto_iterations, progress, before_levels)
        self._monitor: GpuMonitor | None = None
        if monitor and self.device.startswith("cuda"):
            index = torch.device(self.device).index
            self._monitor = GpuMonitor(index if index is not None else torch.cuda.current_device())
        self.started_ns = time.time_ns()
        self._phase_ns: dict[str, int] = {}  # when levels came on and measuring ended
        self._switch_on_ms: dict[str, float] = {}
        #: where the process ran as it began and ended measuring (``host_state``)
        self._host: dict[str, dict[str, Any]] = {}
        self._calibration: Calibration | None = None
        self._calibrates = profile.calibrate
        alone = (self.world_size or 1) == 1  # ranks must measure the same iterations
        self._warmup = WarmupClock(self.device, profile.warmup, settle=settle and alone)
        self._set_up_service()
        self.result: dict[str, Any] | None = None
        #: How the traced program ended, written into run.json (``exit_code``, ``exception``,
        #: ``interrupted``; the leveled runner adds ``signal`` for a killed process).
        self.program: dict[str, Any] | None = None

    def _identify(self, spec: RunSpec, resource: Mapping[str, Any]) -> RunIdentity:
        """The run's ids, rank and run directory (emptied for this run)."""
        rank, world_size = spec.rank, spec.world_size
        self.run_id = spec.run_id or uuid.uuid4().hex
        self.measurement_id = spec.measurement_id or self.run_id
        self.workload = spec.workload if spec.workload is not None else spec.profile.workload
        if rank is not None and (world_size is None or not 0 <= rank < world_size):
            raise ConfigError(f"bad rank {rank} of world size {world_size}")
        self.rank, self.world_size = rank, world_size
        self.run_dir = Path(spec.out) if spec.out is not None else None
        if self.run_dir is not None:
            store.check_writable(self.run_dir)
            store.reset_run_dir(self.run_dir)
        self.resource = run_resource(
            self.device,
            self.run_id,
            self.measurement_id,
            self.workload,
            self.levels,
            rank,
            world_size,
            resource,
        )
        return RunIdentity(
            self.run_id,
            self.measurement_id,
            self.levels,
            self.workload,
            self.resource,
            self.run_dir,
            rank,
            world_size,
        )

    def _build_levels(self, spec: RunSpec) -> list[Level]:
        context = LevelContext(
            self.device,
            self.levels,
            op_shapes=spec.profile.op_shapes,
            run_dir=self.run_dir,
            multi_rank=(spec.world_size or _distributed_world_size()) > 1,
        )
        self._context = context
        for key, value in level_environment(context).items():  # xsp run sets them earlier
            os.environ.setdefault(key, value)
        levels = build_levels(self.levels, context)
        # whatever the levels: every level set compiles the same code, and the first one's
        # compile, saved with its provenance in inductor's caches, serves the others
        context.provenance.install()
        return levels

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

    def _set_up_markers(
        self,
        auto_iterations: bool,
        progress: ProgressCallback | None,
        before_levels: Callable[[], None] | None,
    ) -> None:
        self._auto = auto_iterations
        self._watch: boundaries.ModelCalls | boundaries.FunctionCalls | None = None
        self._marked = False  # xsp.step() or xsp.iteration() was called
        self._progress = progress
        self._progress_at = 0.0
        self._levels_early: str | None = None  # why levels came on before their iteration
        self._closed = False
        self._started = False
        self._failures: dict[int, str] = {}
        self._level_failure: str | None = None
        self._before_levels = before_levels

    def _set_up_service(self) -> None:
        """A continuous session (a service): its sampling policy, its batches, when it stops."""
        profile = self.spec.profile
        self._policy = SamplingPolicy(profile.sample_every, profile.sample_rate)
        #: the levels below M record the open (or next) iteration; None: not decided yet (after
        #: a batch's hand-over), so the next iteration's policy switches every level
        self._sampled_on: bool | None = True
        # the short way through the markers (_steady_check): the levels they go to, and when
        # the next progress report, batch or the duration's end is due (monotonic)
        self._steady = False
        self._marker_levels: list[Level] = []
        self._marker_levels_reversed: list[Level] = []
        self._lease_timer: StepTimer | None = None  # level M, alone at the markers
        self._due = 0.0
        #: the root call's ``lease`` (``lease_to``): iterations it records without the markers
        self._lessee: Callable[[int, int, int, Any], None] | None = None
        self._batches = BatchRotation(
            self._output, self._stack, self._context, self._errors, self._stored_so_far
        )
        self._measure_end: float | None = None  # monotonic: the duration's end

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
            self._watch = boundaries.FunctionCalls(self.spec.profile.iteration_fn, self)
        _current = self
        self._write_meta(RunStatus.RUNNING)
        atexit.register(self.close)
        if self.levels.gpu and self.device.startswith("cuda"):
            graphs.turn_levels_on_at_capture(_levels_on_at_capture)
        if self._schedule.levels_on_at_start:
            self._enable_levels()
        if self._auto and self._watch is None:
            # after level F wraps module calls: the root module's iterations must begin
            # outside F's wrapper, so that the root's own span falls inside them
            self._watch = boundaries.ModelCalls(self)
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
        self._steady = False
        try:
            if isinstance(self._watch, boundaries.ModelCalls):
                self._watch.settle()
            if self._schedule.open is not None:
                # a tail after the last step (a script that stepped fewer times than asked) is
                # kept, marked failed, so not counted as measured
                self.end_iteration(error=error or "the session closed inside this iteration")
            self._finish(error, interrupted)
        finally:
            self._remove_watch()
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
        if self._marked:
            return boundaries.MARKED
        if self._watch is not None and self._watch.boundary is not None:
            return self._watch.boundary
        if isinstance(self._watch, boundaries.ModelCalls) and self._schedule.index:
            return boundaries.ROOT_MODULE_CALL  # undecided: the warm-up's were root calls
        return None

    def begin_iteration(self) -> None:
        schedule = self._schedule
        if self._steady and schedule.open is None:  # a service's request: the short way
            # no schedule method on this path: a request pays for each Python call
            schedule.open = Phase.MEASURE
            measured = schedule.index - schedule.warmup
            on = self._policy.sample(measured)
            if on is not self._sampled_on:
                self._switch_sampling(on)
            for level in self._marker_levels:
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
                self._sample(measured)
            for level in self._stack.levels:
                level.begin_iteration(measured)

    def end_iteration(self, error: str | None = None, finish: bool = False) -> None:
        """End the open iteration (failed, when ``error`` says why). ``finish``: store the run
        now if that was its last measured iteration (``finish_if_done``)."""
        schedule = self._schedule
        if schedule.open is None:
            if finish:
                self.finish_if_done()
            return
        if schedule.open is Phase.UNTRACED:
            self._end_untraced(error)
            return
        if self._steady:  # as below, with what a steady state rules out left out
            measured = schedule.index - schedule.warmup
            for level in self._marker_levels_reversed:
                level.end_iteration(measured)
            if error is not None:
                self._failures[measured] = error
            schedule.open = None
            schedule.index += 1
            if time.monotonic() >= self._due:
                self._report_progress()
                self._continue()
                self._steady_check()
                if finish:
                    self.finish_if_done()
            if self._lessee is not None and self._steady:
                self._lease()
            return
        measured = schedule.measured
        if schedule.open is Phase.MEASURE:
            for level in reversed(self._stack.levels):
                level.end_iteration(measured)
            if error is not None:
                self._failures[measured] = error
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
            self._continue()
        self._steady_check()
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
        self._switch_sampling(False)
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
        self._switch_sampling(True)
        self._interleave.switched(began)

    # -- a continuous session ------------------------------------------------------------------
    def _steady_check(self) -> None:
        """Whether the next iterations may take the short way through the markers: a continuous
        session measuring without an end in sight, past its first measured iteration, with its
        levels on (``Schedule.unbounded``). Then the session has only three things to do
        between iterations, each decided by one comparison: its sampling policy's
        (``_marker_levels``: the levels that get this iteration's markers), and, once ``_due``
        (monotonic) has passed, a progress report and a batch or the duration's end."""
        self._steady = not self._closed and self._schedule.unbounded
        if not self._steady:
            return
        due = self._batches.started + self.spec.profile.export_every_s
        if self._measure_end is not None:
            due = min(due, self._measure_end)
        if self._progress is not None:
            due = min(due, self._progress_at + PROGRESS_EVERY_S)
        self._due = due
        self._mark_levels()

    def lease_to(self, lessee: Callable[[int, int, int, Any], None]) -> None:
        """Where the next iterations may be lent: ``lessee(next measured index, how many,
        monotonic deadline in ns, the device sync)`` records them itself (``_lease``)."""
        self._lessee = lessee

    def _lease(self) -> None:
        """Lend the root call the next iterations that would record level M's step and nothing
        else: its sampled levels off (or none), no application span to join (the program has
        not imported OpenTelemetry), M's markers the only ones. Up to the next sampled one, and
        until the next thing due (a progress line, a batch, the duration's end): the root call
        comes back through the markers then, which first count what it recorded
        (``settle_leased``)."""
        timer = self._lease_timer
        if timer is None or OTEL_TRACE in sys.modules or self._lessee is None:
            return
        measured = self._schedule.measured  # the next iteration's
        if self._stack.has_sampled:
            count = self._policy.unsampled_from(measured)
        else:
            count = LEASE_WITHOUT_SAMPLING
        if count:
            self._lessee(measured, count, int(self._due * 1e9), timer.sync)

    def settle_leased(self, done: int, errors: list[tuple[int, str]]) -> None:
        """The iterations the root call recorded on its lease since the last marker: ``done``
        of them; ``errors`` for those that raised (measured index, "Type: message")."""
        self._schedule.skip(done)
        for index, error in errors:
            self._failures[index] = error

    def _mark_levels(self) -> None:
        """The levels that get the iteration markers (``LevelStack.marker_levels``), and level
        M when it is the only one (a lease's)."""
        self._marker_levels = self._stack.marker_levels(self._sampled_on)
        self._marker_levels_reversed = self._marker_levels[::-1]
        self._lease_timer = self._stack.step_timer(self._marker_levels)

    def _sample(self, measured: int) -> None:
        """Switch the levels below M on or off for the iteration beginning (its policy)."""
        on = self._policy.sample(measured)
        if measured == 0:
            self._measure_end = (
                time.monotonic() + self.spec.profile.duration_s
                if self.spec.profile.duration_s is not None
                else None
            )
            self._batches.started = time.monotonic()
        if on != self._sampled_on:
            self._switch_sampling(on)

    def _switch_sampling(self, on: bool) -> None:
        self._sampled_on = on
        if self._steady:
            self._mark_levels()
        self._stack.sample(on)

    def _continue(self) -> None:
        """After a measured iteration of a continuous session: stop once its duration is over,
        else store a batch when one is due (``export_every_s``)."""
        now = time.monotonic()
        if self._measure_end is not None and now >= self._measure_end:
            self._schedule.stop_measuring()
        elif now - self._batches.started >= self.spec.profile.export_every_s:
            try:
                self._rotate()
            except Exception:
                self._misuse("storing a batch of iterations failed")

    def _rotate(self) -> None:
        """Hand the iterations finished since the last batch to the exporter and start the next
        batch: levels off, drained, the arena recycled, levels on again (between iterations)."""
        with signals_held():  # a Ctrl-C now would cut a batch in two
            self._rotate_held()

    def _rotate_held(self) -> None:
        stopped = self._batches.hand_over(self._failures)
        self._batches.restart(stopped)
        # F's enable() records, L and G's waits for a sampled iteration (CUPTI starts then,
        # before the iteration's markers): the next iteration's policy switches them all
        self._sampled_on = None
        self._steady_check()

    def _stored_so_far(self, totals: Totals) -> None:
        """run.json while a continuous session runs: what its batches stored so far."""
        self._write_meta(
            RunStatus.RUNNING,
            measured=totals.iterations,
            **totals.counts(),
            **self._service_meta(),
            **self._output.otlp_sent(),
        )

    def _service_meta(self) -> dict[str, Any]:
        if not self.continuous:
            return {}
        profile = self.spec.profile
        return {
            "continuous": True,
            "duration_s": profile.duration_s,
            "export_every_s": profile.export_every_s,
            "sampling": self._policy.describe(),
        }

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
        self._levels_early = f"a CUDA graph capture in warm-up iteration {self._schedule.index}"
        self._enable_levels()

    def note(self, what: str) -> None:
        """Something an automatic boundary wants in ``run.json`` (logged once)."""
        self._misuse(what)

    def boundary_changed(self) -> None:
        """The warm-up's iterations so far ended at another boundary (a training loop's
        forward passes, before its first optimizer step): their times are not its step's."""
        if not self.measuring:
            self._warmup.restart()

    def _remove_watch(self) -> None:
        if self._watch is not None:
            self._watch.remove()

    def _auto_off(self) -> None:
        if self._marked:
            return
        self._marked = True
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
            log.info("xsp: explicit iteration markers found; automatic boundaries are off")

    def add_error(self, message: str) -> None:
        """Record a failure outside the session's own work (a fix that could not apply) in
        run.json's ``errors``; tracing carries on."""
        self._errors.add(message)

    def _misuse(self, what: str) -> None:
        self._errors.misuse(what)

    def _report_progress(self) -> None:
        if self._progress is None:
            return
        index, warmup = self._schedule.index, self.warmup
        try:
            if index <= warmup:
                self._progress("warmup", index, warmup)
            elif self.continuous:  # a service's thousands a second: a line now and then
                now = time.monotonic()
                if now - self._progress_at >= PROGRESS_EVERY_S:
                    self._progress_at = now
                    self._progress("measure", index - warmup, self.iterations)
            else:
                self._progress("measure", index - warmup, self.iterations)
        except Exception:
            self._misuse("the progress callback failed")

    def _enable_levels(self) -> None:
        if self._before_levels is not None:
            self._phase_ns["ready"] = time.time_ns()
            self._before_levels()
        self._schedule.levels_on = True
        self._phase_ns["levels_on"] = mark = time.time_ns()

        def took(what: str) -> None:  # the switch-on's parts, in run.json's switch_on_ms
            nonlocal mark
            now = time.time_ns()
            self._switch_on_ms[what] = round((now - mark) / 1e6, 2)
            mark = now

        if self.levels.framework and self._calibrates:  # the replay takes F's cost off host times
            self._calibration = Calibration()
            self._calibration.before()
            took(schema.CALIBRATION_PARTS[0])
        if self._monitor is not None:
            reason = self._monitor.start()
            if reason:
                self._errors.add(reason)
            took("monitor")
        failure = self._stack.enable(took)
        self._level_failure = self._level_failure or failure
        if self._calibration is not None:
            priced = self._stack.priced()
            if priced is not None:  # F's records are what it prices
                # F records the ops' shapes in its first measured iteration only: timed both ways
                shapes = priced.set_shapes if priced.shapes_in_first_iteration_only else None
                self._calibration.after(self._context.arena.records_written, priced.sample, shapes)
            took(schema.CALIBRATION_PARTS[1])
        self._phase_ns["enabled"] = time.time_ns()
        self._host["measuring"] = host_state()

    # -- the finish ----------------------------------------------------------------------------
    def _finish(self, error: str | None, interrupted: bool = False) -> None:
        """Switch levels off, convert what they recorded, export it, write run.json.

        The status is honest about what got lost: ``error`` when the workload failed or nothing
        usable was stored (no model level, conversion or the store failed), ``partial`` when
        something is missing (fewer iterations, a level that failed to stop or drain, a sink
        that failed, records CUPTI dropped or xsp could not decode), ``interrupted`` after a
        Ctrl-C; ``status_reasons`` says why, one line each."""
        self._schedule.finish_due = False
        self._steady = False
        if self.result is not None:
            return
        self._phase_ns["measured"] = time.time_ns()
        self._host["measured"] = host_state()
        losses = Losses()
        if self.continuous:
            self._finish_continuous(error, interrupted, losses)
            return
        stopped = self._stack.stop(losses)
        self._phase_ns["stopped"] = time.time_ns()
        counts = self._calibration_counts()
        raw = self._stack.drain(stopped, counts, losses)
        self._remove_watch()  # the run is over: no more iterations to find
        self._end_provenance(counts)
        samples = self._stop_monitor(counts)
        self._phase_ns["drained"] = time.time_ns()
        counts["spans"] = 0
        converted_ns, kept = self._output.store(
            raw, samples, self._failures, self._context, counts, losses
        )
        if converted_ns is not None:
            self._phase_ns["converted"] = converted_ns
        self._output.shut_down(counts, losses)
        self.result = self._write_result(error, interrupted, counts, losses)
        if kept is None:
            self._context.discard_arena()  # stored (or nothing to keep): the raw records go

    def _finish_continuous(self, error: str | None, interrupted: bool, losses: Losses) -> None:
        counts = self._calibration_counts()
        if self._schedule.levels_on:
            totals = self._batches.finish(self._failures, counts, losses)
        else:
            totals = Totals()
            counts.update(totals.counts())
        self._remove_watch()
        self._end_provenance(counts)
        self._stop_monitor(counts)  # a continuous session's model spans are not summarized
        self._phase_ns["stored"] = time.time_ns()
        self._output.shut_down(counts, losses)
        counts.update(self._service_meta())
        counts.update(self._output.otlp_sent())
        self.result = self._write_result(error, interrupted, counts, losses, totals.iterations)
        self._context.discard_arena()

    def _calibration_counts(self) -> dict[str, Any]:
        if self._calibration is not None and self._calibration.result is not None:
            return {"calibration": self._calibration.result}
        return {}

    def _end_provenance(self, counts: dict[str, Any]) -> None:
        counts.update(self._context.provenance.counts())
        self._context.uninstall_provenance()

    def _stop_monitor(self, counts: dict[str, Any]) -> MonitorSamples | None:
        """Stop NVML sampling; keep the samples beside the spans and count them."""
        samples = self._monitor.stop() if self._monitor is not None else None
        if samples is not None:
            self._output.monitor_counts(samples, counts)
        return samples

    def _write_result(
        self,
        error: str | None,
        interrupted: bool,
        counts: dict[str, Any],
        losses: Losses,
        stored: int | None = None,
    ) -> dict[str, Any]:
        """The run's status and its reasons, written into run.json; returns run.json.
        ``stored``: a continuous session's iterations stored (its batches')."""
        # as the summary counts them: the measured iterations that ended, less the failed ones
        ended = self._schedule.measured_ended()
        measured = max(0, ended - len(self._failures))
        if stored is not None:  # a batch lost (its conversion failed) is not measured
            measured = max(0, min(measured, stored - len(self._failures)))
        asked = str(self.iterations) if self.iterations else "an unlimited number of"
        if measured == 0 and not interrupted and error is None:
            losses.fatal.append(f"0 of {asked} iterations measured: {self._why_none()}")
        elif self._schedule.stopped_at is None and self.iterations and measured < self.iterations:
            why = ""
            if self._interleave is not None:  # the program ran out of steps for both kinds
                why = (
                    f" (this process ran an untraced iteration before each traced one: the "
                    f"program needs {self.warmup + 2 * self.iterations} steps, --warmup plus "
                    "twice --iterations, or give --no-interleave)"
                )
            losses.missing.append(f"{measured} of {self.iterations} iterations measured{why}")
        elif stored is not None and measured < ended - len(self._failures):
            losses.missing.append(f"{measured} of {ended} iterations stored")
        error = error or self._level_failure or (losses.fatal[0] if losses.fatal else None)
        reasons = [r for r in [error, *losses.fatal, *losses.missing] if r]
        return self._write_meta(
            run_status(error, interrupted, losses),
            error=error,
            measured=measured,
            status_reasons=list(dict.fromkeys(reasons)),
            **counts,
        )

    def _why_none(self) -> str:
        """Why a run measured no iteration, in words a user can act on."""
        boundary = self.iteration_boundary
        index = self._schedule.index
        if index > 0:
            return (
                f"the program ran {index} iteration(s) ({boundary}), "
                f"all of them warm-up (--warmup {self.warmup})"
            )
        if isinstance(self._watch, boundaries.FunctionCalls):
            return (
                f"{self._watch.boundary.removeprefix(boundaries.FUNCTION_PREFIX)} was never called"
            )
        if self._auto and not self._marked:
            return (
                "the program called no nn.Module with parameters and no optimizer.step(); mark "
                "its iterations with xsp.step() or name a function with --iteration-fn"
            )
        return "no iteration was marked"

    def _write_meta(
        self, status: RunStatus, error: str | None = None, measured: int = 0, **extra: Any
    ) -> dict[str, Any]:
        return self._output.write_meta(lambda: self._meta(status, error, measured, extra))

    def _meta(
        self, status: RunStatus, error: str | None, measured: int, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """run.json as it stands."""
        return {
            "format": schema.STORE_FORMAT,
            "run_id": self.run_id,
            "measurement_id": self.measurement_id,
            "levels": self.levels,
            "workload": self.workload,
            "resource": dict(self.resource),
            "status": status.value,
            "error": error,
            "iterations_requested": self.iterations,
            "iterations_measured": measured,
            "iteration_boundary": self.iteration_boundary,
            "warmup": self.warmup,
            **self._warmup.report(),
            **self._interleave_report(),
            **({"levels_on_early": self._levels_early} if self._levels_early else {}),
            "failed_iterations": {str(k): v for k, v in sorted(self._failures.items())},
            "errors": list(self._errors.lines),
            "started_ns": self.started_ns,
            "phases_ns": dict(self._phase_ns),
            "switch_on_ms": dict(self._switch_on_ms),
            **({"host": dict(self._host)} if self._host else {}),
            "finished_ns": time.time_ns() if status is not RunStatus.RUNNING else None,
            "files": self._output.files(),
            **({"program": dict(self.program)} if self.program is not None else {}),
            **({"rank": self.rank, "world_size": self.world_size} if self.rank is not None else {}),
            **extra,
        }

    def _interleave_report(self) -> dict[str, Any]:
        if self._interleave is not None:
            return {interleave.RUN_KEY: self._interleave.report()}
        if self._interleave_skipped is not None:
            return {interleave.RUN_KEY: {"skipped": self._interleave_skipped}}
        return {}


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


def _distributed_world_size() -> int:
    """The size of an initialized torch.distributed job this process belongs to, else 1: a DDP
    script traced without ``rank``/``world_size`` still gets every iteration's collective sizes."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1
