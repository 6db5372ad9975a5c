"""A continuous session's export while it runs: batches of finished iterations, stored in the
background through the run's one finish (``xsp.tracer.export.finish.RunFinish``).

The session's thread only hands a batch over, between two iterations: its levels stop writing
the capture arena, whose file is set aside, and each gives the drain of its records
(``handover``); the levels come on again into a fresh arena, and the request goes on. One worker
thread reads each batch's arena, drains it, converts it, writes it as its own Parquet part
(``spans-<part>.parquet``, ``memory-<part>.parquet``), sends it to the other sinks (OTLP) and
then calls ``on_stored``, which rewrites ``run.json`` with what is stored so far. Span ids go on
from one batch to the next, so they stay unique within the run.

Memory is bounded: the queue holds at most ``QUEUE_BATCHES`` batches, and ``submit`` waits for
room (back-pressure on the service at a batch boundary rather than records dropped or memory
that grows). Crash safety: a batch's capture arena stays on disk as ``capture-<part>.arena``
until its part is written; the runner recovers such files after a crash
(``xsp.tracer.run.recover``), so a dead process loses at most the iteration it had open.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xsp.core.arena import ArenaContents, read_arena
from xsp.core.errors import StoreError
from xsp.core.run_sections import ArenaCounts, RunCounts
from xsp.tracer.convert.spans import ROOT_LEVEL
from xsp.tracer.export.finish import LevelDrain, Losses, RunFinish, drain_levels

__all__ = ["QUEUE_BATCHES", "Batch", "BatchDrain", "BatchExporter", "Totals"]

log = logging.getLogger(__name__)

#: Batches waiting to be stored, beyond the one being stored.
QUEUE_BATCHES = 2


#: A level's drain of one batch (``handover``): its records, and its loss counts, from the
#: batch's arena contents.
BatchDrain = Callable[[ArenaContents], tuple[Any, RunCounts]]


@dataclass
class Batch:
    """One batch: each level's drain (level letter -> drain), where its arena waits (None: the
    levels never wrote one), and the arena's native counts that its file does not hold."""

    part: str
    drains: dict[str, BatchDrain]
    failures: dict[int, str] = field(default_factory=dict)
    pending_arena: Path | None = None
    arena_counts: ArenaCounts = field(default_factory=lambda: ArenaCounts())


@dataclass
class Totals:
    """What the batches stored so far, as ``run.json`` keeps it."""

    batches: int = 0
    iterations: int = 0  # level M's steps stored
    spans: int = 0
    spans_by_level: dict[str, int] = field(default_factory=dict)
    events_outside_iterations: int = 0
    iterations_without_op_shapes: int = 0
    memory_events: int | None = None
    next_span_id: int = 1
    lost_batches: list[str] = field(default_factory=list)  # one line each
    missing: list[str] = field(default_factory=list)  # what batches lost at capture, one line each
    errors: list[str] = field(default_factory=list)

    def counts(self) -> RunCounts:
        counts: RunCounts = {
            "spans": self.spans,
            "spans_by_level": dict(self.spans_by_level),
            "events_outside_iterations": self.events_outside_iterations,
            "batches_stored": self.batches,
            "iterations_stored": self.iterations,
            "next_span_id": self.next_span_id,
        }
        if self.iterations_without_op_shapes:
            counts["iterations_without_op_shapes"] = self.iterations_without_op_shapes
        if self.memory_events is not None:
            counts["memory_events"] = self.memory_events
        return counts


class BatchExporter:
    """Stores submitted batches in order on one background thread (module docs)."""

    def __init__(
        self, finish: RunFinish, on_stored: Callable[[Totals], None] | None = None
    ) -> None:
        self._finish = finish
        self._on_stored = on_stored
        self.totals = Totals()
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=QUEUE_BATCHES)
        self._thread = threading.Thread(target=self._work, name="xsp-export", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, batch: Batch) -> None:
        """Queue ``batch``; waits while ``QUEUE_BATCHES`` are already waiting."""
        self._queue.put(batch)

    def close(self) -> Totals:
        """Store what is queued, stop the worker, and return the totals."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
        return self.totals

    def _work(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                self._store(batch)
            except Exception as exc:  # the worker must live on: the next batches still count
                self.totals.errors.append(f"batch {batch.part}: {type(exc).__name__}: {exc}")
                log.exception("xsp: storing batch %s failed", batch.part)

    def _drain(self, batch: Batch) -> tuple[dict[str, Any], RunCounts]:
        """Each level's records of ``batch``, read from its arena, and their loss counts; a
        level that fails to drain goes into ``missing``. The records are by level letter
        (open: the letters that drained), each its own level's."""
        totals = self.totals
        contents = ArenaContents.empty()
        if batch.pending_arena is not None:
            contents = read_arena(batch.pending_arena)
        contents.counts.update(batch.arena_counts)

        def failed(message: str) -> None:
            totals.errors.append(message)
            totals.missing.append(message)

        counts: RunCounts = {}
        drains = _level_drains(batch, contents)
        return drain_levels(drains, counts, failed, f" batch {batch.part}"), counts

    def _store(self, batch: Batch) -> None:
        totals = self.totals
        try:
            records, counts = self._drain(batch)
        except StoreError as exc:  # its arena cannot be read
            totals.lost_batches.append(f"batch {batch.part} was not read: {exc}")
            log.error("xsp: reading batch %s failed: %s", batch.part, exc)
            return
        losses = Losses()  # what the capture lost; a batch without iterations is no loss
        try:
            stored = self._finish.store(
                records,
                counts,
                losses,
                failures=batch.failures,
                first_span_id=totals.next_span_id,
                part=batch.part,
                skip_without_iterations=True,
            )
        except Exception as exc:
            where = (
                f" (its raw records are kept in {batch.pending_arena})"
                if batch.pending_arena
                else ""
            )
            message = (
                f"batch {batch.part} ({len(records[ROOT_LEVEL].iteration)} iterations) was not "
                f"converted: {type(exc).__name__}: {exc}{where}"
            )
            totals.lost_batches.append(message)
            log.exception("xsp: converting batch %s failed", batch.part)
            return
        finally:
            totals.missing.extend(losses.missing)
        if stored is None:
            self._forget(batch)  # a batch without an iteration (the levels came on, then stop)
            return
        report = stored.report
        totals.batches += 1
        totals.iterations += len(records[ROOT_LEVEL].iteration)
        totals.spans += report.spans
        for level, n in report.counts_by_level.items():
            totals.spans_by_level[level] = totals.spans_by_level.get(level, 0) + n
        totals.events_outside_iterations += report.events_outside_iterations
        totals.iterations_without_op_shapes += report.iterations_without_op_shapes
        if stored.memory_events is not None:
            totals.memory_events = (totals.memory_events or 0) + stored.memory_events
        totals.next_span_id = report.next_span_id
        totals.errors.extend(stored.errors)
        if self._on_stored is not None:
            try:
                self._on_stored(totals)
            except Exception as exc:  # the batch is stored: only run.json's update is late
                totals.errors.append(f"run.json not updated after batch {batch.part}: {exc}")
                log.exception("xsp: updating run.json after batch %s failed", batch.part)
        self._forget(batch)

    @staticmethod
    def _forget(batch: Batch) -> None:
        """The batch is stored (and run.json says so): its raw records go."""
        if batch.pending_arena is not None:
            batch.pending_arena.unlink(missing_ok=True)


def _level_drains(batch: Batch, contents: ArenaContents) -> Iterator[LevelDrain]:
    """Each level's drain of ``batch``: its records and loss counts come in one call."""
    for letter, drain in batch.drains.items():
        counts: RunCounts = {}  # a level that fails to drain counts nothing
        yield LevelDrain(letter, functools.partial(_drain, drain, contents, counts), counts.copy)


def _drain(drain: BatchDrain, contents: ArenaContents, counts: RunCounts) -> Any:
    """One level's records of a batch; its loss counts go into ``counts``."""
    records, level_counts = drain(contents)
    counts.update(level_counts)
    return records
