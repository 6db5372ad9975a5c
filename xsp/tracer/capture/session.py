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
import platform
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from xsp.core import schema, store
from xsp.core.arena import pending_arena_name
from xsp.core.devices import resolve_device
from xsp.core.errors import ConfigError, XspError
from xsp.core.levelset import LevelSet
from xsp.core.records import MonitorSamples
from xsp.tracer.capture import graphs, interleave
from xsp.tracer.capture import iterations as boundaries
from xsp.tracer.capture.calibrate import Calibration
from xsp.tracer.capture.context import OTEL_TRACE
from xsp.tracer.capture.host_state import host_state
from xsp.tracer.capture.levels import (
    Level,
    LevelContext,
    build_levels,
    check_levels,
    level_environment,
)
from xsp.tracer.capture.levels.model import ModelLevel
from xsp.tracer.capture.monitor import GpuMonitor
from xsp.tracer.capture.sampling import SamplingPolicy
from xsp.tracer.capture.warmup import WarmupClock
from xsp.tracer.convert.spans import ROOT_LEVEL
from xsp.tracer.export.batches import Batch, BatchDrain, BatchExporter, Totals
from xsp.tracer.export.finish import Losses, capture_losses, sink_losses, store_spans
from xsp.tracer.export.sinks import CompositeSink, Sink, StoreSink
from xsp.tracer.spec import (
    DEFAULT_EXPORT_EVERY_S,
    DEFAULT_ITERATIONS,
    DEFAULT_WARMUP,
    ProfileSpec,
    RunSpec,
)

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


def _xsp_version() -> str:
    try:
        from importlib.metadata import version

        return version("xsp")
    except Exception:
        return "0+unknown"


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
        iterations, warmup = profile.iterations, profile.warmup
        rank, world_size = spec.rank, spec.world_size
        if warmup < 0:
            raise ConfigError(f"bad warmup {warmup}: must be 0 or more")
        self.spec = spec
        self.levels = spec.levels
        self.iterations = iterations
        self.warmup = warmup
        self.device = resolve_device(profile.device)
        self.run_id = spec.run_id or uuid.uuid4().hex
        self.measurement_id = spec.measurement_id or self.run_id
        self.workload = spec.workload if spec.workload is not None else profile.workload
        if rank is not None and (world_size is None or not 0 <= rank < world_size):
            raise ConfigError(f"bad rank {rank} of world size {world_size}")
        self.rank, self.world_size = rank, world_size
        self.run_dir = Path(spec.out) if spec.out is not None else None
        if self.run_dir is not None:
            store.check_writable(self.run_dir)
            store.reset_run_dir(self.run_dir)
        self._store_sink = StoreSink(self.run_dir) if self.run_dir is not None else None
        self._sink = CompositeSink(([self._store_sink] if self._store_sink else []) + list(sinks))
        self.resource = self._resource(resource or {})
        check_levels(self.levels, self.device)
        self.continuous = profile.continuous
        if self.continuous and self.levels.counters:
            raise ConfigError(
                f"level set {self.levels}: level H cannot run in a continuous session (Nsight "
                "Compute replays each kernel in a run of its own): use a fixed --iterations"
            )
        context = LevelContext(
            self.device,
            self.levels,
            op_shapes=profile.op_shapes,
            run_dir=self.run_dir,
            multi_rank=(world_size or _distributed_world_size()) > 1,
        )
        self._context = context
        for key, value in level_environment(context).items():  # xsp run sets them earlier
            os.environ.setdefault(key, value)
        self._levels: list[Level] = build_levels(self.levels, context)
        # whatever the levels: every level set compiles the same code, and the first one's
        # compile, saved with its provenance in inductor's caches, serves the others
        context.provenance.install()
        self._auto = auto_iterations
        self._watch: boundaries.ModelCalls | boundaries.FunctionCalls | None = None
        self._marked = False  # xsp.step() or xsp.iteration() was called
        self._progress = progress
        self._index = 0  # iterations begun so far, warm-up included
        self._open = False
        self._levels_on = False
        self._levels_early: str | None = None  # why levels came on before their iteration
        self._finish_pending = False
        self._closed = False
        self._started = False
        self._failures: dict[int, str] = {}
        self._level_failure: str | None = None
        self._monitor: GpuMonitor | None = None
        if monitor and self.device.startswith("cuda"):
            index = torch.device(self.device).index
            self._monitor = GpuMonitor(index if index is not None else torch.cuda.current_device())
        self._errors: list[str] = []
        self._misuse_logged = False
        self.started_ns = time.time_ns()
        self._phase_ns: dict[str, int] = {}  # when levels came on and measuring ended
        self._switch_on_ms: dict[str, float] = {}
        #: where the process ran as it began and ended measuring (``host_state``)
        self._host: dict[str, dict[str, Any]] = {}
        self._before_levels = before_levels
        self._calibration: Calibration | None = None
        self._calibrates = profile.calibrate
        self._warmup = WarmupClock(self.device, warmup, settle=settle and (world_size or 1) == 1)
        # untraced iterations between the traced ones (the process that prices F's cost)
        self._interleave: interleave.Interleave | None = None
        self._interleave_skipped: str | None = None
        self._untraced_open = False
        if profile.interleave:
            reason = interleave.unavailable(self.levels, self.device, self.continuous)
            if reason is None:
                self._interleave = interleave.Interleave(self.device)
                for level in self._levels:  # before they come on: their wrappers know it
                    per_iteration = getattr(level, "switched_per_iteration", None)
                    if per_iteration is not None:
                        per_iteration()
            else:
                self._interleave_skipped = reason
        # a continuous session (a service): its sampling policy, its batches, when it stops
        self._policy = SamplingPolicy(profile.sample_every, profile.sample_rate)
        #: the levels below M record the open (or next) iteration; None: not decided yet (after
        #: a batch's hand-over), so the next iteration's policy switches every level
        self._sampled_on: bool | None = True
        # the short way through the markers (_steady_check): the levels they go to, and when
        # the next progress report, batch or the duration's end is due (monotonic)
        self._steady = False
        self._marker_levels: list[Level] = []
        self._marker_levels_reversed: list[Level] = []
        self._due = 0.0
        #: the root call's ``lease`` (``lease_to``): iterations it records without the markers
        self._lessee: Callable[[int, int, int, Any], None] | None = None
        self._exporter: BatchExporter | None = None
        self._batch = 0  # batches submitted
        self._batch_started = 0.0
        self._batch_missing: list[str] = []  # what batches lost at capture, one line each
        self._measure_end: float | None = None  # monotonic: the duration's end
        self._stopped_at: int | None = None  # the index the duration stopped measuring at
        self._meta_lock = threading.Lock()
        self._progress_at = 0.0
        self.result: dict[str, Any] | None = None
        #: How the traced program ended, written into run.json (``exit_code``, ``exception``,
        #: ``interrupted``; the leveled runner adds ``signal`` for a killed process).
        self.program: dict[str, Any] | None = None

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
        self._write_meta("running")
        atexit.register(self.close)
        if self.levels.gpu and self.device.startswith("cuda"):
            graphs.turn_levels_on_at_capture(_levels_on_at_capture)
        if self.warmup <= 1:
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
            if self._open:
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
        limit = self._limit
        return self.warmup <= self._index and (limit is None or self._index < limit)

    @property
    def _limit(self) -> int | None:
        """The index measuring stops at; None: not yet known (until stopped, or a duration)."""
        if self._stopped_at is not None:
            return self._stopped_at
        return self.warmup + self.iterations if self.iterations else None

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def iteration_boundary(self) -> str | None:
        """What ended this run's iterations (``xsp.tracer.capture.iterations``), None while
        nothing has."""
        if self._marked:
            return boundaries.MARKED
        if self._watch is not None and self._watch.boundary is not None:
            return self._watch.boundary
        if isinstance(self._watch, boundaries.ModelCalls) and self._index:
            return boundaries.ROOT_MODULE_CALL  # undecided: the warm-up's were root calls
        return None

    def begin_iteration(self) -> None:
        if self._steady and not self._open:  # a service's request: the short way
            self._open = True
            measured = self._index - self.warmup
            on = self._policy.sample(measured)
            if on is not self._sampled_on:
                self._switch_sampling(on)
            for level in self._marker_levels:
                level.begin_iteration(measured)
            return
        if self._finish_pending:
            self._finish(None)
        if self._open or self._closed or self.done:
            if self._open:
                self._misuse("begin_iteration while an iteration is open")
            return
        self._open = True
        if not self.measuring and not self._levels_on:
            self._warmup.begin()
        if self.measuring:
            if self._interleave is not None:
                if self._interleave.untraced_due:
                    self._begin_untraced()
                    return
                self._interleave.begin()
            measured = self._index - self.warmup
            if self.continuous:
                self._sample(measured)
            for level in self._levels:
                level.begin_iteration(measured)

    def end_iteration(self, error: str | None = None, finish: bool = False) -> None:
        """End the open iteration (failed, when ``error`` says why). ``finish``: store the run
        now if that was its last measured iteration (``finish_if_done``)."""
        if not self._open:
            if finish:
                self.finish_if_done()
            return
        if self._untraced_open:
            self._end_untraced(error)
            return
        if self._steady:  # as below, with what a steady state rules out left out
            measured = self._index - self.warmup
            for level in self._marker_levels_reversed:
                level.end_iteration(measured)
            if error is not None:
                self._failures[measured] = error
            self._open = False
            self._index += 1
            if time.monotonic() >= self._due:
                self._report_progress()
                self._continue()
                self._steady_check()
                if finish:
                    self.finish_if_done()
            if self._lessee is not None and self._steady:
                self._lease()
            return
        if self.measuring:
            measured = self._index - self.warmup
            for level in reversed(self._levels):
                level.end_iteration(measured)
            if error is not None:
                self._failures[measured] = error
            if self._interleave is not None:
                more = self._limit is None or self._index + 1 < self._limit
                self._interleave.end_traced(measured, error is not None, more)
        elif not self._levels_on:
            self._warmup.end()
        self._open = False
        self._index += 1
        self._report_progress()
        # Levels start one warm-up iteration early: their own start-up cost (CUPTI instrumenting
        # kernels, NVTX registering names; 180 ms on the first ResNet-50 MFLG step on the H200)
        # lands outside the measured window. What they record then falls outside every iteration.
        if self._index == self.warmup - 1 and not self._levels_on:
            if self._warmup.longer():
                self.warmup += 1
            else:
                self._enable_levels()
        if self._index == self._limit:
            self._finish_pending = True
        elif self.continuous and self._levels_on and self._index > self.warmup:
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

    @property
    def done(self) -> bool:
        """True once every measured iteration has been recorded."""
        limit = self._limit
        return limit is not None and self._index >= limit

    # -- untraced iterations between the traced ones (``xsp.tracer.capture.interleave``) ------
    def _begin_untraced(self) -> None:
        """An untraced iteration before the next traced one: the levels below M off, timed."""
        if self._interleave is None:
            return
        self._untraced_open = True
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
        self._untraced_open = False
        self._open = False
        began = time.perf_counter_ns()
        self._switch_sampling(True)
        self._interleave.switched(began)

    # -- a continuous session ------------------------------------------------------------------
    def _steady_check(self) -> None:
        """Whether the next iterations may take the short way through the markers: a continuous
        session measuring without an end in sight, past its first measured iteration, with its
        levels on. Then the session has only three things to do between iterations, each
        decided by one comparison: its sampling policy's (``_marker_levels``: the levels that
        get this iteration's markers), and, once ``_due`` (monotonic) has passed, a progress
        report and a batch or the duration's end."""
        self._steady = (
            self.continuous
            and self._levels_on
            and not self._closed
            and not self._finish_pending
            and self._limit is None
            and self._index > self.warmup
        )
        if not self._steady:
            return
        due = self._batch_started + self.spec.profile.export_every_s
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
        if len(self._marker_levels) != 1 or OTEL_TRACE in sys.modules:
            return
        (model,) = self._marker_levels
        if not isinstance(model, ModelLevel) or self._lessee is None:
            return
        measured = self._index - self.warmup  # the next iteration's
        if any(hasattr(level, "sample") for level in self._levels):
            count = self._policy.unsampled_from(measured)
        else:
            count = LEASE_WITHOUT_SAMPLING
        if count:
            self._lessee(measured, count, int(self._due * 1e9), model.sync)

    def settle_leased(self, done: int, errors: list[tuple[int, str]]) -> None:
        """The iterations the root call recorded on its lease since the last marker: ``done``
        of them; ``errors`` for those that raised (measured index, "Type: message")."""
        self._index += done
        for index, error in errors:
            self._failures[index] = error

    def _mark_levels(self) -> None:
        """The levels that get the iteration markers: all of them while the levels below M
        record (or may: undecided, when nothing may be lent either); else those without a
        sampling switch (level M): a level sampled off records nothing at its markers."""
        if self._sampled_on is not False:
            self._marker_levels = list(self._levels)
        else:
            self._marker_levels = [level for level in self._levels if not hasattr(level, "sample")]
        self._marker_levels_reversed = self._marker_levels[::-1]

    def _sample(self, measured: int) -> None:
        """Switch the levels below M on or off for the iteration beginning (its policy)."""
        on = self._policy.sample(measured)
        if measured == 0:
            self._measure_end = (
                time.monotonic() + self.spec.profile.duration_s
                if self.spec.profile.duration_s is not None
                else None
            )
            self._batch_started = time.monotonic()
        if on != self._sampled_on:
            self._switch_sampling(on)

    def _switch_sampling(self, on: bool) -> None:
        self._sampled_on = on
        if self._steady:
            self._mark_levels()
        for level in self._levels:
            sample = getattr(level, "sample", None)
            if sample is not None:
                try:
                    sample(on)
                except Exception as exc:
                    self._misuse(f"level {level.letter} could not switch its sampling: {exc}")

    def _continue(self) -> None:
        """After a measured iteration of a continuous session: stop once its duration is over,
        else store a batch when one is due (``export_every_s``)."""
        now = time.monotonic()
        if self._measure_end is not None and now >= self._measure_end:
            self._stopped_at = self._index
            self._finish_pending = True
        elif now - self._batch_started >= self.spec.profile.export_every_s:
            try:
                self._rotate()
            except Exception:
                self._misuse("storing a batch of iterations failed")

    def _rotate(self) -> None:
        """Hand the iterations finished since the last batch to the exporter and start the next
        batch: levels off, drained, the arena recycled, levels on again (between iterations)."""
        with _signals_held():  # a Ctrl-C now would cut a batch in two
            self._rotate_held()

    def _rotate_held(self) -> None:
        losses = Losses()
        stopped, drains = self._hand_over_levels(losses)
        self._submit_batch(drains, losses)
        enabled = []
        for level in reversed(stopped):  # stack order again
            try:
                level.enable()
                enabled.append(level)
            except Exception as exc:
                message = f"level {level.letter} could not start again: {exc}"
                log.error("xsp: %s", message)
                self._errors.append(message)
                self._batch_missing.append(message)
        self._levels = enabled
        # F's enable() records, L and G's waits for a sampled iteration (CUPTI starts then,
        # before the iteration's markers): the next iteration's policy switches them all
        self._sampled_on = None
        self._batch_started = time.monotonic()
        self._steady_check()

    def _hand_over_levels(self, losses: Losses) -> tuple[list[Level], dict[str, BatchDrain]]:
        """A batch's end, between iterations: each level stops writing it, deepest first, and
        hands over the drain of its records, which the exporter runs on its own thread
        (``Level.handover``); returns the levels that stopped and their drains. A level without
        ``handover`` (its records are not in the arena: level L on CPU) is disabled and drained
        here."""
        stopped: list[Level] = []
        drains: dict[str, BatchDrain] = {}
        for level in reversed(self._levels):
            handover = getattr(level, "handover", None)
            if handover is None:
                if self._stop_levels(losses, [level]):
                    stopped.append(level)
                    counts: dict[str, Any] = {}
                    raw = self._drain_levels([level], counts, losses)
                    if level.letter in raw:
                        drains[level.letter] = _drained(raw[level.letter], counts)
                continue
            try:
                drains[level.letter] = handover()
                stopped.append(level)
            except Exception as exc:
                self._failed_to_stop(level, exc, losses)
        return stopped, drains

    def _submit_batch(self, drains: dict[str, BatchDrain], losses: Losses) -> None:
        """Queue a handed-over batch for the exporter (waits while it is behind: bounded
        memory)."""
        self._batch_missing.extend(losses.missing)
        part = f"{self._batch:05d}"
        self._batch += 1
        arena = self._context.arena if self._context._arena else None
        pending: Path | None = None
        arena_counts: dict[str, Any] = {}
        if arena is not None:
            where = self.run_dir / pending_arena_name(part) if self.run_dir is not None else None
            pending, arena_counts = arena.rotate(where)
        if self._exporter is None:
            self._exporter = BatchExporter(
                self._sink,
                run_id=self.run_id,
                levels=self.levels,
                resource=self.resource,
                run_dir=self.run_dir,
                rank=self.rank,
                world_size=self.world_size,
                on_stored=self._stored_so_far,
            )
        self._exporter.submit(Batch(part, drains, dict(self._failures), pending, arena_counts))

    def _stored_so_far(self, totals: Totals) -> None:
        """run.json while a continuous session runs: what its batches stored so far."""
        self._write_meta(
            "running",
            measured=totals.iterations,
            **totals.counts(),
            **self._service_meta(),
            **self._otlp_sent(),
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

    def _finish_batches(self, counts: dict[str, Any], losses: Losses) -> Totals:
        """A continuous session's end: its last batch, then every batch stored."""
        stopped, drains = self._hand_over_levels(losses)
        self._submit_batch(drains, Losses())
        # the levels handed over are still installed: now they go
        self._stop_levels(
            losses, [lv for lv in self._levels if lv in stopped and hasattr(lv, "handover")]
        )
        assert self._exporter is not None
        totals = self._exporter.close()
        counts.update(totals.counts())
        self._errors.extend(totals.errors)
        losses.missing.extend(dict.fromkeys([*self._batch_missing, *totals.missing]))
        losses.missing.extend(totals.lost_batches)
        if not totals.batches and not totals.lost_batches:
            losses.fatal.append(f"level {ROOT_LEVEL} recorded nothing: no spans were converted")
        return totals

    # -- internals ----------------------------------------------------------------------------------
    def finish_if_done(self) -> None:
        """Store the run now if its last measured iteration is over (an automatic boundary
        calls this where no profiler range is open)."""
        if self._finish_pending:
            try:
                self._finish(None)
            except Exception:
                self._misuse("finishing the run failed")

    def levels_on_for_capture(self) -> None:
        """A CUDA graph capture begins: its nodes must be recorded (``xsp.tracer.capture.
        graphs``), so levels that are still off come on now, in the warm-up."""
        if self._levels_on or self._closed or not self._started:
            return
        self._levels_early = f"a CUDA graph capture in warm-up iteration {self._index}"
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
        self._errors.append(message)

    def _misuse(self, what: str) -> None:
        self._errors.append(what)
        if not self._misuse_logged:
            self._misuse_logged = True
            log.warning("xsp: %s (logged once; tracing carries on)", what)

    def _report_progress(self) -> None:
        if self._progress is None:
            return
        try:
            if self._index <= self.warmup:
                self._progress("warmup", self._index, self.warmup)
            elif self.continuous:  # a service's thousands a second: a line now and then
                now = time.monotonic()
                if now - self._progress_at >= PROGRESS_EVERY_S:
                    self._progress_at = now
                    self._progress("measure", self._index - self.warmup, self.iterations)
            else:
                self._progress("measure", self._index - self.warmup, self.iterations)
        except Exception:
            self._misuse("the progress callback failed")

    def _enable_levels(self) -> None:
        if self._before_levels is not None:
            self._phase_ns["ready"] = time.time_ns()
            self._before_levels()
        self._levels_on = True
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
                self._errors.append(reason)
            took("monitor")
        enabled = []
        for level in self._levels:
            try:
                level.enable()
                took(f"level {level.letter}")
                enabled.append(level)
            except Exception as exc:  # reported; the other levels still record
                message = f"level {level.letter} could not start: {exc}"
                log.error("xsp: %s", message)
                self._errors.append(message)
                self._level_failure = self._level_failure or message
        self._levels = enabled
        if self._calibration is not None:
            from xsp.tracer.capture.levels.framework import FrameworkLevel

            framework = next(
                (level for level in self._levels if isinstance(level, FrameworkLevel)), None
            )
            if framework is not None:  # F's records are what it prices
                # F records the ops' shapes in its first measured iteration only: timed both ways
                shapes = framework.set_shapes if framework.shapes_in_first_iteration_only else None
                self._calibration.after(
                    self._context.arena.records_written, framework.sample, shapes
                )
            took(schema.CALIBRATION_PARTS[1])
        self._phase_ns["enabled"] = time.time_ns()
        self._host["measuring"] = host_state()

    def _finish(self, error: str | None, interrupted: bool = False) -> None:
        """Switch levels off, convert what they recorded, export it, write run.json.

        The status is honest about what got lost: ``error`` when the workload failed or nothing
        usable was stored (no model level, conversion or the store failed), ``partial`` when
        something is missing (fewer iterations, a level that failed to stop or drain, a sink
        that failed, records CUPTI dropped or xsp could not decode), ``interrupted`` after a
        Ctrl-C; ``status_reasons`` says why, one line each."""
        self._finish_pending = False
        self._steady = False
        if self.result is not None:
            return
        self._phase_ns["measured"] = time.time_ns()
        self._host["measured"] = host_state()
        losses = Losses()
        if self.continuous:
            self._finish_continuous(error, interrupted, losses)
            return
        stopped = self._stop_levels(losses)
        self._phase_ns["stopped"] = time.time_ns()
        counts: dict[str, Any] = {}
        if self._calibration is not None and self._calibration.result is not None:
            counts["calibration"] = self._calibration.result
        raw = self._drain_levels(stopped, counts, losses)
        self._remove_watch()  # the run is over: no more iterations to find
        counts.update(self._context.provenance.counts())
        self._context.uninstall_provenance()
        losses.missing.extend(capture_losses(counts))
        samples = self._stop_monitor(counts)
        self._phase_ns["drained"] = time.time_ns()
        counts["spans"] = 0
        kept = self._store(raw, samples, counts, losses)
        self._sink.shutdown()
        self._errors.extend(self._sink.errors)
        if sink_losses(self._sink, self._store_sink, losses):
            counts["spans"] = 0
        self.result = self._write_result(error, interrupted, counts, losses)
        if kept is None:
            self._context.discard_arena()  # stored (or nothing to keep): the raw records go

    def _finish_continuous(self, error: str | None, interrupted: bool, losses: Losses) -> None:
        counts: dict[str, Any] = {}
        if self._calibration is not None and self._calibration.result is not None:
            counts["calibration"] = self._calibration.result
        if self._levels_on:
            totals = self._finish_batches(counts, losses)
        else:
            totals = Totals()
            counts.update(totals.counts())
        self._remove_watch()
        counts.update(self._context.provenance.counts())
        self._context.uninstall_provenance()
        samples = self._stop_monitor(counts)
        del samples  # a continuous session's model spans are not summarized (once per run)
        self._phase_ns["stored"] = time.time_ns()
        self._sink.shutdown()
        self._errors.extend(self._sink.errors)
        if sink_losses(self._sink, self._store_sink, losses):
            counts["spans"] = 0
        counts.update(self._service_meta())
        counts.update(self._otlp_sent())
        self.result = self._write_result(error, interrupted, counts, losses, totals.iterations)
        self._context.discard_arena()

    def _otlp_sent(self) -> dict[str, Any]:
        sent = [getattr(s, "spans_sent", None) for s in self._sink.sinks]
        sent = [n for n in sent if n is not None]
        return {"otlp_spans_sent": sum(sent)} if sent else {}

    def _failed_to_stop(self, level: Level, exc: Exception, losses: Losses) -> None:
        message = f"level {level.letter} failed to stop: {exc}"
        self._errors.append(message)
        losses.missing.append(message)
        log.exception("xsp: level %s failed to stop", level.letter)

    def _stop_levels(self, losses: Losses, levels: Sequence[Level] | None = None) -> list[Level]:
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

    def _drain_levels(
        self, stopped: list[Level], counts: dict[str, Any], losses: Losses
    ) -> dict[str, Any]:
        """Each stopped level's records, by letter, and its loss counts into ``counts``. Drains
        run once every level has stopped (see ``xsp.tracer.capture.levels``)."""
        raw: dict[str, Any] = {}
        for level in stopped:
            try:
                raw[level.letter] = level.drain()
            except Exception as exc:
                message = f"level {level.letter} failed to drain: {exc}"
                self._errors.append(message)
                losses.missing.append(message)
                log.exception("xsp: level %s failed to drain", level.letter)
            counts.update(self._level_counts(level))
        return raw

    def _stop_monitor(self, counts: dict[str, Any]) -> MonitorSamples | None:
        """Stop NVML sampling; keep the samples beside the spans and count them."""
        samples = self._monitor.stop() if self._monitor is not None else None
        if samples is not None:
            counts["monitor"] = {
                "samples": len(samples.time_ns),
                "unavailable": samples.unavailable,
                "gpm_unavailable": samples.gpm_unavailable,
            }
            self._write_monitor(samples)
        return samples

    def _store(
        self,
        raw: dict[str, Any],
        samples: MonitorSamples | None,
        counts: dict[str, Any],
        losses: Losses,
    ) -> Path | None:
        """Convert the records and export them (``xsp.tracer.export.finish``). Where conversion
        fails, the capture arena is kept; returns its path then, else None."""
        if raw.get(ROOT_LEVEL) is None:
            losses.fatal.append(f"level {ROOT_LEVEL} recorded nothing: no spans were converted")
            return None
        try:
            stored = store_spans(
                raw,
                self._sink,
                run_id=self.run_id,
                levels=self.levels,
                resource=self.resource,
                run_dir=self.run_dir,
                failures=self._failures,
                monitor=samples,
                rank=self.rank,
                world_size=self.world_size,
            )
        except Exception as exc:
            message = f"conversion failed: {type(exc).__name__}: {exc}"
            kept = self._context.keep_arena()
            if kept is not None:
                message += f" (levels M and F's raw records are kept in {kept})"
            self._errors.append(message)
            losses.fatal.append(message)
            counts["spans"] = 0
            log.exception("xsp: converting the recorded spans failed")
            return kept
        self._phase_ns["converted"] = stored.converted_ns
        counts.update(stored.counts())
        self._errors.extend(stored.errors)
        return None

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
        limit = self._limit
        ended = max(0, (limit if limit is not None else self._index) - self.warmup)
        ended = min(ended, self._index - self.warmup)
        measured = max(0, ended - len(self._failures))
        if stored is not None:  # a batch lost (its conversion failed) is not measured
            measured = max(0, min(measured, stored - len(self._failures)))
        asked = str(self.iterations) if self.iterations else "an unlimited number of"
        if measured == 0 and not interrupted and error is None:
            losses.fatal.append(f"0 of {asked} iterations measured: {self._why_none()}")
        elif self._stopped_at is None and self.iterations and measured < self.iterations:
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
        if interrupted:
            status = "interrupted"
        elif error is not None:
            status = "error"
        elif losses.missing:
            status = "partial"
        else:
            status = "ok"
        reasons = [r for r in [error, *losses.fatal, *losses.missing] if r]
        return self._write_meta(
            status,
            error=error,
            measured=measured,
            status_reasons=list(dict.fromkeys(reasons)),
            **counts,
        )

    def _why_none(self) -> str:
        """Why a run measured no iteration, in words a user can act on."""
        boundary = self.iteration_boundary
        if self._index > 0:
            return (
                f"the program ran {self._index} iteration(s) ({boundary}), "
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

    def _level_counts(self, level: Level) -> dict[str, Any]:
        """A level's own loss counts (CUPTI's dropped and undecodable records), if it has any."""
        counts = getattr(level, "counts", None)
        if counts is None:
            return {}
        try:
            return dict(counts())
        except Exception as exc:
            message = f"level {level.letter} could not count its losses: {exc}"
            self._errors.append(message)
            return {}

    def _write_monitor(self, samples: MonitorSamples) -> None:
        """Keep the raw samples beside the spans: RUN_DIR/<levels>/monitor.parquet."""
        if self.run_dir is None or not samples.time_ns:
            return
        import pyarrow as pa

        from xsp.core.columns import arrow

        columns = {"time_ns": arrow(samples.time_ns, pa.int64())}
        columns.update({k: arrow(v, pa.float64()) for k, v in samples.values.items()})
        try:
            # from_arrays: pa.table(dict) would import pandas (0.4 s) to ask if it is a frame
            table = pa.Table.from_arrays(list(columns.values()), names=list(columns))
            store.write_monitor_samples(self.run_dir, table)
        except OSError as exc:
            self._errors.append(f"cannot write {self.run_dir / store.MONITOR}: {exc}")

    def _write_meta(
        self, status: str, error: str | None = None, measured: int = 0, **extra: Any
    ) -> dict[str, Any]:
        with self._meta_lock:  # a continuous session's exporter writes it too
            return self._write_meta_locked(status, error, measured, **extra)

    def _write_meta_locked(
        self, status: str, error: str | None, measured: int, **extra: Any
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "format": schema.STORE_FORMAT,
            "run_id": self.run_id,
            "measurement_id": self.measurement_id,
            "levels": self.levels,
            "workload": self.workload,
            "resource": dict(self.resource),
            "status": status,
            "error": error,
            "iterations_requested": self.iterations,
            "iterations_measured": measured,
            "iteration_boundary": self.iteration_boundary,
            "warmup": self.warmup,
            **self._warmup.report(),
            **self._interleave_report(),
            **({"levels_on_early": self._levels_early} if self._levels_early else {}),
            "failed_iterations": {str(k): v for k, v in sorted(self._failures.items())},
            "errors": list(self._errors),
            "started_ns": self.started_ns,
            "phases_ns": dict(self._phase_ns),
            "switch_on_ms": dict(self._switch_on_ms),
            **({"host": dict(self._host)} if self._host else {}),
            "finished_ns": time.time_ns() if status != "running" else None,
            "files": [p.name for p in self._store_sink.files] if self._store_sink else [],
            **({"program": dict(self.program)} if self.program is not None else {}),
            **({"rank": self.rank, "world_size": self.world_size} if self.rank is not None else {}),
            **extra,
        }
        if self.run_dir is not None:
            try:
                store.write_json_atomic(self.run_dir / store.RUN_META, meta)
            except OSError as exc:
                log.error("xsp: cannot write %s: %s", self.run_dir / store.RUN_META, exc)
        return meta

    def _interleave_report(self) -> dict[str, Any]:
        if self._interleave is not None:
            return {interleave.RUN_KEY: self._interleave.report()}
        if self._interleave_skipped is not None:
            return {interleave.RUN_KEY: {"skipped": self._interleave_skipped}}
        return {}

    def _resource(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        device_name = self.device
        if self.device.startswith("cuda"):
            device_name = torch.cuda.get_device_name(torch.device(self.device))
        else:
            device_name = platform.processor() or platform.machine()
        resource: dict[str, Any] = {
            schema.RES_SERVICE_NAME: schema.SERVICE_NAME,
            schema.RES_HOST_NAME: socket.gethostname(),
            schema.RES_RUN_ID: self.run_id,
            schema.RES_MEASUREMENT_ID: self.measurement_id,
            schema.RES_WORKLOAD: self.workload,
            schema.RES_LEVELS: self.levels,
            schema.RES_DEVICE: self.device,
            schema.RES_DEVICE_NAME: device_name,
            schema.RES_TORCH_VERSION: torch.__version__,
            schema.RES_CUDA_VERSION: torch.version.cuda or "none",
            schema.RES_PYTHON_VERSION: platform.python_version(),
            schema.RES_XSP_VERSION: _xsp_version(),
            "process.pid": os.getpid(),
            "process.command_line": " ".join(sys.argv)[:500],
        }
        if self.rank is not None:
            resource.update({schema.RES_RANK: self.rank, schema.RES_WORLD_SIZE: self.world_size})
        resource.update(extra)
        return resource


def _drained(records: Any, counts: dict[str, Any]) -> BatchDrain:
    """The drain of a level drained already."""
    return lambda contents: (records, counts)


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


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (the main thread's) while a batch changes hands: they arrive,
    and interrupt the program, once it is whole."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _distributed_world_size() -> int:
    """The size of an initialized torch.distributed job this process belongs to, else 1: a DDP
    script traced without ``rank``/``world_size`` still gets every iteration's collective sizes."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1
