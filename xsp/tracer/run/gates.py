"""Processes started ahead of their turn, waiting at their gates: handed over to the runner,
let through in turn, stopped when they are late, dropped when the level set before failed.

A process started ahead (``LeveledSpec.overlap``) warms up untraced and then waits at its gate,
a pipe the runner writes one byte to once the process before has exited; so no measurement
overlaps another process's work.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence

from xsp.core.levelset import LevelSet
from xsp.core.store import ManifestRun, Status
from xsp.tracer.run.plan import LeveledSpec
from xsp.tracer.run.process import LevelProcess

log = logging.getLogger(__name__)

#: How long a cancelled process gets to exit by itself before it is killed.
CANCEL_GRACE_S = 30.0
#: How long a level set waits to measure for the processes started ahead of their turn to warm
#: up; one that takes longer is stopped and started in its turn.
READY_LIMIT_S = 120.0


class Handoff:
    """The next level set's process, started ahead of its turn: with the first one (side by
    side) or from the progress reader once the current one has measured; taken (or found
    missing) once the current one has exited."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: LevelProcess | None = None
        self._taken = False

    def offer(self, start: Callable[[], LevelProcess]) -> None:
        with self._lock:
            if self._taken or self._process is not None:
                return
            try:
                self._process = start()
            except Exception as exc:  # the runner starts it in turn instead
                log.warning("xsp: could not start the next level set early: %s", exc)

    def take(self) -> LevelProcess | None:
        with self._lock:
            self._taken = True
            return self._process

    def peek(self) -> LevelProcess | None:
        with self._lock:
            return None if self._taken else self._process

    def drop(self) -> LevelProcess | None:
        """Forget the process started ahead (the caller stops it): the level set is started in
        its turn instead."""
        with self._lock:
            process, self._process = self._process, None
            return None if self._taken else process


def open_in_turn(
    spec: LeveledSpec, process: LevelProcess, levels: LevelSet, ahead: Sequence[Handoff]
) -> LevelProcess:
    """Let ``process`` (of the level set ``levels``) measure once the processes started ahead
    for the level sets after it (``ahead``) have warmed up: none warms up while it measures."""
    for handoff in ahead:
        later = handoff.peek()
        if later is None or later is process or later.stages.ready.wait(READY_LIMIT_S):
            continue
        log.warning(
            "xsp: %s did not warm up within %.0f s beside %s; it starts in its turn instead",
            later.levels,
            READY_LIMIT_S,
            levels,
        )
        stop_ahead(spec, handoff)
    return process.open()


def stop_ahead(spec: LeveledSpec, handoff: Handoff) -> None:
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


def cancel(spec: LeveledSpec, process: LevelProcess) -> None:
    """Drop a process started ahead of its turn: its gate closes unopened, so it exits before
    its levels come on; what it wrote goes (the manifest never lists it)."""
    process.open_cancelled()
    process.wait(CANCEL_GRACE_S)
    process.reader.join(timeout=5)
    out = process.out or spec.out  # a further M process writes under m-processes/<n>
    shutil.rmtree(out / process.levels, ignore_errors=True)
    if spec.log_stderr:
        (out / f"{process.levels}.stderr.log").unlink(missing_ok=True)


def end_later_stages(spec: LeveledSpec, process: LevelProcess) -> None:
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


def failed_while_ahead(process: LevelProcess, entry: ManifestRun) -> bool:
    """Whether a level set started ahead of its turn failed before measuring: it shared the GPU
    with the one before (its memory, a model that fills it), so it is worth one run on its own."""
    return (
        process.ahead
        and entry.status == Status.ERROR
        and not entry.iterations_measured
        and not entry.timed_out
    )


__all__ = [
    "CANCEL_GRACE_S",
    "READY_LIMIT_S",
    "Handoff",
    "cancel",
    "end_later_stages",
    "failed_while_ahead",
    "open_in_turn",
    "stop_ahead",
]
