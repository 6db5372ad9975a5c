"""The leveled runner: the same workload once per level set, each in a fresh process.

``run_leveled`` takes a checked plan (``xsp.tracer.run.plan``; a spec is checked into one
first), then for each level set starts ``python -m xsp.tracer.run.child`` with a pipe for
progress (``xsp.tracer.run.process``), waits for it, and records the run in
``RUN_DIR/manifest.json`` (``xsp.tracer.run.manifest``). A failing level-set run stops the
measurement; what it recorded stays in the store. The one exception to a process each: a zoo
model's MF runs in M's process once M has stored its run (``xsp.tracer.run.placement``).
Processes started ahead of their turn wait at gates (``xsp.tracer.run.gates``); Ctrl-C puts
the measurement away as an interrupted one (``xsp.tracer.run.interrupt``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import signal
import time
import uuid
from collections.abc import Callable

from xsp.core import store
from xsp.core.store import ManifestRun, Status
from xsp.tracer.run import gates, interrupt, m_processes
from xsp.tracer.run.environment import COMPILE_CACHE_ENV, later, own_compile_cache
from xsp.tracer.run.gates import Handoff, cancel, end_later_stages, failed_while_ahead, stop_ahead
from xsp.tracer.run.manifest import (
    LeveledResult,
    amend_run,
    drop_empty,
    list_entry,
    new_manifest,
    only_manifest,
    process_entry,
)
from xsp.tracer.run.placement import further_m_processes, process_hosts, warms_up_side_by_side
from xsp.tracer.run.plan import LeveledSpec, RunPlan, check_arguments, plan, validate
from xsp.tracer.run.process import LevelProcess, ProgressFn, launch

log = logging.getLogger(__name__)


def run_leveled(
    spec: LeveledSpec | RunPlan,
    progress: ProgressFn | None = None,
    after: Callable[[], None] | None = None,
    on_measured: Callable[[], None] | None = None,
) -> LeveledResult:
    """Run every level set of ``spec`` (a plan, trusted as it is; a spec is checked into one
    first). ``after`` blocks until the GPU is free for measuring (a campaign's job before on
    the same GPU has ended): the first process starts at once but switches its levels on only
    after it returns. ``on_measured`` is called once the last level set has measured (the next
    job may start then)."""
    run_plan = spec if isinstance(spec, RunPlan) else plan(spec)
    for reason in run_plan.skipped.values():
        log.warning("xsp: %s", reason)
    return _Measurement(run_plan, progress, on_measured).run(after)


class _Measurement:
    """One leveled measurement while it runs. Its slots are the level sets, then M again in
    further processes (``xsp.tracer.run.m_processes``): each slot has its levels, its spec
    (where it writes), its progress label, the level sets its process runs (``hosts``) and the
    handoff of the next slot's process, when that one starts ahead of its turn."""

    def __init__(
        self,
        run_plan: RunPlan,
        progress: ProgressFn | None,
        on_measured: Callable[[], None] | None,
    ) -> None:
        self.plan = run_plan
        self.spec = run_plan.spec
        self.level_sets = list(run_plan.level_sets)
        self.progress = progress
        self.on_measured = on_measured
        self.measurement_id = uuid.uuid4().hex
        self.manifest = new_manifest(run_plan, self.measurement_id)
        self.result = LeveledResult(
            self.spec.out, self.measurement_id, (), skipped=list(run_plan.skipped.values())
        )
        self.fresh = False  # whether ``out`` held nothing before
        self.compile_cache: str | None = None
        self.processes: dict[int, LevelProcess] = {}
        # where it stands, for an interrupt: the slot whose turn it is, and its process
        self.turn = 0
        self.running: LevelProcess | None = None

    def run(self, after: Callable[[], None] | None) -> LeveledResult:
        self._begin()
        restore = interrupt.terminate_as_interrupt() if self.spec.profile.continuous else None
        try:
            self._run_slots(after)
        except KeyboardInterrupt:
            self._put_away_interrupted()
        finally:
            if restore is not None:
                restore()
            if self.compile_cache is not None:  # every level-set process has ended
                shutil.rmtree(self.compile_cache, ignore_errors=True)
        return self._finish()

    def _begin(self) -> None:
        """Write the first manifest, make the measurement's own inductor cache, lay out the
        slots."""
        spec = self.spec
        self.fresh = not spec.out.exists() or not any(spec.out.iterdir())
        self._write_manifest()
        self.compile_cache = own_compile_cache(spec)
        if self.compile_cache is not None:  # after the manifest's spec: a re-run makes its own
            env = {**spec.env, COMPILE_CACHE_ENV: self.compile_cache}
            self.spec = spec = dataclasses.replace(spec, env=env)
        again = further_m_processes(spec, self.level_sets)
        self.slots = [*self.level_sets, *(m_processes.MODEL_ONLY for _ in again)]
        self.slot_spec = [spec] * len(self.level_sets) + again
        self.slot_progress = [self.progress] * len(self.level_sets) + [
            m_processes.labelled(self.progress, m_processes.label(n))
            for n in range(2, len(again) + 2)
        ]
        self.handoffs = [Handoff() for _ in self.slots]
        self.hosts = process_hosts(spec, self.level_sets)
        self.hosts += [(m_processes.MODEL_ONLY,) for _ in again]

    def _run_slots(self, after: Callable[[], None] | None) -> None:
        side_by_side = warms_up_side_by_side(self.spec, self.hosts)
        self.running = self._launch(0, gated=after is not None or bool(side_by_side))
        for j in side_by_side:
            self.handoffs[j - 1].offer(functools.partial(self._launch, j, gated=True))
        if after is not None:
            after()
        if self.running.gate is not None:
            self.running = self._open_in_turn(self.running, 0)
        for i in range(len(self.slots)):
            self.turn = i
            if self.running is None:  # never: each turn starts the next or breaks
                break
            if not self._take_turn(i, self.running):
                break

    def _take_turn(self, i: int, process: LevelProcess) -> bool:
        """Wait for slot ``i``'s process and list its run; start (or let through) the next
        slot's. False when the measurement stops here (a level set failed)."""
        entry = self._complete_slot(i, process)
        self.running = None
        self._list(entry, i)
        self._write_manifest()
        following = self.handoffs[i].take()
        if entry.status != Status.OK and not entry.goes_on and i < len(self.level_sets):
            for ahead in [following, *(h.take() for h in self.handoffs[i + 1 :])]:
                if ahead is not None:
                    cancel(self.spec, ahead)
            end_later_stages(self.spec, self.processes[i])
            return False
        if i + 1 < len(self.slots):  # a further M process that failed: the next still runs
            if following is None:
                self.running = self._launch(i + 1, False)
            else:
                self.running = self._open_in_turn(following, i + 1)
        return True

    def _list(self, entry: ManifestRun, i: int) -> None:
        """List slot ``i``'s entry in the manifest; the result's runs are the manifest's."""
        listed = list_entry(self.manifest, entry, self.hosts, self.slots, i, len(self.level_sets))
        self.manifest = listed
        self.result.runs = listed.runs or ()

    def _write_manifest(self) -> None:
        store.write_manifest(self.spec.out / store.MANIFEST, self.manifest)

    def _complete_slot(self, i: int, process: LevelProcess) -> ManifestRun:
        """Slot ``i``'s manifest entry, once its process has ended; a level set that failed
        beside the one before it runs once more on its own."""
        spec, progress = self.slot_spec[i], self.slot_progress[i]
        entry = drop_empty(spec, _complete(spec, process, progress))
        if not failed_while_ahead(process, entry):
            return entry
        log.warning(
            "xsp: %s failed while it shared the machine with the level set before it "
            "(%s); running it again on its own",
            self.slots[i],
            entry.error,
        )
        first_error = entry.error
        shutil.rmtree(spec.out / self.slots[i], ignore_errors=True)
        for handoff in self.handoffs[i:]:  # on its own: those warmed up beside it start later
            stop_ahead(self.spec, handoff)
        self.running = process = self._launch(i, gated=False)
        entry = drop_empty(spec, _complete(spec, process, progress))
        return dataclasses.replace(entry, failed_ahead=first_error)  # the first attempt's error

    def _launch(self, i: int, gated: bool) -> LevelProcess:
        """Start slot ``i``'s process, or its stage in the process of the slot before it."""
        hosts = self.hosts[i]
        if not hosts:  # it runs next in the process of the level set before it
            process = self.processes[i - 1].next_stage(self.slots[i])
            if self.progress:
                self.progress(self.slots[i], "start", 0, self.spec.profile.iterations)
        else:
            last = i + len(hosts) - 1
            measured = [None] * (len(hosts) - 1) + [self._measured_after(last)]
            spec = later(self.slot_spec[i], i)
            progress = self.slot_progress[i]
            process = launch(spec, hosts, self.measurement_id, progress, gated, measured)
        self.processes[i] = process
        return process

    def _measured_after(self, i: int) -> Callable[[], None] | None:
        """What to do once slot ``i`` has measured: start the next slot's process ahead of its
        turn, or let the caller's next job start after the last."""
        if i + 1 == len(self.slots):
            return self.on_measured  # the caller's: the next job may start
        if self.spec.overlap and not self.slots[i + 1].counters:
            return lambda: self.handoffs[i].offer(lambda: self._launch(i + 1, gated=True))
        return None

    def _open_in_turn(self, process: LevelProcess, i: int) -> LevelProcess:
        # handoffs[k] holds slot k + 1's process: those after slot i
        return gates.open_in_turn(self.spec, process, self.slots[i], self.handoffs[i:])

    def _put_away_interrupted(self) -> None:
        """Ctrl-C: cancel the processes started ahead, interrupt the one measuring and list
        what it stored."""
        i, process = self.turn, self.running
        self.result.interrupted = True
        with interrupt.sigint_ignored():
            for ahead in (h.take() for h in self.handoffs[i:]):
                if ahead is not None and ahead is not process:
                    ahead.signal(signal.SIGINT)
                    cancel(self.spec, ahead)
            if process is not None:
                entry = interrupt.interrupt(self.slot_spec[i], process, self.slot_progress[i])
                self._list(entry, i)
        self.manifest = dataclasses.replace(self.manifest, interrupted_ns=time.time_ns())

    def _finish(self) -> LeveledResult:
        spec, result = self.spec, self.result
        # finished_ns with created_ns: the whole, as `xsp summary` says
        self.manifest = dataclasses.replace(
            self.manifest, status=result.status, finished_ns=time.time_ns()
        )
        if self.fresh and result.runs and not result.stored and only_manifest(spec.out):
            shutil.rmtree(spec.out, ignore_errors=True)  # nothing measured: no empty measurement
        else:  # a campaign's stderr logs stay, with the manifest that says why
            self._write_manifest()
        return result


def _complete(spec: LeveledSpec, process: LevelProcess, progress: ProgressFn | None) -> ManifestRun:
    """Wait for a level-set process (within the time limit, counted from when it could start
    measuring) and make its manifest entry."""
    limit = None
    if spec.timeout_s is not None:
        waited = (time.time_ns() - (process.opened_ns or process.spawned_ns)) / 1e9
        limit = max(0.0, spec.timeout_s - waited)
    returncode, timed_out = interrupt.wait(process, limit)
    entry = process_entry(spec, process, returncode, timed_out)
    entry = amend_run(spec, process.levels, entry)
    if process.ncu is not None:
        from xsp.tracer.run import ncu

        if progress:
            progress(process.levels, "importing counters", 0, spec.profile.iterations)
        entry = ncu.finish(spec.out / process.levels, entry, process.ncu)
    if process.on_exit is not None:
        process.on_exit()
    if progress:
        progress(process.levels, "end", returncode, spec.profile.iterations)
    return entry


# LeveledSpec, the checks and the result are re-exported: `xsp run` and campaigns import them here
__all__ = [
    "LeveledResult",
    "LeveledSpec",
    "RunPlan",
    "check_arguments",
    "plan",
    "run_leveled",
    "validate",
]
