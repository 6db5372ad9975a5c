"""A leveled measurement's plan: what the user asked for (``LeveledSpec``), checked once.

``plan`` checks everything that can be checked before any process starts (the numbers, the
workload, the XSP_* settings, the level sets against the device, a service's rules, the output
directory) and returns a ``RunPlan``: the level sets that will run, those left out and why, and
the device they run on. The runner takes the plan as it is and checks nothing again.

The checks that need no torch come first (``check_arguments``), so a bad argument is refused in
a blink; only then is the device resolved, which may ask the CUDA driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from xsp.core import store
from xsp.core.errors import ConfigError
from xsp.core.levelset import LevelSet, continuous_counters, level_sets
from xsp.tracer.run.protocol import check_program
from xsp.tracer.spec import ProfileSpec

PYTHON_NAMES = ("python", "python3")
#: Interpreter options that change nothing xsp measures (stdio buffering, bytecode caching)
PYTHON_FLAGS_IGNORED = ("-u", "-B")
#: torch's launcher script: ``python -m torch.distributed.run``.
TORCHRUN = "torchrun"


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


@dataclass(frozen=True)
class RunPlan:
    """A checked ``LeveledSpec``: made by ``plan`` only, and trusted after it."""

    spec: LeveledSpec
    #: the level sets that run, in order
    level_sets: tuple[LevelSet, ...]
    #: the level sets left out (the hardware-counter level without a counter tool), each with
    #: its one-line reason
    skipped: Mapping[LevelSet, str]
    #: the device the level sets run on: the spec's, or the one chosen for None
    device: str


def plan(spec: LeveledSpec) -> RunPlan:
    """Check ``spec`` once, before anything runs: ConfigError, DeviceError or StoreError, one
    line, for the first thing that cannot be; else the plan the runner follows."""
    from xsp.core.devices import resolve_device

    skipped = counter_skips(spec.level_sets)
    runs = _check_arguments(spec, skipped)
    device = resolve_device(spec.profile.device)  # a missing GPU is named
    if spec.profile.device is None:  # one given by name was checked with the arguments
        _check_levels(runs, device)
    store.check_writable(spec.out)
    return RunPlan(spec, tuple(runs), skipped, device)


def check_arguments(spec: LeveledSpec) -> list[LevelSet]:
    """Check what can be checked without importing torch (a second at least; seconds with
    torchvision, timm and transformers); return the level sets that will run. ``plan`` does
    this first, then the rest."""
    return _check_arguments(spec, counter_skips(spec.level_sets))


def validate(spec: LeveledSpec) -> list[LevelSet]:
    """Check the spec before anything runs; return the level sets that will run."""
    return list(plan(spec).level_sets)


def _check_arguments(spec: LeveledSpec, skipped: Mapping[LevelSet, str]) -> list[LevelSet]:
    """The numbers, the workload (a zoo name from the catalogue of names, a command's program),
    the XSP_* settings, the level sets against a device given by name, a service's rules and
    the output directory; the level sets that will run (all but ``skipped``)."""
    from xsp.core import config

    profile = spec.profile
    if profile.warmup < 0:
        raise ConfigError(f"bad --warmup {profile.warmup}: must be 0 or more")
    if (profile.model is None) == (not profile.command):
        raise ConfigError("give either --model NAME or a Python command after --")
    _check_workload(profile)
    config.check({**os.environ, **spec.env})  # bad XSP_* values: refused before anything runs
    runs = [levels for levels in spec.level_sets if levels not in skipped]
    if not runs:
        raise ConfigError(f"nothing to run: {'; '.join(skipped.values())}")
    if profile.counter_iterations < 1:
        raise ConfigError(f"bad counter iterations {profile.counter_iterations}: at least 1")
    if profile.device is not None:  # one by name; None is chosen with torch (``plan``)
        if profile.device != "cpu" and not profile.device.startswith("cuda"):
            raise ConfigError(f"bad device {profile.device!r}: use cpu or cuda[:N]")
        _check_levels(runs, profile.device)
    if profile.continuous:
        _check_service(profile, runs)
    store.check_creatable(spec.out)  # made only once the device checks pass (``plan``)
    return runs


def _check_workload(profile: ProfileSpec) -> None:
    """A zoo model's name, mode and batch size, or a command's program and launcher."""
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
        return
    command = script_command(profile.command)
    from xsp.tracer.run import launcher

    if not launcher.is_launcher(command):
        check_program(command)
        return
    launcher.worker_arguments(command)  # a launcher xsp cannot trace is refused here
    if profile.continuous:
        raise ConfigError(
            "a continuous session (--iterations 0 or --duration) traces one process, "
            "not a multi-rank job"
        )


def _check_levels(runs: Sequence[LevelSet], device: str) -> None:
    from xsp.tracer.capture import levels as capture_levels

    for levels in runs:
        capture_levels.check_levels(levels, device)


def _check_service(profile: ProfileSpec, runs: Sequence[LevelSet]) -> None:
    """A continuous measurement's level sets: each must be able to run without an end, and
    without one only a single level set can run (the next would never start)."""
    if profile.iterations == 0 and profile.duration_s is None and len(runs) > 1:
        raise ConfigError(
            f"--iterations 0 without --duration measures until the program is stopped: give "
            f"one level set (--levels {runs[-1]}), one xsp run each serving the same "
            "load, or a --duration (docs/serving.md)"
        )
    for levels in runs:
        if levels.counters:
            raise ConfigError(continuous_counters(levels))


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


__all__ = [
    "LeveledSpec",
    "RunPlan",
    "check_arguments",
    "counter_skips",
    "plan",
    "script_command",
    "validate",
]
