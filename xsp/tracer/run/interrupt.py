"""Ctrl-C (and a service's SIGTERM) during a leveled measurement.

Ctrl-C (SIGINT to the runner alone or to its whole process group) stops the measurement: the
level-set process running is passed the SIGINT and given ``INTERRUPT_GRACE_S`` to store what it
recorded (a second Ctrl-C cuts that short), then killed; one started ahead of its turn is
cancelled; the manifest lists what finished and says ``interrupted``. A campaign's lanes, which
run measurements in threads, are interrupted through ``INTERRUPT``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from xsp.core.store import ManifestRun, Status
from xsp.tracer.run.manifest import amend_run, process_entry
from xsp.tracer.run.plan import LeveledSpec
from xsp.tracer.run.process import LevelProcess, ProgressFn

#: How long an interrupted level-set process gets to store what it recorded before it is
#: killed (a CUPTI flush of a large MFLG run takes tens of seconds; measured 24 s on the H200).
INTERRUPT_GRACE_S = 60.0

#: Set by a caller that runs measurements in threads (a campaign's lanes) on its Ctrl-C, which
#: Python delivers to the main thread only: each thread's wait raises KeyboardInterrupt, so
#: its measurement is put away as an interrupted one (``run_leveled``).
INTERRUPT = threading.Event()

_terminated = threading.Event()  # the interrupt was a SIGTERM
_second_interrupt_seen = threading.Event()


def wait(process: LevelProcess, limit: float | None) -> tuple[int, bool]:
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


def terminate_as_interrupt() -> Callable[[], None] | None:
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
def sigint_ignored() -> Iterator[None]:
    """While an interrupted measurement is put away: a second Ctrl-C kills the level-set
    process at once (see ``interrupt``) instead of cutting the manifest's writing short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, _second_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _second_interrupt(signum: int, frame: Any) -> None:
    _second_interrupt_seen.set()


def interrupt(spec: LeveledSpec, process: LevelProcess, progress: ProgressFn | None) -> ManifestRun:
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
    entry = process_entry(spec, process, returncode, timed_out=False)
    by = "SIGTERM" if _terminated.is_set() else "Ctrl-C"
    entry = dataclasses.replace(entry, status=Status.INTERRUPTED, error=f"interrupted ({by})")
    entry = amend_run(spec, process.levels, entry)
    if progress:
        progress(process.levels, "end", returncode, spec.profile.iterations)
    return entry


__all__ = [
    "INTERRUPT",
    "INTERRUPT_GRACE_S",
    "interrupt",
    "sigint_ignored",
    "terminate_as_interrupt",
    "wait",
]
