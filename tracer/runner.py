"""The leveled runner: the same workload once per level set, each in a fresh process.

``run_leveled`` validates everything it can up front (level sets, model name, device, output
directory), then for each level set starts ``python -m tracer.child`` with a pipe for progress,
waits for it, and records the run in ``RUN_DIR/manifest.json``. A failing level-set run stops the
measurement; what it recorded stays in the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
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

log = logging.getLogger(__name__)

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
    # Start each level set's process as soon as the one before has measured, so that its
    # start-up and untraced warm-up overlap the other's flush, conversion and exit; it switches
    # its levels on only once the one before has exited, so no measurement overlaps another
    # process's work.
    overlap: bool = False

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
    handoffs = [_Handoff() for _ in level_sets]

    def launch(i: int, gated: bool) -> _Process:
        measured: Callable[[], None] | None = None
        if i + 1 == len(level_sets):
            measured = on_measured  # the caller's: the next job may start
        elif spec.overlap:
            measured = lambda: handoffs[i].offer(lambda: launch(i + 1, gated=True))  # noqa: E731
        return _launch(spec, level_sets[i], measurement_id, progress, gated, measured)

    process = launch(0, gated=after is not None)
    if after is not None:
        after()
        process.open()
    for i in range(len(level_sets)):
        entry = _complete(spec, process, progress)
        manifest["runs"].append(entry)
        store.write_json_atomic(spec.out / store.MANIFEST, manifest)
        following = handoffs[i].take()
        if entry["status"] != "ok":
            if following is not None:
                _cancel(spec, following)
            break
        if i + 1 < len(level_sets):
            process = following.open() if following is not None else launch(i + 1, gated=False)
    manifest["status"] = "ok" if result.ok else "failed"
    store.write_json_atomic(spec.out / store.MANIFEST, manifest)
    return result


def child_argv(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    progress_fd: int | None,
    gate_fd: int | None = None,
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
    if gate_fd is not None:
        argv += ["--gate-fd", str(gate_fd)]
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


#: Waits for a level-set process for at most the given seconds (None: no limit), kills it past
#: them; returns (exit status, timed out).
Wait = Callable[[float | None], tuple[int, bool]]

#: How long a cancelled process gets to exit by itself before it is killed.
CANCEL_GRACE_S = 30.0


@dataclass
class _Process:
    """A started level-set process: its wait, its progress reader and, when it was started
    ahead of its turn, the write end of its gate (a byte lets it switch its levels on)."""

    levels: str
    wait: Wait
    reader: threading.Thread
    spawned_ns: int
    gate: int | None = None

    def open(self) -> _Process:
        if self.gate is not None:
            with contextlib.suppress(BrokenPipeError):  # it died early; its wait says how
                os.write(self.gate, b"g")
            os.close(self.gate)
            self.gate = None
        return self


class _Handoff:
    """The next level set's process, started from the progress reader once the current one
    has measured; taken (or found missing) once the current one has exited."""

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


def _launch(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    progress: ProgressFn | None,
    gated: bool,
    on_measured: Callable[[], None] | None,
) -> _Process:
    if progress:
        progress(levels, "start", 0, spec.iterations)
    env = {**os.environ, **spec.env}
    env.update({**_level_environment(spec, levels, env), "PYTHONUNBUFFERED": "1"})
    stderr_path = spec.out / f"{levels}.stderr.log" if spec.log_stderr else None
    if stderr_path is not None:
        spec.out.mkdir(parents=True, exist_ok=True)
    spawned_ns = time.time_ns()
    start = _fork if spec.fork_server and spec.model else _spawn
    wait, read_fd, gate = start(spec, levels, measurement_id, env, stderr_path, gated)
    reader = threading.Thread(
        target=_read_progress, args=(read_fd, levels, progress, on_measured), daemon=True
    )
    reader.start()
    return _Process(levels, wait, reader, spawned_ns, gate)


def _complete(spec: LeveledSpec, process: _Process, progress: ProgressFn | None) -> dict[str, Any]:
    """Wait for a level-set process (within the time limit) and make its manifest entry."""
    levels = process.levels
    returncode, timed_out = process.wait(spec.timeout_s)
    process.reader.join(timeout=5)
    ended_ns = time.time_ns()
    entry: dict[str, Any] = {"levels": levels, "returncode": returncode}
    try:
        meta = store.open_run(spec.out / levels).meta
        entry.update(
            status=meta.get("status"),
            error=meta.get("error"),
            iterations_measured=meta.get("iterations_measured"),
            spans=meta.get("spans"),
            seconds=_phase_seconds(meta, process.spawned_ns, ended_ns),
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


def _cancel(spec: LeveledSpec, process: _Process) -> None:
    """Drop a process started ahead of its turn: its gate closes unopened, so it exits before
    its levels come on; what it wrote goes (the manifest never lists it)."""
    if process.gate is not None:
        os.close(process.gate)
        process.gate = None
    process.wait(CANCEL_GRACE_S)
    process.reader.join(timeout=5)
    shutil.rmtree(spec.out / process.levels, ignore_errors=True)
    if spec.log_stderr:
        (spec.out / f"{process.levels}.stderr.log").unlink(missing_ok=True)


def _spawn(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    env: dict[str, str],
    stderr_path: Path | None,
    gated: bool,
) -> tuple[Wait, int, int | None]:
    """A fresh interpreter (``python -m tracer.child``); (its wait, its progress pipe, its gate
    when ``gated``)."""
    read_fd, write_fd = os.pipe()
    gate_read, gate_write = os.pipe() if gated else (None, None)
    log = open(stderr_path, "wb") if stderr_path else None  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(
            child_argv(spec, levels, measurement_id, write_fd, gate_read),
            pass_fds=(write_fd,) if gate_read is None else (write_fd, gate_read),
            env=env,
            stderr=log,
            start_new_session=spec.timeout_s is not None,
        )
    finally:
        os.close(write_fd)
        if gate_read is not None:
            os.close(gate_read)
        if log is not None:
            log.close()

    def wait(timeout: float | None) -> tuple[int, bool]:
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            if spec.timeout_s is not None:  # its own process group: take its children too
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            return proc.wait(), True

    return wait, read_fd, gate_write


def _fork(
    spec: LeveledSpec,
    levels: str,
    measurement_id: str,
    env: dict[str, str],
    stderr_path: Path | None,
    gated: bool,
) -> tuple[Wait, int, int | None]:
    """A process forked from the preloaded fork server; (its wait, its progress pipe, its gate
    when ``gated``)."""
    from tracer import forkserver

    argv = child_argv(spec, levels, measurement_id, None)[3:]  # drop "python -m tracer.child"
    process, read_fd, gate = forkserver.start(argv, env, stderr_path, gated)

    def wait(timeout: float | None) -> tuple[int, bool]:
        process.join(timeout=timeout)
        timed_out = process.is_alive()
        if timed_out:
            process.kill()
            process.join()
        code = process.exitcode
        return (code if code is not None else -1), timed_out

    return wait, read_fd, gate


def _phase_seconds(meta: dict[str, Any], spawned_ns: int, ended_ns: int) -> dict[str, float]:
    """Where a level-set process spent its time: start-up (interpreter, imports, workload build),
    the warm-up iterations before the levels came on, the traced iterations (the last warm-up
    one and the measured ones), switching the levels off (CUPTI's flush), draining them (records
    decoded, the monitor stopped), conversion to spans, storage (the sinks, run.json), and
    exit; a process started ahead of its turn also waited for the one before to exit. A phase
    whose mark is missing folds into the next."""
    phases = meta.get("phases_ns") or {}
    ready = phases.get("ready")  # a process started ahead of its turn waited from here
    marks = [
        ("start_up", meta.get("started_ns")),
        ("untraced_warm_up", ready or phases.get("levels_on")),
        ("waiting_for_previous", phases.get("levels_on") if ready else None),
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


def _read_progress(
    fd: int, levels: str, progress: ProgressFn | None, on_measured: Callable[[], None] | None
) -> None:
    """Pass a level-set process's progress lines on; call ``on_measured`` once its last
    measured iteration is over."""
    with os.fdopen(fd) as stream:
        for line in stream:
            parts = line.split()
            if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
                continue
            phase, done, total = parts[0], int(parts[1]), int(parts[2])
            if progress:
                progress(levels, phase, done, total)
            if on_measured is not None and phase == "measure" and done >= total:
                on_measured()
                on_measured = None


__all__ = ["LeveledResult", "LeveledSpec", "run_leveled", "validate"]
