"""A continuous session's batches: between two iterations the levels hand over what they
recorded since the last batch, the capture arena is recycled, the levels record on, and the
batch goes to a background exporter (``xsp.tracer.export.batches``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from xsp.core.arena import pending_arena_name
from xsp.core.run_sections import ArenaCounts, RunCounts
from xsp.tracer.capture.level_stack import LevelStack
from xsp.tracer.capture.levels import Level, LevelContext
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_output import RunOutput
from xsp.tracer.export.batches import Batch, BatchDrain, BatchExporter, Totals
from xsp.tracer.export.finish import NOTHING_RECORDED, Losses

__all__ = ["BatchRotation", "signals_held"]


class BatchRotation:
    """The batches of one continuous session, submitted in order, stored in the background."""

    def __init__(
        self,
        output: RunOutput,
        stack: LevelStack,
        context: LevelContext,
        errors: RunErrors,
        on_stored: Callable[[Totals], None],
    ) -> None:
        self._output = output
        self._errors = errors
        self._stack = stack
        self._context = context
        self._on_stored = on_stored
        self._exporter: BatchExporter | None = None
        self._submitted = 0
        self.started = 0.0  # monotonic: when the open batch began
        self.missing: list[str] = []  # what batches lost at capture, one line each

    def hand_over(self, failures: dict[int, str]) -> list[Level]:
        """End the open batch: its records to the exporter; returns the levels that stopped
        (still installed: ``restart`` switches them on into the next batch)."""
        losses = Losses()
        stopped, drains = self._stack.hand_over(losses)
        self._submit(drains, losses, failures)
        return stopped

    def restart(self, stopped: list[Level]) -> None:
        """Begin the next batch: the levels that stopped record again."""
        self.missing.extend(self._stack.restart(stopped))
        self.started = time.monotonic()

    def finish(self, failures: dict[int, str], counts: RunCounts, losses: Losses) -> Totals:
        """A continuous session's end: its last batch, then every batch stored."""
        stopped, drains = self._stack.hand_over(losses)
        self._submit(drains, Losses(), failures)
        self._stack.stop_handed_over(losses, stopped)
        assert self._exporter is not None
        totals = self._exporter.close()
        counts.update(totals.counts())
        self._errors.extend(totals.errors)
        losses.missing.extend(dict.fromkeys([*self.missing, *totals.missing]))
        losses.missing.extend(totals.lost_batches)
        if not totals.batches and not totals.lost_batches:
            losses.fatal.append(NOTHING_RECORDED)
        return totals

    def _submit(
        self, drains: dict[str, BatchDrain], losses: Losses, failures: dict[int, str]
    ) -> None:
        """Queue a handed-over batch for the exporter (waits while it is behind: bounded
        memory)."""
        self.missing.extend(losses.missing)
        part = f"{self._submitted:05d}"
        self._submitted += 1
        arena = self._context.arena if self._context._arena else None
        pending: Path | None = None
        arena_counts: ArenaCounts = {}
        if arena is not None:
            run_dir = self._output.identity.run_dir
            where = run_dir / pending_arena_name(part) if run_dir is not None else None
            pending, arena_counts = arena.rotate(where)
        if self._exporter is None:
            self._exporter = self._output.exporter(self._on_stored)
        self._exporter.submit(Batch(part, drains, dict(failures), pending, arena_counts))


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
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
