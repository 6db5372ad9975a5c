"""``RUN_DIR/manifest.json`` and the measurement's result: one entry per level-set process, made
from its run.json and how its program ended, and run.json amended where the process could not
say it itself.

Statuses (run.json, the manifest's runs, the manifest): ``ok``; ``partial`` (something is missing:
fewer iterations, a failed sink, records CUPTI dropped); ``error`` (the program failed, or nothing
usable was stored, or the process ended before xsp could store anything); ``interrupted``
(Ctrl-C). Each run says how its program ended (``program``: ``exit_code``, ``exception``,
``signal``), which ``LeveledResult.exit_code`` passes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from xsp.core import schema, store
from xsp.core.errors import EXIT_INTERRUPTED, StoreError
from xsp.core.levelset import LevelSet
from xsp.core.store import Manifest, ManifestRun, ProgramEnd, RunMeta, SkippedLevels, Status
from xsp.tracer.run import m_processes
from xsp.tracer.run.placement import Hosts
from xsp.tracer.run.plan import LeveledSpec, RunPlan
from xsp.tracer.run.process import LevelProcess
from xsp.tracer.run.protocol import describe_end

log = logging.getLogger(__name__)

#: the keys a process's entry takes from its run.json: each said, null where the run has none
_FROM_RUN = ("status", "error", "iterations_measured", "spans")


@dataclass
class LeveledResult:
    """What a leveled measurement did: its manifest's runs, whether it was interrupted, and the
    level sets it left out."""

    out: Path
    measurement_id: str
    runs: tuple[ManifestRun, ...]
    interrupted: bool = False
    #: level sets left out, one line each (the hardware-counter level without a counter tool)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r.status == Status.OK for r in self.runs)

    @property
    def status(self) -> Status:
        """ok, partial, error or interrupted: the measurement's, as the manifest records it."""
        if self.interrupted:
            return Status.INTERRUPTED
        if self.ok:
            return Status.OK
        failed = any(r.status == Status.ERROR for r in self.runs)
        return Status.ERROR if failed else Status.PARTIAL

    @property
    def stored(self) -> bool:
        """Whether any level set stored a run (one that measured nothing is removed)."""
        return any(r.stored is not False for r in self.runs)

    @property
    def failure(self) -> str | None:
        for run in self.runs:
            if run.status != Status.OK:
                reasons = run.status_reasons or ()
                why = run.error or (reasons[0] if reasons else None) or run.status
                return f"level set {run.levels}: {run.status}: {why}"
        if self.interrupted:
            return "interrupted"
        return None

    @property
    def exit_code(self) -> int:
        """What ``xsp run`` exits with: 0 when every level set is ok, 130 when interrupted, the
        program's own code when it exited nonzero, 128+N when signal N ended it, else 1."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        for run in self.runs:
            if run.status == Status.OK:
                continue
            program = run.program or ProgramEnd()
            if run.status == Status.INTERRUPTED or program.get("interrupted"):
                return EXIT_INTERRUPTED  # the script's own KeyboardInterrupt too
            number = program.get("signal")
            if isinstance(number, int):
                return 128 + number
            code = program.get("exit_code")
            if isinstance(code, int) and 0 < code < 256:
                return code
            return 1
        return 0


def new_manifest(run_plan: RunPlan, measurement_id: str) -> Manifest:
    """The manifest of a measurement that has just started: its spec, its level sets, no run."""
    spec = run_plan.spec
    workload = spec.profile.workload
    skipped = [SkippedLevels(levels=k, reason=v) for k, v in run_plan.skipped.items()]
    return Manifest(
        format=schema.STORE_FORMAT,
        measurement_id=measurement_id,
        created_ns=time.time_ns(),
        workload=workload,
        spec=spec.record(),
        # where a command's relative paths resolve: `xsp verify` re-runs the workload from here
        cwd=os.getcwd(),
        level_sets=tuple(run_plan.level_sets),
        runs=(),
        status=Status.RUNNING,
        skipped=tuple(skipped) or None,
        nulls=frozenset() if workload is not None else frozenset({"workload"}),
    )


def list_entry(
    manifest: Manifest,
    entry: ManifestRun,
    hosts: Hosts,
    slots: list[LevelSet],
    i: int,
    level_sets: int,
) -> Manifest:
    """The manifest with slot ``i``'s entry: a level set's under ``runs`` (naming the level
    set in whose process it ran, ``in_process_of``, where it did not run in its own), a further
    M process's under ``m_processes`` with its number and its directory."""
    if i < level_sets:
        if not hosts[i]:
            entry = dataclasses.replace(entry, in_process_of=str(slots[i - 1]))
        return dataclasses.replace(manifest, runs=(*(manifest.runs or ()), entry))
    n = i - level_sets + 2
    listed = dataclasses.replace(entry, process=n, path=f"{m_processes.DIRECTORY}/{n}")
    return dataclasses.replace(manifest, m_processes=(*(manifest.m_processes or ()), listed))


def only_manifest(out: Path) -> bool:
    return all(p.name == store.MANIFEST for p in out.iterdir())


def drop_empty(spec: LeveledSpec, entry: ManifestRun) -> ManifestRun:
    """Remove the directory of a level-set run that measured nothing and stored no span: its
    manifest entry keeps why (``stored``: false), and readers skip it."""
    empty = entry.status == Status.ERROR and not entry.iterations_measured
    if empty and not entry.spans and not entry.timed_out:
        shutil.rmtree(spec.out / str(entry.levels), ignore_errors=True)
        return dataclasses.replace(entry, stored=False)
    return entry


def process_entry(
    spec: LeveledSpec, process: LevelProcess, returncode: int, timed_out: bool
) -> ManifestRun:
    """A finished level-set process's manifest entry: its run.json's status and counts, and how
    its program ended; a process that ended before storing its run is an error that says how."""
    levels = process.levels
    if process.last_stage:
        process.reader.join(timeout=5)
    ended_ns = time.time_ns()
    meta: RunMeta | None = None
    with contextlib.suppress(StoreError):
        meta = store.open_run(spec.out / levels).document
    program = program_end(returncode, meta.program if meta is not None else None)
    entry = ManifestRun(levels=levels, returncode=returncode, program=program)
    if meta is not None and meta.status == Status.RUNNING and not timed_out:
        from xsp.tracer.run.recover import recover_run  # conversion: only for a dead process

        meta = recover_run(spec.out / levels, describe_end(program)) or meta
    if meta is not None:
        entry = dataclasses.replace(
            entry,
            status=meta.status,
            error=meta.error,
            status_reasons=tuple(meta.status_reasons or ()),
            iterations_measured=meta.iterations_measured,
            spans=meta.spans,
            seconds=phase_seconds(meta, process.spawned_ns, ended_ns),
            cupti=meta.cupti,
            nulls=frozenset(key for key in _FROM_RUN if getattr(meta, key) is None),
        )
    entry = _say_how_it_ended(spec, entry, meta, program, timed_out)
    if (
        meta is not None
        and meta.partial_for_the_programs_profiler
        and entry.status == Status.PARTIAL
    ):
        # the runner runs the level sets after it all the same
        entry = dataclasses.replace(entry, goes_on=True)
    return entry


def _say_how_it_ended(
    spec: LeveledSpec,
    entry: ManifestRun,
    meta: RunMeta | None,
    program: ProgramEnd,
    timed_out: bool,
) -> ManifestRun:
    """The entry's status and error where the process's run.json does not tell the whole story:
    killed past its time limit, recovered from its arena, or ended before xsp stored its run."""
    if timed_out:
        return dataclasses.replace(
            entry,
            status=Status.ERROR,
            timed_out=True,
            error=f"timed out after {spec.timeout_s:.0f} s; killed",
        )
    if meta is not None and meta.recovered:
        return dataclasses.replace(entry, error=f"the program {describe_end(program)}")
    if meta is None or meta.status == Status.RUNNING:
        what = "before writing its store" if meta is None else "before xsp stored its spans"
        error = f"the program {describe_end(program)} {what}"
        return dataclasses.replace(entry, status=Status.ERROR, error=error)
    if entry.returncode != 0 and entry.status == Status.OK:
        error = f"the run process {describe_end(program)}"
        return dataclasses.replace(entry, status=Status.ERROR, error=error)
    return entry


def program_end(returncode: int, recorded: ProgramEnd | None = None) -> ProgramEnd:
    """How a level-set process's program ended: what its run.json recorded (``exit_code``,
    ``exception``, ``interrupted``), or the exit code, or the signal that killed it."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return ProgramEnd(signal=number, signal_name=name)
    if isinstance(recorded, dict) and recorded:
        return recorded.copy()
    return ProgramEnd(exit_code=returncode)


def amend_run(spec: LeveledSpec, levels: str, entry: ManifestRun) -> ManifestRun:
    """Make run.json agree with the manifest entry when the process could not say it itself
    (it was killed, timed out, interrupted, or exited before xsp stored its spans); the entry
    with run.json's reasons."""
    path = spec.out / levels / store.RUN_META
    try:
        meta = store.read_run_meta(path)
    except StoreError:
        return entry  # it never wrote one; the manifest says why
    if meta.status == entry.status and meta.program == entry.program:
        return entry
    reasons = list(meta.status_reasons or [])
    if entry.error and not any(r.startswith(entry.error) for r in reasons):
        reasons.insert(0, entry.error)  # unless a reason says it already, and more
    meta = dataclasses.replace(
        meta,
        status=entry.status,
        error=entry.error or meta.error,
        nulls=meta.nulls | {"error"},  # said even when there is none, as a session does
        program=entry.program,
        status_reasons=tuple(reasons),
        finished_ns=meta.finished_ns or time.time_ns(),
        timed_out=True if entry.timed_out else meta.timed_out,
    )
    try:
        store.write_run_meta(path, meta)
    except OSError as exc:
        log.error("xsp: cannot update %s: %s", path, exc)
    return dataclasses.replace(entry, status_reasons=tuple(reasons))


def phase_seconds(meta: RunMeta, spawned_ns: int, ended_ns: int) -> dict[str, float]:
    """Where a level-set process spent its time: start-up (interpreter, imports, workload build),
    the warm-up iterations before the levels came on, F's calibration probes and switching the
    levels on (CUPTI's start), the traced iterations (the last warm-up one and the measured
    ones), switching the levels off (CUPTI's flush), draining them (records decoded, the monitor
    stopped), conversion to spans, storage (the sinks, run.json), and exit; a process started
    ahead of its turn also waited for the one before to exit (and one started beside others, for
    them to warm up). A phase whose mark is missing
    folds into the next."""
    phases = meta.phases_ns or {}
    ready = phases.get("ready")  # a process started ahead of its turn waited from here
    marks = [
        ("start_up", meta.started_ns),
        ("untraced_warm_up", ready or phases.get("levels_on")),
        ("waiting_for_previous", phases.get("levels_on") if ready else None),
        ("switch_on", phases.get("enabled")),
        ("traced_iterations", phases.get("measured")),
        ("stop", phases.get("stopped")),
        ("drain", phases.get("drained")),
        ("convert", phases.get("converted")),
        ("store", meta.finished_ns),
        ("exit", ended_ns),
    ]
    seconds: dict[str, float] = {}
    previous = spawned_ns
    for name, mark in marks:
        if isinstance(mark, int):
            seconds[name] = round((mark - previous) / 1e9, 3)
            previous = mark
    # F's calibration probes (most of a switch-on: 1.1-1.7 s of an MFLG process's on the H200,
    # where each level's start took 0.1-4 ms) are a phase of their own
    parts = meta.switch_on_ms or {}
    calibration = sum(parts.get(name, 0.0) for name in schema.CALIBRATION_PARTS) / 1e3
    if calibration > 0 and "switch_on" in seconds:
        seconds["calibration"] = round(min(calibration, seconds["switch_on"]), 3)
        seconds["switch_on"] = round(seconds["switch_on"] - seconds["calibration"], 3)
    seconds["total"] = round((ended_ns - spawned_ns) / 1e9, 3)
    return seconds


__all__ = [
    "LeveledResult",
    "amend_run",
    "drop_empty",
    "list_entry",
    "new_manifest",
    "only_manifest",
    "phase_seconds",
    "process_entry",
    "program_end",
]
