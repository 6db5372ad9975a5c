"""The leveled runner: the same workload once per level set, each in a fresh process.

``run_leveled`` validates everything it can up front (level sets, model name, device, output
directory), then for each level set starts ``python -m xsp.tracer.run.child`` with a pipe for progress,
waits for it, and records the run in ``RUN_DIR/manifest.json``. A failing level-set run stops the
measurement; what it recorded stays in the store. The one exception to a process each: a zoo
model's MF runs in M's process once M has stored its run (``shares_process``).

Statuses (run.json, the manifest's runs, the manifest): ``ok``; ``partial`` (something is missing:
fewer iterations, a failed sink, records CUPTI dropped); ``error`` (the program failed, or nothing
usable was stored, or the process ended before xsp could store anything); ``interrupted``
(Ctrl-C). Each run says how its program ended (``program``: ``exit_code``, ``exception``,
``signal``), which ``LeveledResult.exit_code`` passes on.

Ctrl-C (SIGINT to the runner alone or to its whole process group) stops the measurement: the
level-set process running is passed the SIGINT and given ``INTERRUPT_GRACE_S`` to store what it
recorded (a second Ctrl-C cuts that short), then killed; one started ahead of its turn is
cancelled; the manifest lists what finished and says ``interrupted``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from xsp.core import schema, store
from xsp.core.errors import ConfigError, StoreError
from xsp.core.levelset import LevelSet, level_sets
from xsp.tracer.run import m_processes
from xsp.tracer.run.protocol import READY, STORED, ChildSpec, check_program, describe_end
from xsp.tracer.spec import ProfileSpec, RunSpec

log = logging.getLogger(__name__)

PYTHON_NAMES = ("python", "python3")
#: Interpreter options that change nothing xsp measures (stdio buffering, bytecode caching)
PYTHON_FLAGS_IGNORED = ("-u", "-B")
#: torch's launcher script: ``python -m torch.distributed.run``.
TORCHRUN = "torchrun"

#: Forced into every process the runner starts, whatever the caller's environment or a spec's
#: own says: NVLink multicast (NVLS) in NCCL, PyTorch's symmetric memory and NVSHMEM can put a
#: shared host's GPUs out of service for everyone, so xsp never lets a traced job switch it on.
SHARED_HOST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

#: Inductor's cache directory. A leveled measurement gets one of its own, unless the caller's
#: environment names one: its first level set compiles a torch.compile'd program and saves it
#: there with its kernels' provenance, the others load it (``xsp.tracer.capture.inductor``).
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Inductor starts its compile workers (a process per core, each importing torch) whenever a
#: program compiles or loads a compiled graph, since loading its Triton kernels goes through
#: them too, and the process's exit waits for them: 6-13 s after a warm-cache ResNet-18's loop on
#: the H200, against 3.2-3.5 s after a cold one that used them. A level set after the first
#: loads what the first compiled, so there inductor compiles in the process itself (torch's own
#: setting; the user's wins).
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"

#: (level set, phase, done, total) -> None; phase is "start", "warmup", "measure" or "end".
ProgressFn = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class LeveledSpec:
    """A leveled measurement: ``profile`` (what to run and how) once per level set, into
    ``out``. Level sets given as text are parsed here (ConfigError naming a bad one)."""

    out: Path
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    level_sets: tuple[LevelSet, ...] = (LevelSet("M"), LevelSet("MF"))
    # For campaigns: extra environment for the level-set processes (CUDA_VISIBLE_DEVICES), a
    # time limit per level set, and the processes' stderr kept in OUT/<levels>.stderr.log.
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    log_stderr: bool = False
    # Zoo workloads: fork level-set processes from a server that imported torch once (xsp run
    # and campaigns, unless XSP_FORK_SERVER=0).
    fork_server: bool = False
    # Start each level set's process as soon as the one before has measured, so that its
    # start-up and untraced warm-up overlap the other's flush, conversion and exit; it switches
    # its levels on only once the one before has exited, so no measurement overlaps another
    # process's work. A zoo model on a GPU starts all its processes at once instead: they warm
    # up side by side, and each measures once the one before has exited and the ones after it
    # wait at their gates (``warms_up_side_by_side``).
    overlap: bool = False
    # Zoo workloads: a level set of M and F alone runs in the process of the one before it when
    # it only adds levels to it (M, then MF): one CUDA start-up and first iteration, not two
    # (``shares_process``; xsp run and campaigns, unless XSP_SHARE_PROCESS=0).
    share_process: bool = False
    # The level set that prices F's cost runs an untraced iteration before each traced one
    # (``xsp.tracer.capture.interleave``), where its levels allow it.
    interleave: bool = True
    # M is timed in this many processes (``xsp.tracer.run.m_processes``): the first is the
    # measurement's own M level set, the others measure after the last level set.
    m_processes: int = 1

    def __post_init__(self) -> None:
        try:
            parsed = level_sets(self.level_sets)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        object.__setattr__(self, "level_sets", parsed)
        if self.m_processes < 1:
            raise ConfigError(f"bad --m-processes {self.m_processes}: must be at least 1")

    def record(self) -> dict[str, Any]:
        """The spec as the manifest keeps it: one flat record of JSON values."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "profile"}
        flat = {**own, **asdict(self.profile)}
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in flat.items()}


@dataclass
class LeveledResult:
    out: Path
    measurement_id: str
    runs: list[dict[str, Any]]
    interrupted: bool = False
    #: level sets left out, one line each (the hardware-counter level without a counter tool)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r["status"] == "ok" for r in self.runs)

    @property
    def status(self) -> str:
        """ok, partial, error or interrupted: the measurement's, as the manifest records it."""
        if self.interrupted:
            return "interrupted"
        if self.ok:
            return "ok"
        return "error" if any(r["status"] == "error" for r in self.runs) else "partial"

    @property
    def stored(self) -> bool:
        """Whether any level set stored a run (one that measured nothing is removed)."""
        return any(r.get("stored", True) for r in self.runs)

    @property
    def failure(self) -> str | None:
        for run in self.runs:
            if run["status"] != "ok":
                reasons = run.get("status_reasons") or []
                why = run.get("error") or (reasons[0] if reasons else None) or run["status"]
                return f"level set {run['levels']}: {run['status']}: {why}"
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
            if run["status"] == "ok":
                continue
            program = run.get("program") or {}
            if run["status"] == "interrupted" or program.get("interrupted"):
                return EXIT_INTERRUPTED  # the script's own KeyboardInterrupt too
            if isinstance(program.get("signal"), int):
                return 128 + int(program["signal"])
            code = program.get("exit_code")
            if isinstance(code, int) and 0 < code < 256:
                return code
            return 1
        return 0


#: How long an interrupted level-set process gets to store what it recorded before it is
#: killed (a CUPTI flush of a large MFLG run takes tens of seconds; measured 24 s on the H200).
INTERRUPT_GRACE_S = 60.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def script_command(command: Sequence[str]) -> list[str]:
    """Strip the interpreter from ``python script.py ...`` / ``python -m mod ...``: the child
    runs the script in-process with xsp's own interpreter. ``torchrun ...`` is the launcher's
    module, ``-m torch.distributed.run ...``, run the same way (its workers trace their ranks)."""
    if not command:
        raise ConfigError("no command after --: give e.g. `-- python train.py`")
    head = Path(command[0]).name
    if head == TORCHRUN:
        return ["-m", "torch.distributed.run", *command[1:]]
    if not (head.startswith(PYTHON_NAMES) or command[0] == sys.executable):
        raise ConfigError(
            f"cannot trace {command[0]!r}: xsp run -- expects a Python command "
            "(python script.py ..., python -m module ... or torchrun ...)"
        )
    rest = list(command[1:])
    while rest and rest[0] in PYTHON_FLAGS_IGNORED:
        rest.pop(0)
    if rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        raise ConfigError(
            f"cannot trace python {rest[0]}: xsp runs the script in its own interpreter, "
            f"which takes {', '.join(PYTHON_FLAGS_IGNORED)}, -m MODULE and -c CODE only"
        )
    if not rest:
        raise ConfigError("no script after python: give e.g. `-- python train.py`")
    return rest


def check_arguments(spec: LeveledSpec) -> list[LevelSet]:
    """Check what can be checked without importing torch (a second at least; seconds with
    torchvision, timm and transformers): the numbers, the workload (a zoo name from the
    catalogue of names, a command's program), the XSP_* settings, the level sets against a
    device given by name, and the output directory; return the level sets that will run.
    ``xsp run`` calls it before anything else, so a bad argument is refused at once."""
    profile = spec.profile
    if profile.warmup < 0:
        raise ConfigError(f"bad --warmup {profile.warmup}: must be 0 or more")
    if (profile.model is None) == (not profile.command):
        raise ConfigError("give either --model NAME or a Python command after --")
    if profile.iteration_fn is not None:
        if profile.model is not None:
            raise ConfigError("--iteration-fn names a function of a Python command, not of --model")
        from xsp.tracer.capture.iterations import check_name

        check_name(profile.iteration_fn)
    if profile.model is not None:
        from xsp.tracer.workloads import names

        names.find(profile.model)
        if profile.mode not in names.MODES:
            raise ConfigError(f"bad --mode {profile.mode!r}: use train or infer")
        if profile.batch_size < 1:
            raise ConfigError(f"bad --batch-size {profile.batch_size}: must be at least 1")
    else:
        command = script_command(profile.command)
        from xsp.tracer.run import launcher

        if launcher.is_launcher(command):
            launcher.worker_arguments(command)  # a launcher xsp cannot trace is refused here
            if profile.continuous:
                raise ConfigError(
                    "a continuous session (--iterations 0 or --duration) traces one process, "
                    "not a multi-rank job"
                )
        else:
            check_program(command)
    from xsp.core import config
    from xsp.tracer.capture.levels import check_levels

    config.check({**os.environ, **spec.env})  # bad XSP_* values: refused before anything runs
    skipped = counter_skips(spec.level_sets)
    level_sets = [levels for levels in spec.level_sets if levels not in skipped]
    if not level_sets:
        raise ConfigError(f"nothing to run: {'; '.join(skipped.values())}")
    if profile.counter_iterations < 1:
        raise ConfigError(f"bad counter iterations {profile.counter_iterations}: at least 1")
    if profile.device is not None:  # one by name; None is chosen with torch (validate)
        if profile.device != "cpu" and not profile.device.startswith("cuda"):
            raise ConfigError(f"bad device {profile.device!r}: use cpu or cuda[:N]")
        for levels in level_sets:
            check_levels(levels, profile.device)
    if profile.continuous:
        _check_service(profile, level_sets)
    store.check_creatable(spec.out)  # made only once validate's device checks pass
    return level_sets


def validate(spec: LeveledSpec) -> list[LevelSet]:
    """Check the spec before anything runs; return the level sets that will run."""
    from xsp.core.devices import resolve_device
    from xsp.tracer.capture.levels import check_levels

    level_sets = check_arguments(spec)
    device = resolve_device(spec.profile.device)  # a missing GPU is named
    for levels in level_sets:
        check_levels(levels, device)
    if spec.profile.continuous:
        _check_service(spec.profile, level_sets)
    store.check_writable(spec.out)
    return level_sets


def _check_service(profile: ProfileSpec, level_sets: list[LevelSet]) -> None:
    """A continuous measurement's level sets: each must be able to run without an end, and
    without one only a single level set can run (the next would never start)."""
    if profile.iterations == 0 and profile.duration_s is None and len(level_sets) > 1:
        raise ConfigError(
            f"--iterations 0 without --duration measures until the program is stopped: give "
            f"one level set (--levels {level_sets[-1]}), one xsp run each serving the same "
            "load, or a --duration (docs/serving.md)"
        )
    for levels in level_sets:
        if levels.counters:
            raise ConfigError(
                f"level set {levels} cannot run in a continuous session (Nsight Compute "
                "replays each kernel in a run of its own): leave level H out for a service"
            )


def counter_skips(level_sets: Sequence[LevelSet]) -> dict[LevelSet, str]:
    """The hardware-counter level sets that cannot run here, with the one-line reason (no
    counter tool): they are left out, and every other level set runs."""
    if not any(levels.counters for levels in level_sets):
        return {}
    from xsp.tracer.run import ncu

    reason = ncu.unavailable()
    if reason is None:
        return {}
    return {
        levels: f"level set {levels} skipped: {reason}" for levels in level_sets if levels.counters
    }


def run_leveled(
    spec: LeveledSpec,
    progress: ProgressFn | None = None,
    after: Callable[[], None] | None = None,
    on_measured: Callable[[], None] | None = None,
) -> LeveledResult:
    """Run every level set of ``spec``. ``after`` blocks until the GPU is free for measuring
    (a campaign's job before on the same GPU has ended): the first process starts at once but
    switches its levels on only after it returns. ``on_measured`` is called once the last level
    set has measured (the next job may start then)."""
    skipped = counter_skips(spec.level_sets)
    level_sets = validate(spec)
    for reason in skipped.values():
        log.warning("xsp: %s", reason)
    measurement_id = uuid.uuid4().hex
    manifest: dict[str, Any] = {
        "format": schema.STORE_FORMAT,
        "measurement_id": measurement_id,
        "created_ns": time.time_ns(),
        "workload": spec.profile.workload,
        "spec": spec.record(),
        # where a command's relative paths resolve: `xsp verify` re-runs the workload from here
        "cwd": os.getcwd(),
        "level_sets": level_sets,
        "runs": [],
        "status": "running",
    }
    if skipped:
        manifest["skipped"] = [{"levels": k, "reason": v} for k, v in skipped.items()]
    fresh = not spec.out.exists() or not any(spec.out.iterdir())
    store.write_json_atomic(spec.out / store.MANIFEST, manifest)
    compile_cache = _own_compile_cache(spec)
    if compile_cache is not None:  # after the manifest's spec: a re-run makes its own
        spec = dataclasses.replace(spec, env={**spec.env, COMPILE_CACHE_ENV: compile_cache})
    result = LeveledResult(spec.out, measurement_id, manifest["runs"])
    result.skipped = list(skipped.values())
    # the level sets, then M again in further processes: each slot its levels, its spec (where
    # it writes) and its progress label (``xsp.tracer.run.m_processes``)
    again = _further_m_processes(spec, level_sets)
    slots = [*level_sets, *(m_processes.MODEL_ONLY for _ in again)]
    slot_spec = [spec] * len(level_sets) + again
    slot_progress = [progress] * len(level_sets) + [
        m_processes.labelled(progress, m_processes.label(n)) for n in range(2, len(again) + 2)
    ]
    handoffs = [_Handoff() for _ in slots]
    hosts = process_hosts(spec, level_sets) + [(m_processes.MODEL_ONLY,) for _ in again]
    processes: dict[int, _Process] = {}

    def measured_after(i: int) -> Callable[[], None] | None:
        if i + 1 == len(slots):
            return on_measured  # the caller's: the next job may start
        if spec.overlap and not slots[i + 1].counters:
            return lambda: handoffs[i].offer(lambda: launch(i + 1, gated=True))
        return None

    def launch(i: int, gated: bool) -> _Process:
        if not hosts[i]:  # it runs next in the process of the level set before it
            process = processes[i - 1].next_stage(slots[i])
            if progress:
                progress(slots[i], "start", 0, spec.profile.iterations)
        else:
            last = i + len(hosts[i]) - 1
            measured = [None] * (len(hosts[i]) - 1) + [measured_after(last)]
            process = _launch(
                _later(slot_spec[i], i), hosts[i], measurement_id, slot_progress[i], gated, measured
            )
        processes[i] = process
        return process

    def open_in_turn(process: _Process, i: int) -> _Process:
        """Let level set ``i``'s process measure once the processes started ahead for the level
        sets after it have warmed up: none warms up while it measures."""
        for handoff in handoffs[i:]:  # handoffs[k] holds slot k + 1's process
            later = handoff.peek()
            if later is None or later is process or later.stages.ready.wait(READY_LIMIT_S):
                continue
            log.warning(
                "xsp: %s did not warm up within %.0f s beside %s; it starts in its turn instead",
                later.levels,
                READY_LIMIT_S,
                slots[i],
            )
            _stop_ahead(spec, handoff)
        return process.open()

    process: _Process | None = None
    i = 0
    restore = _terminate_as_interrupt() if spec.profile.continuous else None
    side_by_side = warms_up_side_by_side(spec, hosts)
    try:
        process = launch(0, gated=after is not None or bool(side_by_side))
        for j in side_by_side:
            handoffs[j - 1].offer(functools.partial(launch, j, gated=True))
        if after is not None:
            after()
        if process.gate is not None:
            process = open_in_turn(process, 0)
        for i in range(len(slots)):
            if process is None:  # never: each turn starts the next or breaks
                break
            entry = _drop_empty(slot_spec[i], _complete(slot_spec[i], process, slot_progress[i]))
            if _failed_while_ahead(process, entry):
                log.warning(
                    "xsp: %s failed while it shared the machine with the level set before it "
                    "(%s); running it again on its own",
                    slots[i],
                    entry.get("error"),
                )
                first_error = entry.get("error")
                shutil.rmtree(slot_spec[i].out / slots[i], ignore_errors=True)
                for handoff in handoffs[i:]:  # on its own: those warmed up beside it start later
                    _stop_ahead(spec, handoff)
                process = launch(i, gated=False)
                entry = _complete(slot_spec[i], process, slot_progress[i])
                entry = _drop_empty(slot_spec[i], entry)
                entry["failed_ahead"] = first_error  # the first attempt's error
            process = None
            _list(manifest, entry, hosts, slots, i, len(level_sets))
            store.write_json_atomic(spec.out / store.MANIFEST, manifest)
            following = handoffs[i].take()
            if entry["status"] != "ok" and i < len(level_sets):
                for ahead in [following, *(h.take() for h in handoffs[i + 1 :])]:
                    if ahead is not None:
                        _cancel(spec, ahead)
                _end_later_stages(spec, processes[i])
                break
            if i + 1 < len(slots):  # a further M process that failed: the next still runs
                if following is None:
                    process = launch(i + 1, False)
                else:
                    process = open_in_turn(following, i + 1)
    except KeyboardInterrupt:
        result.interrupted = True
        with _sigint_ignored():
            for ahead in (h.take() for h in handoffs[i:]):
                if ahead is not None and ahead is not process:
                    ahead.signal(signal.SIGINT)
                    _cancel(spec, ahead)
            if process is not None:
                entry = _interrupt(slot_spec[i], process, slot_progress[i])
                _list(manifest, entry, hosts, slots, i, len(level_sets))
        manifest["interrupted_ns"] = time.time_ns()
    finally:
        if restore is not None:
            restore()
        if compile_cache is not None:  # every level-set process has ended
            shutil.rmtree(compile_cache, ignore_errors=True)
    manifest["status"] = result.status
    manifest["finished_ns"] = time.time_ns()  # with created_ns: the whole, as `xsp summary` says
    if fresh and result.runs and not result.stored and _only_manifest(spec.out):
        shutil.rmtree(spec.out, ignore_errors=True)  # nothing measured: no empty measurement
    else:  # a campaign's stderr logs stay, with the manifest that says why
        store.write_json_atomic(spec.out / store.MANIFEST, manifest)
    return result


def _further_m_processes(spec: LeveledSpec, level_sets: Sequence[LevelSet]) -> list[LeveledSpec]:
    """The specs of the processes that time M again after the level sets
    (``xsp.tracer.run.m_processes``): ``spec.m_processes`` - 1 of them where M is measured and
    the measurement is not a service's, each into ``OUT/m-processes/<n>``, measuring at most
    ``m_processes.ITERATIONS`` iterations. A reused ``--out``'s earlier ones are removed."""
    if spec.m_processes <= 1 or m_processes.MODEL_ONLY not in level_sets:
        return []
    if spec.profile.continuous:
        return []
    again = []
    for n in range(2, spec.m_processes + 1):
        out = spec.out / m_processes.DIRECTORY / str(n)
        shutil.rmtree(out, ignore_errors=True)  # never an earlier measurement's steps
        profile = dataclasses.replace(
            spec.profile, iterations=min(spec.profile.iterations, m_processes.ITERATIONS)
        )
        again.append(dataclasses.replace(spec, out=out, profile=profile))
    return again


def _list(
    manifest: dict[str, Any],
    entry: dict[str, Any],
    hosts: list[tuple[LevelSet, ...]],
    slots: list[LevelSet],
    i: int,
    level_sets: int,
) -> None:
    """Put slot ``i``'s entry in the manifest: a level set's under ``runs``, a further M
    process's under ``m_processes`` with its number and its directory."""
    if i < level_sets:
        manifest["runs"].append(_in_process_of(entry, hosts, slots, i))
        return
    n = i - level_sets + 2
    listed = {"process": n, "path": f"{m_processes.DIRECTORY}/{n}", **entry}
    manifest.setdefault(m_processes.MANIFEST_KEY, []).append(listed)


def warms_up_side_by_side(spec: LeveledSpec, hosts: list[tuple[LevelSet, ...]]) -> list[int]:
    """The level sets whose processes start with the first one, ahead of their turn
    (``LeveledSpec.overlap``, a zoo model on a GPU): every process of the measurement but one
    run under Nsight Compute (no gate to wait at). They start up and warm up side by side; each
    measures only once the one before has exited and every one after it waits at its gate, so
    no measurement overlaps another process's work, and no process's start-up and first
    iteration wait for the measurement before it. A script's processes start one at a time (it
    may compile what the next loads from the inductor cache, or touch files)."""
    from xsp.core.devices import resolve_device

    if not (spec.overlap and spec.profile.model):
        return []
    if not resolve_device(spec.profile.device).startswith("cuda"):
        return []  # on the CPU the warm-ups would share the cores the workload runs on
    if hosts[0][0].counters:
        return []
    return [j for j, group in enumerate(hosts) if j and group and not group[0].counters]


def _stop_ahead(spec: LeveledSpec, handoff: _Handoff) -> None:
    """Stop a process started ahead of its turn (it has not warmed up in time, or the one
    before it runs again on its own), and forget it: its level set starts in its turn."""
    process = handoff.drop()
    if process is None:
        return
    process.whole_wait(0, True)
    process.reader.join(timeout=5)
    out = process.out or spec.out  # a further M process writes under m-processes/<n>
    for levels in process.stages.levels:
        shutil.rmtree(out / levels, ignore_errors=True)
    if spec.log_stderr:
        (out / f"{process.levels}.stderr.log").unlink(missing_ok=True)


def _in_process_of(
    entry: dict[str, Any], hosts: list[tuple[LevelSet, ...]], level_sets: list[LevelSet], i: int
) -> dict[str, Any]:
    """The manifest entry of level set ``i``, naming the level set in whose process it ran
    (``in_process_of``) where it did not run in its own."""
    if not hosts[i]:
        entry["in_process_of"] = level_sets[i - 1]
    return entry


def _failed_while_ahead(process: _Process, entry: dict[str, Any]) -> bool:
    """Whether a level set started ahead of its turn failed before measuring: it shared the GPU
    with the one before (its memory, a model that fills it), so it is worth one run on its own."""
    return (
        process.ahead
        and entry.get("status") == "error"
        and not entry.get("iterations_measured")
        and not entry.get("timed_out")
    )


def _later(spec: LeveledSpec, index: int) -> LeveledSpec:
    """The spec of the ``index``-th level set: after the first, once the inductor cache holds
    what it compiled, inductor has no compile workers (``COMPILE_THREADS_ENV``). A first level
    set that saved nothing (it failed first) leaves the next one its workers to compile with."""
    if index == 0 or COMPILE_THREADS_ENV in os.environ or COMPILE_THREADS_ENV in spec.env:
        return spec
    cache = spec.env.get(COMPILE_CACHE_ENV) or os.environ.get(COMPILE_CACHE_ENV)
    if not cache or not _holds_files(Path(cache)):
        return spec
    return dataclasses.replace(spec, env={**spec.env, COMPILE_THREADS_ENV: "1"})


def _holds_files(directory: Path) -> bool:
    try:
        return any(p.is_file() for p in directory.rglob("*"))
    except OSError:
        return False


def _own_compile_cache(spec: LeveledSpec) -> str | None:
    """A fresh inductor cache directory for the measurement, so that what it compiles is
    neither read from nor left in the user's cache; None where the caller names one."""
    if COMPILE_CACHE_ENV in os.environ or COMPILE_CACHE_ENV in spec.env:
        return None
    return tempfile.mkdtemp(prefix="xsp-compile-")


def _only_manifest(out: Path) -> bool:
    return all(p.name == store.MANIFEST for p in out.iterdir())


def _drop_empty(spec: LeveledSpec, entry: dict[str, Any]) -> dict[str, Any]:
    """Remove the directory of a level-set run that measured nothing and stored no span: its
    manifest entry keeps why (``stored``: false), and readers skip it."""
    empty = entry.get("status") == "error" and not entry.get("iterations_measured")
    if empty and not entry.get("spans") and not entry.get("timed_out"):
        shutil.rmtree(spec.out / entry["levels"], ignore_errors=True)
        entry["stored"] = False
    return entry


_terminated = threading.Event()  # the interrupt was a SIGTERM


def _terminate_as_interrupt() -> Callable[[], None] | None:
    """A service's measurement is stopped with SIGTERM (``docker stop``, a process manager) as
    often as with Ctrl-C: both store what the level-set process measured. Returns what puts the
    handler back; None where none was installed (not the main thread, or a handler of the
    caller's own)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    _terminated.clear()

    def interrupt(signum: int, frame: Any) -> None:
        _terminated.set()
        raise KeyboardInterrupt

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, interrupt)
    return restore


@contextlib.contextmanager
def _sigint_ignored() -> Any:
    """While an interrupted measurement is put away: a second Ctrl-C kills the level-set
    process at once (see ``_interrupt``) instead of cutting the manifest's writing short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _second_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_second_interrupt_seen = threading.Event()


def _second_interrupt(signum: int, frame: Any) -> None:
    _second_interrupt_seen.set()


def _interrupt(spec: LeveledSpec, process: _Process, progress: ProgressFn | None) -> dict[str, Any]:
    """Pass the interrupt on to a level-set process, give it ``INTERRUPT_GRACE_S`` (less after a
    second Ctrl-C) to store what it recorded, then kill it; its manifest entry."""
    _second_interrupt_seen.clear()
    process.open_cancelled()
    process.signal(signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    returncode: int | None = None
    while returncode is None and time.monotonic() < deadline:
        if _second_interrupt_seen.is_set():
            break
        returncode, _ = process.wait(0.2, kill=False)
    if returncode is None:
        returncode, _ = process.wait(0, kill=True)
    entry = _entry(spec, process, returncode, timed_out=False)
    by = "SIGTERM" if _terminated.is_set() else "Ctrl-C"
    entry.update(status="interrupted", error=f"interrupted ({by})")
    _amend_run(spec, process.levels, entry)
    if progress:
        progress(process.levels, "end", returncode, spec.profile.iterations)
    return entry


def shares_process(spec: LeveledSpec, before: LevelSet, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` runs in the process of the one ``before`` it, once that
    one has stored its run (``LeveledSpec.share_process``): a zoo model's level sets of M and F
    alone, each adding levels to the one before (M, then MF). The shallower one leaves nothing
    that the deeper one could measure but a longer warm-up: M installs no hook, and neither
    starts CUPTI. L and G need their environment before the process starts, a script runs only
    once, and fixes and the numerics probe change the model once."""
    profile = spec.profile
    return (
        spec.share_process
        and bool(profile.model)
        and not (profile.fixes or profile.numerics_probe or profile.continuous)
        and set(before) < set(levels)
        and not (levels.library or levels.gpu or levels.counters)
    )


def process_hosts(spec: LeveledSpec, level_sets: Sequence[LevelSet]) -> list[tuple[LevelSet, ...]]:
    """For each level set, the level sets that the process started for it runs, in order (its
    own first); empty for one that runs in the process of the level set before it."""
    hosts: list[tuple[LevelSet, ...]] = []
    first = 0
    for i, levels in enumerate(level_sets):
        if i and shares_process(spec, level_sets[i - 1], levels):
            hosts[first] += (levels,)
            hosts.append(())
        else:
            first = i
            hosts.append((levels,))
    return hosts


def records_shapes(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` records aten ops' input shapes and dtypes: only the
    deepest one with level F does. Shapes do not change with the levels, so the reconstruction
    and the layer table take them from there, and the shallower level sets measure op and layer
    latency without their cost (the inputs RecordFunction boxes for the callback: 9% of a
    ResNet-50 b64 training step and 18% of a batch-1 inference step on the H200). Every rank of
    a multi-rank job records them: collective sizes come from them."""
    if not levels.framework:
        return False
    if spec.profile.command:
        from xsp.tracer.run import launcher

        if launcher.is_launcher(script_command(spec.profile.command)):
            return True
    return levels == max(_with_framework(spec), key=len, default=levels)


def calibrates(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` times level F's own cost per record: only the
    shallowest one with F does, since the replay reads its host times from that run alone
    (``xsp.analysis.matching.level_sources``). The calibration takes 0.5-1.3 s of a process's
    switch-on on the H200, which the deeper level sets no longer pay."""
    return levels.framework and levels == min(_with_framework(spec), key=len, default=levels)


def interleaves(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` runs an untraced iteration before each traced one
    (``xsp.tracer.capture.interleave``): the one that calibrates, in a leveled measurement of two
    level sets or more, whose replay joins runs. A single level set (a service's traces, the
    serving demo's 30 requests) keeps every iteration traced."""
    return (
        spec.interleave
        and len(spec.level_sets) > 1
        and spec.profile.calibrate
        and calibrates(spec, levels)
    )


def _with_framework(spec: LeveledSpec) -> list[LevelSet]:
    return [s for s in spec.level_sets if s.framework]


def child_spec(
    spec: LeveledSpec, levels: LevelSet, measurement_id: str, then: Sequence[LevelSet] = ()
) -> ChildSpec:
    """What the level-set process of ``levels`` runs (its pipes are added where it starts),
    and after it the level sets ``then`` in the same process (``shares_process``)."""
    return ChildSpec(
        _run_spec(spec, levels, measurement_id),
        then=tuple(_run_spec(spec, later, measurement_id) for later in then),
    )


def _run_spec(spec: LeveledSpec, levels: LevelSet, measurement_id: str) -> RunSpec:
    """The run of ``levels``: the measurement's profile, with the iterations the counter level
    set measures, op shapes and the calibration where this level set records them, and a
    command as the process runs it."""
    profile = spec.profile
    iterations = profile.iterations
    if levels.counters:
        iterations = min(iterations, profile.counter_iterations)
    command = tuple(script_command(profile.command)) if profile.command else ()
    return RunSpec(
        levels,
        dataclasses.replace(
            profile,
            iterations=iterations,
            op_shapes=profile.op_shapes and records_shapes(spec, levels),
            calibrate=profile.calibrate and calibrates(spec, levels),
            interleave=interleaves(spec, levels),
            command=command,
        ),
        out=str(spec.out / levels),
        measurement_id=measurement_id,
    )


#: Waits for a level-set process for at most the given seconds (None: no limit) and, past them,
#: kills it (its process group, when it has its own) or, with ``kill=False``, returns
#: (None, True); returns (exit status, timed out).
class Wait(Protocol):
    def __call__(self, timeout: float | None, kill: bool = True) -> tuple[Any, bool]: ...


#: How long a cancelled process gets to exit by itself before it is killed.
CANCEL_GRACE_S = 30.0
#: How long a level set waits to measure for the processes started ahead of their turn to warm
#: up; one that takes longer is stopped and started in its turn.
READY_LIMIT_S = 120.0


class _Stages:
    """What the progress reader learns of the level sets that one process runs in turn: which
    have stored their run, and when; ``done[k]`` is set once level set ``k`` has stored its
    run or the process has ended."""

    def __init__(self, levels: Sequence[LevelSet]) -> None:
        self.levels = tuple(levels)
        count = len(self.levels)
        self.done = [threading.Event() for _ in range(count)]
        self.stored_ns = [0] * count  # 0: not stored
        #: set once the process has warmed up and waits at its gate, or has ended
        self.ready = threading.Event()

    def store(self, k: int) -> None:
        self.stored_ns[k] = time.time_ns()
        self.done[k].set()

    def end(self) -> None:
        self.ready.set()
        for event in self.done:
            event.set()

    def wait(self, k: int, process_wait: Wait) -> Wait:
        """The wait of level set ``k`` in the process: until it has stored its run (exit
        status 0, as its own process would end) or the process has ended (its status)."""
        if k + 1 == len(self.done):
            return process_wait

        def wait(timeout: float | None, kill: bool = True) -> tuple[Any, bool]:
            if not self.done[k].wait(timeout):
                return process_wait(0, kill) if kill else (None, True)
            return (0, False) if self.stored_ns[k] else process_wait(None, kill)

        return wait


@dataclass
class _Process:
    """A started level-set process: its wait, its progress reader and, when it was started
    ahead of its turn, the write end of its gate (a byte lets it switch its levels on). A
    process that runs several level sets in turn (``shares_process``) is one of these per
    level set (``next_stage``), each waiting for its own level set's run."""

    levels: LevelSet
    wait: Wait
    reader: threading.Thread
    spawned_ns: int  # for a later level set in a shared process: when the one before stored
    gate: int | None = None
    pid: int = 0
    own_group: bool = False
    opened_ns: int = 0  # when it could start measuring: its time limit counts from there
    #: a process without a progress pipe (under ncu) has measured once it has exited
    on_exit: Callable[[], None] | None = None
    ncu: str | None = None  # the Nsight Compute that runs it (hardware-counter level set)
    ahead: bool = False  # started ahead of its turn: it overlapped the one before's end
    stages: _Stages = field(default_factory=lambda: _Stages(()))
    stage: int = 0  # which of the process's level sets this one is
    out: Path | None = None  # the measurement directory it writes under (its spec's out)
    process_wait: Wait | None = None  # the process's own wait (``wait`` is the level set's)

    @property
    def whole_wait(self) -> Wait:
        """The process's own wait, whichever of its level sets this one is."""
        return self.process_wait or self.wait

    @property
    def last_stage(self) -> bool:
        return self.stage + 1 >= len(self.stages.done)

    def next_stage(self, levels: LevelSet) -> _Process:
        """The next level set that this process runs, ``levels``, from when this one stored."""
        k = self.stage + 1
        start = self.stages.stored_ns[self.stage] or time.time_ns()
        return dataclasses.replace(
            self,
            levels=levels,
            wait=self.stages.wait(k, self.whole_wait),
            spawned_ns=start,
            opened_ns=start,
            gate=None,
            ahead=False,
            stage=k,
            process_wait=self.whole_wait,
        )

    def open(self) -> _Process:
        if self.gate is not None:
            with contextlib.suppress(BrokenPipeError):  # it died early; its wait says how
                os.write(self.gate, b"g")
            os.close(self.gate)
            self.gate = None
        self.opened_ns = time.time_ns()
        return self

    def open_cancelled(self) -> None:
        """Close the gate unopened: a process waiting there exits before its levels come on."""
        if self.gate is not None:
            os.close(self.gate)
            self.gate = None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (to its group when it has its own)."""
        _send(self.pid, self.own_group, signum)


class _Handoff:
    """The next level set's process, started ahead of its turn: with the first one (side by
    side) or from the progress reader once the current one has measured; taken (or found
    missing) once the current one has exited."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: _Process | None = None
        self._taken = False

    def offer(self, start: Callable[[], _Process]) -> None:
        with self._lock:
            if self._taken or self._process is not None:
                return
            try:
                self._process = start()
            except Exception as exc:  # the runner starts it in turn instead
                log.warning("xsp: could not start the next level set early: %s", exc)

    def take(self) -> _Process | None:
        with self._lock:
            self._taken = True
            return self._process

    def peek(self) -> _Process | None:
        with self._lock:
            return None if self._taken else self._process

    def drop(self) -> _Process | None:
        """Forget the process started ahead (the caller stops it): the level set is started in
        its turn instead."""
        with self._lock:
            process, self._process = self._process, None
            return None if self._taken else process


def _launch(
    spec: LeveledSpec,
    stages: tuple[LevelSet, ...],
    measurement_id: str,
    progress: ProgressFn | None,
    gated: bool,
    on_measured: Sequence[Callable[[], None] | None],
) -> _Process:
    """Start the process of the level sets ``stages`` (one, or those that share it), which run
    in turn; ``on_measured[k]`` is called once the ``k``-th has measured. Returns the first's."""
    levels = stages[0]
    if progress:
        progress(levels, "start", 0, spec.profile.iterations)
    env = child_environment(spec, levels)
    stderr_path = spec.out / f"{levels}.stderr.log" if spec.log_stderr else None
    if stderr_path is not None:
        spec.out.mkdir(parents=True, exist_ok=True)
    spawned_ns = time.time_ns()
    counted = levels.counters  # under ncu: a fresh process, no pipes
    start = _fork if spec.fork_server and spec.profile.model and not counted else _spawn
    own_group = spec.timeout_s is not None  # so that a time limit takes its children too
    child = child_spec(spec, levels, measurement_id, stages[1:])
    wait, read_fd, gate, pid = start(spec, child, env, stderr_path, gated)
    reports = _Stages(stages)
    reader = threading.Thread(
        target=_read_progress,
        args=(read_fd, stages, progress, [None] if counted else list(on_measured), reports),
        daemon=True,
    )
    reader.start()
    process = _Process(
        levels,
        reports.wait(0, wait),
        reader,
        spawned_ns,
        gate,
        pid,
        own_group,
        spawned_ns,
        ahead=gated,
        stages=reports,
        process_wait=wait,
        out=spec.out,
    )
    if counted:
        from xsp.tracer.run import ncu

        process.on_exit, process.ncu = on_measured[-1], ncu.find()
        if progress:
            progress(levels, "replaying kernels (ncu)", 0, spec.profile.iterations)
    return process


def _complete(spec: LeveledSpec, process: _Process, progress: ProgressFn | None) -> dict[str, Any]:
    """Wait for a level-set process (within the time limit, counted from when it could start
    measuring) and make its manifest entry."""
    limit = None
    if spec.timeout_s is not None:
        waited = (time.time_ns() - (process.opened_ns or process.spawned_ns)) / 1e9
        limit = max(0.0, spec.timeout_s - waited)
    returncode, timed_out = _wait(process, limit)
    entry = _entry(spec, process, returncode, timed_out)
    _amend_run(spec, process.levels, entry)
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


#: Set by a caller that runs measurements in threads (a campaign's lanes) on its Ctrl-C, which
#: Python delivers to the main thread only: each thread's wait raises KeyboardInterrupt, so
#: its measurement is put away as an interrupted one (``run_leveled``).
INTERRUPT = threading.Event()


def _wait(process: _Process, limit: float | None) -> tuple[int, bool]:
    """``process.wait(limit)``; off the main thread, in short steps that watch INTERRUPT."""
    if threading.current_thread() is threading.main_thread():
        return process.wait(limit)
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        step = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        returncode, timed_out = process.wait(step, False)
        if not timed_out:
            return returncode, False
        if deadline is not None and time.monotonic() >= deadline:
            return process.wait(0)  # killed: past its limit
        if INTERRUPT.is_set():
            raise KeyboardInterrupt


def _entry(
    spec: LeveledSpec, process: _Process, returncode: int, timed_out: bool
) -> dict[str, Any]:
    """A finished level-set process's manifest entry: its run.json's status and counts, and how
    its program ended; a process that ended before storing its run is an error that says how."""
    levels = process.levels
    if process.last_stage:
        process.reader.join(timeout=5)
    ended_ns = time.time_ns()
    entry: dict[str, Any] = {"levels": levels, "returncode": returncode}
    meta: dict[str, Any] = {}
    with contextlib.suppress(StoreError):
        meta = store.open_run(spec.out / levels).meta
    program = program_end(returncode, meta.get("program"))
    entry["program"] = program
    if meta.get("status") == "running" and not timed_out:
        from xsp.tracer.run.recover import recover_run  # conversion: only for a dead process

        meta = recover_run(spec.out / levels, describe_end(program)) or meta
    if meta:
        entry.update(
            status=meta.get("status"),
            error=meta.get("error"),
            status_reasons=list(meta.get("status_reasons") or []),
            iterations_measured=meta.get("iterations_measured"),
            spans=meta.get("spans"),
            seconds=_phase_seconds(meta, process.spawned_ns, ended_ns),
        )
        if meta.get("cupti") is not None:
            entry["cupti"] = meta["cupti"]
    if timed_out:
        entry.update(
            status="error",
            timed_out=True,
            error=f"timed out after {spec.timeout_s:.0f} s; killed",
        )
    elif meta.get("recovered"):
        entry.update(error=f"the program {describe_end(program)}")
    elif not meta or meta.get("status") == "running":
        what = "before writing its store" if not meta else "before xsp stored its spans"
        entry.update(status="error", error=f"the program {describe_end(program)} {what}")
    elif returncode != 0 and entry["status"] == "ok":
        entry.update(status="error", error=f"the run process {describe_end(program)}")
    return entry


def program_end(returncode: int, recorded: Any = None) -> dict[str, Any]:
    """How a level-set process's program ended: what its run.json recorded (``exit_code``,
    ``exception``, ``interrupted``), or the exit code, or the signal that killed it."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return {"signal": number, "signal_name": name}
    if isinstance(recorded, dict) and recorded:
        return dict(recorded)
    return {"exit_code": returncode}


def _amend_run(spec: LeveledSpec, levels: str, entry: dict[str, Any]) -> None:
    """Make run.json agree with the manifest entry when the process could not say it itself
    (it was killed, timed out, interrupted, or exited before xsp stored its spans)."""
    path = spec.out / levels / store.RUN_META
    try:
        meta = store.read_json(path)
    except StoreError:
        return  # it never wrote one; the manifest says why
    if meta.get("status") == entry["status"] and meta.get("program") == entry["program"]:
        return
    reasons = list(meta.get("status_reasons") or [])
    if entry.get("error") and not any(r.startswith(entry["error"]) for r in reasons):
        reasons.insert(0, entry["error"])  # unless a reason says it already, and more
    meta.update(
        status=entry["status"],
        error=entry.get("error") or meta.get("error"),
        program=entry["program"],
        status_reasons=reasons,
        finished_ns=meta.get("finished_ns") or time.time_ns(),
    )
    if entry.get("timed_out"):
        meta["timed_out"] = True
    entry["status_reasons"] = reasons
    try:
        store.write_json_atomic(path, meta)
    except OSError as exc:
        log.error("xsp: cannot update %s: %s", path, exc)


def _end_later_stages(spec: LeveledSpec, process: _Process) -> None:
    """A level set failed in a process that was to run more level sets after it: the process
    (which ends by itself after a failed one) is stopped, and what the later ones wrote goes
    (the manifest never lists them)."""
    if process.last_stage:
        return
    process.whole_wait(0, True)
    process.reader.join(timeout=5)
    for k in range(process.stage + 1, len(process.stages.done)):
        later = process.stages.levels[k]
        shutil.rmtree(spec.out / later, ignore_errors=True)


def _cancel(spec: LeveledSpec, process: _Process) -> None:
    """Drop a process started ahead of its turn: its gate closes unopened, so it exits before
    its levels come on; what it wrote goes (the manifest never lists it)."""
    process.open_cancelled()
    process.wait(CANCEL_GRACE_S)
    process.reader.join(timeout=5)
    out = process.out or spec.out  # a further M process writes under m-processes/<n>
    shutil.rmtree(out / process.levels, ignore_errors=True)
    if spec.log_stderr:
        (out / f"{process.levels}.stderr.log").unlink(missing_ok=True)


def _spawn(
    spec: LeveledSpec,
    child: ChildSpec,
    env: dict[str, str],
    stderr_path: Path | None,
    gated: bool,
) -> tuple[Wait, int, int | None, int]:
    """A fresh interpreter (``python -m xsp.tracer.run.child``); (its wait, its progress pipe, its gate
    when ``gated``, its pid)."""
    # Under ncu (the hardware-counter level set) the process gets no pipes: ncu starts it, and
    # what it inherits is ncu's to decide; its progress pipe closes at once.
    levels = child.run.levels
    counted = levels.counters
    read_fd, write_fd = os.pipe()
    gate_read, gate_write = os.pipe() if gated and not counted else (None, None)
    log = open(stderr_path, "wb") if stderr_path else None  # noqa: SIM115 - closed below
    own_group = spec.timeout_s is not None
    argv = [
        sys.executable,
        "-m",
        "xsp.tracer.run.child",
        *dataclasses.replace(
            child,
            progress_fd=None if counted else write_fd,
            gate_fd=gate_read,
        ).to_argv(),
    ]
    fds: tuple[int, ...] = (write_fd,) if gate_read is None else (write_fd, gate_read)
    if counted:
        from xsp.tracer.run import ncu

        tool = ncu.find()
        if tool is None:  # validate() left it out; found missing since
            raise ConfigError(f"level set {levels}: {ncu.unavailable()}")
        (spec.out / levels).mkdir(parents=True, exist_ok=True)
        argv, fds = ncu.profile_command(tool, spec.out / levels, argv), ()
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=fds,
            env=env,
            stderr=log,
            start_new_session=own_group,
        )
    finally:
        os.close(write_fd)
        if gate_read is not None:
            os.close(gate_read)
        if log is not None:
            log.close()

    def wait(timeout: float | None, kill: bool = True) -> tuple[Any, bool]:
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            if not kill:
                return None, True
            _kill(proc.pid, own_group)
            return proc.wait(), True

    return wait, read_fd, gate_write, proc.pid


def _kill(pid: int, own_group: bool) -> None:
    """SIGKILL a level-set process, and its whole process group when it has its own (the
    program's own children: data-loader workers, subprocesses)."""
    _send(pid, own_group, signal.SIGKILL)


def _send(pid: int, own_group: bool, signum: int) -> None:
    """Send ``signum`` to a level-set process (its group when it has its own: a forked one that
    has not yet made its group gets it alone)."""
    if not pid:
        return
    if own_group:
        try:
            os.killpg(pid, signum)
            return
        except (ProcessLookupError, PermissionError):
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _fork(
    spec: LeveledSpec,
    child: ChildSpec,
    env: dict[str, str],
    stderr_path: Path | None,
    gated: bool,
) -> tuple[Wait, int, int | None, int]:
    """A process forked from the preloaded fork server; (its wait, its progress pipe, its gate
    when ``gated``, its pid). With a time limit it starts its own process group."""
    from xsp.tracer.run import forkserver

    own_group = spec.timeout_s is not None
    process, read_fd, gate = forkserver.start(child, env, stderr_path, gated, own_group)

    def wait(timeout: float | None, kill: bool = True) -> tuple[Any, bool]:
        process.join(timeout=timeout)
        timed_out = process.is_alive()
        if timed_out:
            if not kill:
                return None, True
            _kill(process.pid, own_group)
            process.join()
        code = process.exitcode
        return (code if code is not None else -1), timed_out

    return wait, read_fd, gate, int(process.pid)


def _phase_seconds(meta: dict[str, Any], spawned_ns: int, ended_ns: int) -> dict[str, float]:
    """Where a level-set process spent its time: start-up (interpreter, imports, workload build),
    the warm-up iterations before the levels came on, F's calibration probes and switching the
    levels on (CUPTI's start), the traced iterations (the last warm-up one and the measured
    ones), switching the levels off (CUPTI's flush), draining them (records decoded, the monitor
    stopped), conversion to spans, storage (the sinks, run.json), and exit; a process started
    ahead of its turn also waited for the one before to exit (and one started beside others, for
    them to warm up). A phase whose mark is missing
    folds into the next."""
    phases = meta.get("phases_ns") or {}
    ready = phases.get("ready")  # a process started ahead of its turn waited from here
    marks = [
        ("start_up", meta.get("started_ns")),
        ("untraced_warm_up", ready or phases.get("levels_on")),
        ("waiting_for_previous", phases.get("levels_on") if ready else None),
        ("switch_on", phases.get("enabled")),
        ("traced_iterations", phases.get("measured")),
        ("stop", phases.get("stopped")),
        ("drain", phases.get("drained")),
        ("convert", phases.get("converted")),
        ("store", meta.get("finished_ns")),
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
    parts = meta.get("switch_on_ms") or {}
    calibration = sum(parts.get(name, 0.0) for name in schema.CALIBRATION_PARTS) / 1e3
    if calibration > 0 and "switch_on" in seconds:
        seconds["calibration"] = round(min(calibration, seconds["switch_on"]), 3)
        seconds["switch_on"] = round(seconds["switch_on"] - seconds["calibration"], 3)
    seconds["total"] = round((ended_ns - spawned_ns) / 1e9, 3)
    return seconds


def child_environment(spec: LeveledSpec, levels: LevelSet) -> dict[str, str]:
    """The environment of the level-set process of ``levels``: the runner's, the spec's own
    (a campaign's CUDA_VISIBLE_DEVICES), what the levels need, and ``SHARED_HOST_ENV`` last, so
    that nothing overrides it."""
    env = {**os.environ, **spec.env}
    env.update(_level_environment(spec, levels, env))
    return {**env, "PYTHONUNBUFFERED": "1", **SHARED_HOST_ENV}


def _level_environment(
    spec: LeveledSpec, levels: LevelSet, environ: Mapping[str, str]
) -> dict[str, str]:
    """What the levels need in the environment before the child's libraries start; the user's
    own settings win."""
    from xsp.core.devices import resolve_device
    from xsp.tracer.capture.levels import LevelContext, level_environment

    device = resolve_device(spec.profile.device)
    needed = level_environment(LevelContext(device, levels))
    return {k: v for k, v in needed.items() if k not in environ}


def _read_progress(
    fd: int,
    stages: Sequence[str],
    progress: ProgressFn | None,
    on_measured: list[Callable[[], None] | None],
    reports: _Stages,
) -> None:
    """Pass a level-set process's progress lines on, for the level set it is running
    (``stages``, in turn: a ``stored`` line ends one); call ``on_measured[k]`` once the
    ``k``-th has measured its last iteration."""
    k = 0
    try:
        with os.fdopen(fd) as stream:
            for line in stream:
                parts = line.split()
                if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
                    continue
                phase, done, total = parts[0], int(parts[1]), int(parts[2])
                if phase == STORED and k + 1 < len(stages):
                    reports.store(k)
                    k += 1
                    continue
                if phase == READY:
                    reports.ready.set()
                    continue
                if progress:
                    progress(stages[k], phase, done, total)
                measured = on_measured[k] if k < len(on_measured) else None
                if measured is not None and phase == "measure" and 0 < total <= done:
                    on_measured[k] = None
                    measured()
    finally:
        reports.end()


__all__ = ["LeveledResult", "LeveledSpec", "run_leveled", "validate"]
