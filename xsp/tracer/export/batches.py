"""A continuous session's export while it runs: batches of finished iterations, stored in the
background through the one finish pipeline (``xsp.tracer.export.finish.store_spans``).

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

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xsp.core.arena import ArenaContents, read_arena
from xsp.core.errors import StoreError
from xsp.tracer.convert.spans import ROOT_LEVEL
from xsp.tracer.export.finish import capture_losses, store_spans
from xsp.tracer.export.sinks import Sink

log = logging.getLogger(__name__)

#: Batches waiting to be stored, beyond the one being stored.
QUEUE_BATCHES = 2


#: A level's drain of one batch (``handover``): its records, and its loss counts, from the
#: batch's arena contents.
BatchDrain = Callable[[ArenaContents], tuple[Any, dict[str, Any]]]


@dataclass
class Batch:
    """One batch: each level's drain (level letter -> drain), where its arena waits (None: the
    levels never wrote one), and the arena's native counts that its file does not hold."""

    part: str
    drains: dict[str, BatchDrain]
    failures: dict[int, str] = field(default_factory=dict)
    pending_arena: Path | None = None
    arena_counts: dict[str, Any] = field(default_factory=dict)


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

    def counts(self) -> dict[str, Any]:
        counts: dict[str, Any] = {
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
        self,
        sink: Sink,
        *,
        run_id: str,
        levels: str,
        resource: Mapping[str, Any],
        run_dir: Path | None,
        rank: int | None = None,
        world_size: int | None = None,
        on_stored: Callable[[Totals], None] | None = None,
    ) -> None:
        self._sink = sink
        self._args: dict[str, Any] = dict(
            run_id=run_id,
            levels=levels,
            resource=resource,
            run_dir=run_dir,
            rank=rank,
            world_size=world_size,
        )
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

    def _drain(self, batch: Batch) -> dict[str, Any]:
        """Each level's records of ``batch``, read from its arena; what a level lost, or failed
        to drain, goes into ``missing``."""
        totals = self.totals
        contents = ArenaContents.empty()
        if batch.pending_arena is not None:
            contents = read_arena(batch.pending_arena)
        contents.counts.update(batch.arena_counts)
        records: dict[str, Any] = {}
        counts: dict[str, Any] = {}
        for letter, drain in batch.drains.items():
            try:
                records[letter], level_counts = drain(contents)
            except Exception as exc:
                message = f"level {letter} failed to drain: {exc}"
                totals.errors.append(message)
                totals.missing.append(message)
                log.exception("xsp: level %s failed to drain batch %s", letter, batch.part)
                continue
            counts.update(level_counts)
        totals.missing.extend(capture_losses(counts))
        return records

    def _store(self, batch: Batch) -> None:
        totals = self.totals
        try:
            records = self._drain(batch)
        except StoreError as exc:  # its arena cannot be read
            totals.lost_batches.append(f"batch {batch.part} was not read: {exc}")
            log.error("xsp: reading batch %s failed: %s", batch.part, exc)
            return
        steps = records.get(ROOT_LEVEL)
        if steps is None or not len(steps.iteration):
            self._forget(batch)  # a batch without an iteration (the levels came on, then stop)
            return
        try:
            stored = store_spans(
                records,
                self._sink,
                failures=batch.failures,
                first_span_id=totals.next_span_id,
                part=batch.part,
                **self._args,
            )
        except Exception as exc:
            where = (
                f" (its raw records are kept in {batch.pending_arena})"
                if batch.pending_arena
                else ""
            )
            message = (
                f"batch {batch.part} ({len(steps.iteration)} iterations) was not converted: "
                f"{type(exc).__name__}: {exc}{where}"
            )
            totals.lost_batches.append(message)
            log.exception("xsp: converting batch %s failed", batch.part)
            return
        report = stored.report
        totals.batches += 1
        totals.iterations += len(steps.iteration)
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
