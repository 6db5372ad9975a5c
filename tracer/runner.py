"""The leveled runner: the same workload once per level set, each in a fresh process.

``run_leveled`` validates everything it can up front (level sets, model name, device, output
directory), then for each level set starts ``python -m tracer.child`` with a pipe for progress,
waits for it, and records the run in ``RUN_DIR/manifest.json``. A failing level-set run stops the
measurement; what it recorded stays in the store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracer import schema, store
from tracer.errors import ConfigError, StoreError
from tracer.session import DEFAULT_ITERATIONS, DEFAULT_WARMUP

PYTHON_NAMES = ("python", "python3")

#: (level set, phase, done, total) -> None; phase is "start", "warmup", "measure" or "end".
ProgressFn = Callable[[str, str, int, int], None]


@dataclass(frozen=True)
class LeveledSpec:
    """What to run and how: a zoo model (``model``) or a Python command (``command``)."""

    out: Path
    level_sets: Sequence[str] = ("M", "MF")
    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    device: str | None = None
    model: str | None = None
    batch_size: int = 1
    mode: str = "infer"
    command: Sequence[str] = field(default_factory=tuple)
    otlp_endpoint: str | None = None
    op_shapes: bool = True
    channels_last: bool = False
    # For campaigns: extra environment for the level-set processes (CUDA_VISIBLE_DEVICES), a
    # time limit per level set, and the processes' stderr kept in OUT/<levels>.stderr.log.
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    log_stderr: bool = False
    # Zoo workloads: fork level-set processes from a server that imported torch once.
    fork_server: bool = False

    @property
    def workload(self) -> str:
        return self.model or " ".join(self.command)


@dataclass
class LeveledResult:
    out: Path
    measurement_id: str
    runs: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return all(r["status"] == "ok" for r in self.runs)

    @property
    def failure(self) -> str | None:
        for run in self.runs:
            if run["status"] != "ok":
                return f"level set {run['levels']}: {run.get('error') or run['status']}"
        return None


def script_command(command: Sequence[str]) -> list[str]:
    """Strip the interpreter from ``python script.py ...`` / ``python -m mod ...``: the child
    runs the script in-process with xsp's own interpreter."""
    if not command:
        raise ConfigError("no command after --: give e.g. `-- python train.py`")
    head = Path(command[0]).name
    if not (head.startswith(PYTHON_NAMES) or command[0] == sys.executable):
        raise ConfigError(
            f"cannot trace {command[0]!r}: xsp run -- expects a Python command "
            "(python script.py ... or python -m module ...)"
        )
    rest = list(command[1:])
    if not rest:
        raise ConfigError("no script after python: give e.g. `-- python train.py`")
    return rest


def validate(spec: LeveledSpec) -> list[str]:
    """Check the spec before anything runs; return the normalised level sets."""
    try:
        level_sets = schema.parse_level_sets(",".join(spec.level_sets))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if spec.iterations < 1:
        raise ConfigError(f"bad --iterations {spec.iterations}: must be at least 1")
    if spec.warmup < 0:
        raise ConfigError(f"bad --warmup {spec.warmup}: must be 0 or more")
    if (spec.model is None) == (not spec.command):
        raise ConfigError("give either --model NAME or a Python command after --")
    if spec.model is not None:
        from tracer import zoo

        zoo.find(spec.model)
        if spec.mode not in zoo.MODES:
            raise ConfigError(f"bad --mode {spec.mode!r}: use train or infer")
        if spec.batch_size < 1:
            raise ConfigError(f"bad --batch-size {spec.batch_size}: must be at least 1")
    else:
        script_command(spec.command)
    from tracer.levels import check_levels
    from tracer.session import resolve_device

    device = resolve_device(spec.device)
    for levels in level_sets:
        check_levels(levels, device)
    store.check_writable(spec.out)
    return level_sets


def run_leveled(spec: LeveledSpec, progress: ProgressFn | None = None) -> LeveledResult:
    level_sets = validate(spec)
    measurement_id = uuid.uuid4().hex
    manifest: dict[str, Any] = {
        "format": schema.STORE_FORMAT,
        "measurement_id": measurement_id,
        "created_ns": time.time_ns(),
        "workload": spec.workload,
        "spec": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
        "level_sets": level_sets,
        "runs": [],
        "status": "running",
    }
    store.write_json_atomic(spec.out / store.MANIFEST, manifest)
    result = LeveledResult(spec.out, measurement_id, manifest["runs"])
    for levels in level_sets:
        entry = _run_one(spec, levels, measurement_id, progress)
        manifest["runs"].append(entry)
        store.write_json_atomic(spec.out / store.MANIFEST, manifest)
        if entry["status"] != "ok":
            break
    manifest["status"] = "ok" if result.ok else "failed"
    store.write_json_atomic(spec.out / store.MANIFEST, manifest)
    return result


def child_argv(
    spec: LeveledSpec, levels: str, measurement_id: str, progress_fd: int | None
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "tracer.child",
        "--levels",
        levels,
        "--out",
        str(spec.out / levels),
        "--iterations",
        str(spec.iterations),
        "--warmup",
        str(spec.warmup),
        "--measurement-id",
        measurement_id,
    ]
    if spec.device:
        argv += ["--device", spec.device]
    if progress_fd is not None:
        argv += ["--progress-fd", str(progress_fd)]
    if spec.otlp_endpoint:
        argv += ["--otlp-endpoint", spec.otlp_endpoint]
    if not spec.op_shapes:
        argv.append("--no-op-shapes")
    if spec.model:
        argv += ["--model", spec.model, "--batch-size", str(spec.batch_size), "--mode", spec.mode]
        if spec.channels_last:
            argv.append("--channels-last")
    else:
        argv += ["--", *script_command(spec.command)]
    return argv


def _run_one(
    spec: LeveledSpec, levels: str, measurement_id: str, progress: ProgressFn | None
) -> dict[str, Any]:
    if progress:
        progress(levels, "start", 0, spec.iterations)
    env = {**os.environ, **spec.env}
    env.update({**_level_environment(spec, levels, env), "PYTHONUNBUFFERED": "1"})
    stderr_path = spec.out / f"{levels}.stderr.log" if spec.log_stderr else None
    if stderr_path is not None:
        spec.out.mkdir(parents=True, exist_ok=True)
    spawned_ns = time.time_ns()
    launch = _fork if spec.fork_server and spec.model else _spawn
    wait, read_fd = launch(spec, levels, measurement_id, env, stderr_path)
    reader = threading.Thread(target=_read_progress, args=(read_fd, levels, progress), daemon=True)
    reader.start()
    returncode, timed_out = wait(spec.timeout_s)
    reader.join(timeout=5)
    ended_ns = time.time_ns()
    entry: dict[str, Any] = {"levels": levels, "returncode": returncode}
    try:
        meta = store.open_run(spec.out / levels).meta
        entry.update(
            status=meta.get("status"),
            error=meta.get("error"),
            iterations_measured=meta.get("iterations_measured"),
            spans=meta.get("spans"),
            seconds=_phase_seconds(meta, spawned_ns, ended_ns),
        )
    except StoreError:
        entry.update(
            status="error",
            error=f"the run process exited with {returncode} before writing its store",
        )
    if timed_out:
        entry.update(status="error", error=f"timed out after {spec.timeout_s:.0f} s; killed")
    elif returncode != 0 and entry["status"] == "ok":
        entry.update(status="error", error=f"the run process exited with {returncode}")
    if progress:
        progress(levels, "end", returncode, spec.iterations)
    return entry


#: Waits for a level-set process for at most the given seconds (None: no limit), kills it past
#: them; returns (exit status, timed out).
Wait = Callable[[float | None], tuple[int, bool]]


def _spawn(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    env: dict[str, str],
    stderr_path: Path | None,
) -> tuple[Wait, int]:
    """A fresh interpreter (``python -m tracer.child``); (its wait, its progress pipe)."""
    read_fd, write_fd = os.pipe()
    log = open(stderr_path, "wb") if stderr_path else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            child_argv(spec, levels, measurement_id, write_fd),
            pass_fds=(write_fd,),
            env=env,
            stderr=log,
            start_new_session=spec.timeout_s is not None,
        )
    finally:
        os.close(write_fd)
        if log is not None:
            log.close()

    def wait(timeout: float | None) -> tuple[int, bool]:
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), True

    return wait, read_fd


def _fork(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    env: dict[str, str],
    stderr_path: Path | None,
) -> tuple[Wait, int]:
    """A process forked from the preloaded fork server; (its wait, its progress pipe)."""
    from tracer import forkserver

    argv = child_argv(spec, levels, measurement_id, None)[3:]  # drop "python -m tracer.child"
    process, read_fd = forkserver.start(argv, env, stderr_path)

    def wait(timeout: float | None) -> tuple[int, bool]:
        process.join(timeout=timeout)
        timed_out = process.is_alive()
        if timed_out:
            process.kill()
            process.join()
        code = process.exitcode
        return (code if code is not None else -1), timed_out

    return wait, read_fd


def _phase_seconds(meta: dict[str, Any], spawned_ns: int, ended_ns: int) -> dict[str, float]:
    """Where a level-set process spent its time: start-up (interpreter, imports, workload build),
    the warm-up iterations before the levels came on, the traced iterations (the last warm-up
    one and the measured ones), conversion and storage, and exit."""
    marks = [
        ("start_up", meta.get("started_ns")),
        ("untraced_warm_up", (meta.get("phases_ns") or {}).get("levels_on")),
        ("traced_iterations", (meta.get("phases_ns") or {}).get("measured")),
        ("convert_and_store", meta.get("finished_ns")),
        ("exit", ended_ns),
    ]
    seconds: dict[str, float] = {}
    previous = spawned_ns
    for name, mark in marks:
        if isinstance(mark, int):
            seconds[name] = round((mark - previous) / 1e9, 3)
            previous = mark
    seconds["total"] = round((ended_ns - spawned_ns) / 1e9, 3)
    return seconds


def _level_environment(
    spec: LeveledSpec, levels: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """What the levels need in the environment before the child's libraries start; the user's
    own settings win."""
    from tracer.levels import LevelContext, level_environment
    from tracer.session import resolve_device

    device = resolve_device(spec.device)
    needed = level_environment(LevelContext(device, levels))
    return {k: v for k, v in needed.items() if k not in environ}


def _read_progress(fd: int, levels: str, progress: ProgressFn | None) -> None:
    with os.fdopen(fd) as stream:
        for line in stream:
            parts = line.split()
            if progress and len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                progress(levels, parts[0], int(parts[1]), int(parts[2]))


__all__ = ["LeveledResult", "LeveledSpec", "run_leveled", "validate"]
