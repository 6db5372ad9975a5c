"""The finish of a run: its levels' records -> one span table -> the sinks and the store.

Both ways a run ends come here: a session that closes (``xsp.tracer.capture.session``) and the
runner recovering the capture arena of a process that died (``xsp.tracer.run.recover``). Each
step is one function, and each says what it lost in the words ``run.json`` keeps:

1. ``capture_losses``: what the capture counted as lost (ranges other threads left open, a full
   arena, failed op callbacks, records CUPTI dropped or xsp could not decode).
2. ``store_spans``: convert the records (``build_table``, which asks each level's registered
   conversion), export the table to the sink, keep level F's allocator events beside the spans,
   flush. It raises what conversion raises: each caller decides what that costs.
3. ``sink_losses``: once the sinks are shut down, which of them failed. The store's failure
   leaves nothing usable; another sink's only loses its own copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from xsp.core import store
from xsp.core.records import MonitorSamples
from xsp.tracer.convert.memory import memory_table
from xsp.tracer.convert.spans import build_table
from xsp.tracer.convert.table import ConversionReport
from xsp.tracer.export.sinks import CompositeSink, Sink, SpanBatch

log = logging.getLogger(__name__)

#: The level whose records carry the allocators' events (kept beside the spans).
MEMORY_LEVEL = "F"


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

    def counts(self) -> dict[str, Any]:
        """The conversion's counts, as ``run.json`` keeps them."""
        report = self.report
        counts: dict[str, Any] = {
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


def capture_losses(counts: Mapping[str, Any]) -> list[str]:
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
    *,
    run_id: str,
    levels: str,
    resource: Mapping[str, Any],
    run_dir: Path | None,
    failures: dict[int, str] | None = None,
    monitor: MonitorSamples | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    first_span_id: int = 1,
    part: str | None = None,
) -> Stored:
    """Convert ``records`` (level letter -> its records) into the run's span table, export it
    to ``sink`` and keep the memory events in ``run_dir``; raises what conversion raises.

    A continuous session stores each batch of iterations this way (``xsp.tracer.export.
    batches``): ``part`` names its files (``spans-<part>.parquet``, ``memory-<part>.parquet``)
    and ``first_span_id`` goes on from the batch before (``Stored.report.next_span_id``)."""
    table, report = build_table(
        run_id,
        levels,
        records,
        failures,
        monitor=monitor,
        rank=rank,
        world_size=world_size,
        first_span_id=first_span_id,
    )
    stored = Stored(report, converted_ns=time.time_ns())
    if report.iterations_without_op_shapes:
        log.warning(
            "xsp: %d measured iteration(s) ran other ops or input shapes than the "
            "first and have no op shapes (XSP_OP_SHAPES=every records them in each)",
            report.iterations_without_op_shapes,
        )
    sink.export(SpanBatch.of(resource, table, part))
    if records.get(MEMORY_LEVEL) is not None:
        memory = records[MEMORY_LEVEL].memory
        stored.memory_events = _store_memory(run_dir, memory, table, stored, part)
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
