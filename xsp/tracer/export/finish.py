"""The finish of a run: its levels' records -> one span table -> the sinks and the store.

Every way a run ends comes here, through one ``RunFinish`` told the run's ``RunIdentity``: a
session that closes (``xsp.tracer.capture.session``), a continuous session's batches stored on
their exporter thread (``xsp.tracer.export.batches``) and the runner recovering the capture arena
of a process that died (``xsp.tracer.run.recover``, which reads the identity back from
run.json). Each step says what it lost in the words ``run.json`` keeps:

1. ``drain_levels``: each level's records, and what a level failed to drain.
2. ``RunFinish.store``: what the capture counted as lost (``capture_losses``: ranges other
   threads left open, a full arena, failed op callbacks, records CUPTI dropped or xsp could not
   decode); nothing stored when level M recorded nothing; else ``store_spans``: convert the
   records (``build_table``, which asks each level's registered conversion), export the table
   to the sink, keep level F's allocator events beside the spans, flush. It raises what
   conversion raises: each caller decides what that costs.
3. ``RunFinish.shut_down``: once the sinks are shut down, which of them failed
   (``sink_losses``). The store's failure leaves nothing usable; another sink's only loses its
   own copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from xsp.core import store
from xsp.core.levelset import LevelSet
from xsp.core.records import MonitorSamples
from xsp.core.run_sections import RunCounts
from xsp.tracer.convert.memory import memory_table
from xsp.tracer.convert.spans import ROOT_LEVEL, build_table
from xsp.tracer.convert.table import ConversionReport
from xsp.tracer.export.sinks import CompositeSink, Sink, SpanBatch

__all__ = [
    "NOTHING_RECORDED",
    "LevelDrain",
    "Losses",
    "RunFinish",
    "RunIdentity",
    "Stored",
    "capture_losses",
    "drain_levels",
    "sink_losses",
    "store_spans",
]

log = logging.getLogger(__name__)

#: The level whose records carry the allocators' events (kept beside the spans).
MEMORY_LEVEL = "F"
#: The fatal loss of a run whose root level left no records: there is nothing to convert.
NOTHING_RECORDED = f"level {ROOT_LEVEL} recorded nothing: no spans were converted"


@dataclass(frozen=True)
class RunIdentity:
    """Which run the spans belong to, as every finish of it stores them (a live session's, its
    batches', a recovery's from run.json)."""

    run_id: str
    measurement_id: str
    levels: LevelSet
    workload: str
    resource: Mapping[str, Any]
    run_dir: Path | None
    rank: int | None
    world_size: int | None


@dataclass
class Losses:
    """What a finish lost, one line each: ``fatal`` leaves nothing usable (status ``error``),
    ``missing`` leaves the run incomplete (status ``partial``)."""

    fatal: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass
class Stored:
    """What ``store_spans`` converted and kept."""

    report: ConversionReport
    converted_ns: int  # when conversion ended (and export began)
    memory_events: int | None = None  # None: no level F records, so no memory events to keep
    errors: list[str] = field(default_factory=list)  # what was lost without costing the spans

    def counts(self) -> RunCounts:
        """The conversion's counts, as ``run.json`` keeps them."""
        report = self.report
        counts: RunCounts = {
            "spans": report.spans,
            "spans_by_level": report.counts_by_level,
            "events_outside_iterations": report.events_outside_iterations,
        }
        if report.iterations_without_op_shapes:
            counts["iterations_without_op_shapes"] = report.iterations_without_op_shapes
        if api_joined := report.api_ops_by_id + report.api_ops_by_time:
            counts["api_ops"] = {
                "by_correlation_id": report.api_ops_by_id,
                "by_time": report.api_ops_by_time,
                "by_correlation_id_pct": round(100 * report.api_ops_by_id / api_joined, 3),
            }
        if report.graph_kernels:
            counts["graph_kernels"] = {
                "replayed": report.graph_kernels,
                "attributed_to_their_node": report.graph_kernels_attributed,
            }
        if self.memory_events is not None:
            counts["memory_events"] = self.memory_events
        return counts


def capture_losses(counts: RunCounts) -> list[str]:
    """One status reason per kind of record the capture lost, from the levels' own counts
    (``Level.counts()``: ``ranges_left_open``, ``arena``, ``cupti``, ``program_profiler``)."""
    lost = []
    if counts.get("ranges_left_open"):
        lost.append(
            f"{counts['ranges_left_open']} ranges other threads still had open when the "
            "levels stopped were left out"
        )
    arena = counts.get("arena") or {}
    if arena.get("dropped_records"):
        lost.append(
            f"the capture arena was full: {arena['dropped_records']} records dropped "
            "(raise XSP_ARENA_MB)"
        )
    if arena.get("callback_errors"):
        first = arena.get("first_callback_error")  # the native core's; a dead arena's is gone
        lost.append(
            f"{arena['callback_errors']} op records failed inside the callback"
            + (f" (first: {first})" if first is not None else "")
        )
    cupti = counts.get("cupti") or {}
    if cupti.get("dropped_records"):
        lost.append(f"CUPTI dropped {cupti['dropped_records']} records (buffers full)")
    if cupti.get("undecodable_records"):
        lost.append(f"{cupti['undecodable_records']} CUPTI records could not be decoded")
    if cupti.get("start_failures"):
        lost.append(f"CUPTI would not start for {cupti['start_failures']} sampled iterations")
    program = counts.get("program_profiler") or {}
    if program.get("spans_missing"):  # xsp stepped aside for the program's torch.profiler
        lost.append(str(program["line"]))
    return lost


def store_spans(
    records: Mapping[str, Any],
    sink: Sink,
    run: RunIdentity,
    *,
    failures: dict[int, str] | None = None,
    monitor: MonitorSamples | None = None,
    first_span_id: int = 1,
    part: str | None = None,
) -> Stored:
    """Convert ``records`` (level letter -> its records) into ``run``'s span table, export it
    to ``sink`` and keep the memory events in its run directory; raises what conversion raises.

    A continuous session stores each batch of iterations this way (``xsp.tracer.export.
    batches``): ``part`` names its files (``spans-<part>.parquet``, ``memory-<part>.parquet``)
    and ``first_span_id`` goes on from the batch before (``Stored.report.next_span_id``)."""
    table, report = build_table(
        run.run_id,
        run.levels,
        records,
        failures,
        monitor=monitor,
        rank=run.rank,
        world_size=run.world_size,
        first_span_id=first_span_id,
    )
    stored = Stored(report, converted_ns=time.time_ns())
    if report.iterations_without_op_shapes:
        log.warning(
            "xsp: %d measured iteration(s) ran other ops or input shapes than the "
            "first and have no op shapes (XSP_OP_SHAPES=every records them in each)",
            report.iterations_without_op_shapes,
        )
    sink.export(SpanBatch.of(run.resource, table, part))
    if records.get(MEMORY_LEVEL) is not None:
        memory = records[MEMORY_LEVEL].memory
        stored.memory_events = _store_memory(run.run_dir, memory, table, stored, part)
    sink.force_flush()
    return stored


def _store_memory(
    run_dir: Path | None, memory: Any, table: pa.Table, stored: Stored, part: str | None
) -> int:
    """Keep level F's allocator events, attributed to spans: RUN_DIR/<levels>/memory.parquet.
    Returns how many were stored."""
    try:  # the spans are exported by now: a failure here only loses the memory events
        events = memory_table(memory, table)
        if run_dir is None or events is None:
            return 0
        store.write_memory_events(run_dir, events, part)
    except Exception as exc:
        stored.errors.append(f"memory events not stored: {type(exc).__name__}: {exc}")
        log.exception("xsp: storing the memory events failed")
        return 0
    return int(events.num_rows)


def sink_losses(sink: CompositeSink, store_sink: Sink | None, losses: Losses) -> bool:
    """Add the failures of ``sink``'s members (shut down by now) to ``losses``; returns whether
    ``store_sink`` (the run's store) was among them."""
    store_failed = False
    for failed in sink.failed:
        reasons = [e for e in sink.errors if e.startswith(type(failed).__name__ + ".")]
        reason = reasons[0] if reasons else failed
        if failed is store_sink:
            losses.fatal.append(f"the spans could not be stored: {reason}")
            store_failed = True
        else:
            losses.missing.append(f"a sink failed: {reason}")
    return store_failed


@dataclass(frozen=True)
class LevelDrain:
    """One level's drain: its records, then its loss counts (asked whether the drain worked or
    not: a level that failed to drain may still have counted what it dropped)."""

    letter: str
    records: Callable[[], Any]
    loss_counts: Callable[[], RunCounts]


def drain_levels(
    drains: Iterable[LevelDrain],
    counts: RunCounts,
    failed: Callable[[str], None],
    where: str = "",
) -> dict[str, Any]:
    """Each level's records, by letter, and its loss counts into ``counts``. A level that fails
    to drain is told to ``failed`` (one line) and the others drain on; ``where`` names the
    batch in the log."""
    # open: by the letters of the levels that drained, each its own level's records
    records: dict[str, Any] = {}
    for drain in drains:
        try:
            records[drain.letter] = drain.records()
        except Exception as exc:
            failed(f"level {drain.letter} failed to drain: {exc}")
            log.exception("xsp: level %s failed to drain%s", drain.letter, where)
        counts.update(drain.loss_counts())
    return records


class RunFinish:
    """One run's finish, whoever drives it: its records stored through ``sink`` (one part, or a
    continuous run's parts in order), then the sinks shut down. ``store_sink``: the run's store
    among the sinks, whose failure leaves nothing usable."""

    def __init__(self, run: RunIdentity, sink: Sink, store_sink: Sink | None = None) -> None:
        self.run = run
        self.sink = sink
        self.store_sink = store_sink

    def store(
        self,
        records: Mapping[str, Any],
        counts: RunCounts,
        losses: Losses,
        *,
        failures: dict[int, str] | None = None,
        monitor: MonitorSamples | None = None,
        first_span_id: int = 1,
        part: str | None = None,
        skip_without_iterations: bool = False,
    ) -> Stored | None:
        """Note what the capture lost (``counts``: the levels' own), then convert and export
        ``records`` (``store_spans``, which raises what conversion raises). None when there is
        nothing to store: level M recorded nothing (fatal), or, with
        ``skip_without_iterations`` (a continuous run's batch), no iteration."""
        losses.missing.extend(capture_losses(counts))
        steps = records.get(ROOT_LEVEL)
        if steps is None:
            losses.fatal.append(NOTHING_RECORDED)
            return None
        if skip_without_iterations and not len(steps.iteration):
            return None
        return store_spans(
            records,
            self.sink,
            self.run,
            failures=failures,
            monitor=monitor,
            first_span_id=first_span_id,
            part=part,
        )

    def shut_down(self, losses: Losses) -> tuple[list[str], bool]:
        """Flush and close the sinks; returns their errors and whether the store failed (its
        spans are then not stored)."""
        self.sink.shutdown()
        if not isinstance(self.sink, CompositeSink):  # a lone sink raises what fails
            return [], False
        return list(self.sink.errors), sink_losses(self.sink, self.store_sink, losses)
