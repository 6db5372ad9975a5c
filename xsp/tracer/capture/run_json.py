"""A session's run.json: its fields in order as the run goes, and a finished run's status.

``RunJson`` reads what the session's parts hold (its identity, its ``RunRecord``, its schedule,
warm-up clock, markers and errors) and writes run.json through ``RunOutput`` (one writer at a
time). The status is honest about what got lost (``finished``).
"""

from __future__ import annotations

import time
from typing import Any

from xsp.core import schema
from xsp.core.run_sections import RunCounts
from xsp.core.store import Status
from xsp.tracer.capture import interleave
from xsp.tracer.capture.markers import IterationMarkers
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_output import RunOutput, run_status
from xsp.tracer.capture.run_record import RunRecord
from xsp.tracer.capture.schedule import Schedule
from xsp.tracer.capture.warmup import WarmupClock
from xsp.tracer.export.finish import Losses

__all__ = ["RunJson"]


class RunJson:
    """Writes one session's run.json."""

    def __init__(
        self,
        output: RunOutput,
        record: RunRecord,
        errors: RunErrors,
        schedule: Schedule,
        warmup: WarmupClock,
        markers: IterationMarkers,
        interleaved: interleave.Interleave | None,
        interleave_skipped: str | None,
    ) -> None:
        self._output = output
        self._record = record
        self._errors = errors
        self._schedule = schedule
        self._warmup = warmup
        self._markers = markers
        self._interleaved = interleaved
        self._interleave_skipped = interleave_skipped

    def write(
        self,
        status: Status,
        error: str | None = None,
        measured: int = 0,
        reasons: list[str] | None = None,
        counts: RunCounts | None = None,
    ) -> dict[str, Any]:
        """Write run.json as it stands (``status_reasons``, then ``counts`` last); returns it."""
        return self._output.write_meta(
            lambda: self._meta(status, error, measured, reasons, counts or {})
        )

    def finished(
        self,
        error: str | None,
        interrupted: bool,
        counts: RunCounts,
        losses: Losses,
        stored: int | None = None,
    ) -> dict[str, Any]:
        """The run's status and its reasons, written into run.json; returns run.json.
        ``stored``: a continuous session's iterations stored (its batches')."""
        schedule, failures = self._schedule, self._record.failures
        iterations, warmup = schedule.iterations, schedule.warmup
        # as the summary counts them: the measured iterations that ended, less the failed ones
        ended = schedule.measured_ended()
        measured = max(0, ended - len(failures))
        if stored is not None:  # a batch lost (its conversion failed) is not measured
            measured = max(0, min(measured, stored - len(failures)))
        asked = str(iterations) if iterations else "an unlimited number of"
        if measured == 0 and not interrupted and error is None:
            why = self._markers.why_none(schedule.index, warmup)
            losses.fatal.append(f"0 of {asked} iterations measured: {why}")
        elif schedule.stopped_at is None and iterations and measured < iterations:
            why = ""
            if self._interleaved is not None:  # the program ran out of steps for both kinds
                why = (
                    f" (this process ran an untraced iteration before each traced one: the "
                    f"program needs {warmup + 2 * iterations} steps, --warmup plus "
                    "twice --iterations, or give --no-interleave)"
                )
            losses.missing.append(f"{measured} of {iterations} iterations measured{why}")
        elif stored is not None and measured < ended - len(failures):
            losses.missing.append(f"{measured} of {ended} iterations stored")
        error = error or self._record.level_failure or (losses.fatal[0] if losses.fatal else None)
        reasons = [r for r in [error, *losses.fatal, *losses.missing] if r]
        return self.write(
            run_status(error, interrupted, losses),
            error=error,
            measured=measured,
            reasons=list(dict.fromkeys(reasons)),
            counts=counts,
        )

    def _meta(
        self,
        status: Status,
        error: str | None,
        measured: int,
        reasons: list[str] | None,
        counts: RunCounts,
    ) -> dict[str, Any]:
        """run.json as it stands (its keys in the order the file has them; ``RunMeta`` reads
        it back)."""
        run, record, schedule = self._output.identity, self._record, self._schedule
        return {
            "format": schema.STORE_FORMAT,
            "run_id": run.run_id,
            "measurement_id": run.measurement_id,
            "levels": run.levels,
            "workload": run.workload,
            "resource": dict(run.resource),
            "status": status.value,
            "error": error,
            "iterations_requested": schedule.iterations,
            "iterations_measured": measured,
            "iteration_boundary": self._markers.boundary(schedule.index),
            "warmup": schedule.warmup,
            **self._warmup.report(),
            **interleave.run_entry(self._interleaved, self._interleave_skipped),
            **({"levels_on_early": record.levels_on_early} if record.levels_on_early else {}),
            "failed_iterations": {str(k): v for k, v in sorted(record.failures.items())},
            "errors": list(self._errors.lines),
            "started_ns": record.started_ns,
            "phases_ns": dict(record.phases_ns),
            "switch_on_ms": dict(record.switch_on_ms),
            **({"host": dict(record.host)} if record.host else {}),
            "finished_ns": time.time_ns() if status is not Status.RUNNING else None,
            "files": self._output.files(),
            **({"program": dict(record.program)} if record.program is not None else {}),
            **({"rank": run.rank, "world_size": run.world_size} if run.rank is not None else {}),
            **({"status_reasons": reasons} if reasons is not None else {}),
            **counts,
        }
