"""A level-set process: started fresh (``python -m xsp.tracer.run.child``), forked from the fork
server, or under Nsight Compute; its wait, its gate, and the reader of its progress pipe.

One process may run several level sets in turn (``xsp.tracer.run.placement.shares_process``):
a ``LevelProcess`` stands for one of them (``next_stage``), and its wait ends once that level
set has stored its run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xsp.core.errors import ConfigError
from xsp.core.levelset import LevelSet
from xsp.tracer.run.environment import child_environment
from xsp.tracer.run.placement import child_spec
from xsp.tracer.run.plan import LeveledSpec
from xsp.tracer.run.protocol import READY, STORED, ChildSpec

#: (level set, phase, done, total) -> None; phase is "start", "warmup", "measure" or "end".
ProgressFn = Callable[[str, str, int, int], None]


#: Waits for a level-set process for at most the given seconds (None: no limit) and, past them,
#: kills it (its process group, when it has its own) or, with ``kill=False``, returns
#: (None, True); returns (exit status, timed out).
class Wait(Protocol):
    def __call__(self, timeout: float | None, kill: bool = True) -> tuple[Any, bool]: ...


class Stages:
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
class LevelProcess:
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
    stages: Stages = field(default_factory=lambda: Stages(()))
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

    def next_stage(self, levels: LevelSet) -> LevelProcess:
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

    def open(self) -> LevelProcess:
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


def launch(
    spec: LeveledSpec,
    stages: tuple[LevelSet, ...],
    measurement_id: str,
    progress: ProgressFn | None,
    gated: bool,
    on_measured: Sequence[Callable[[], None] | None],
) -> LevelProcess:
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
    reports = Stages(stages)
    reader = threading.Thread(
        target=_read_progress,
        args=(read_fd, stages, progress, [None] if counted else list(on_measured), reports),
        daemon=True,
    )
    reader.start()
    process = LevelProcess(
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
        if tool is None:  # the plan left it out; found missing since
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


def _read_progress(
    fd: int,
    stages: Sequence[str],
    progress: ProgressFn | None,
    on_measured: list[Callable[[], None] | None],
    reports: Stages,
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


__all__ = ["LevelProcess", "ProgressFn", "Stages", "Wait", "launch"]
