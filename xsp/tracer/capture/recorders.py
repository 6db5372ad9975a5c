"""A session's recorders switched on and off together: the levels (``LevelStack``), the
calibration that prices level F's cost, the GPU monitor (NVML) and inductor's provenance.

Their switch-on is timed part by part into run.json's ``switch_on_ms``; their switch-off counts
what each kept into the run's counts.
"""

from __future__ import annotations

import time

import torch

from xsp.core import schema
from xsp.core.levelset import LevelSet
from xsp.core.records import MonitorSamples
from xsp.core.run_sections import RunCounts
from xsp.tracer.capture.calibrate import Calibration
from xsp.tracer.capture.level_stack import LevelStack
from xsp.tracer.capture.levels import LevelContext
from xsp.tracer.capture.monitor import GpuMonitor
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.capture.run_output import RunOutput
from xsp.tracer.capture.run_record import RunRecord

__all__ = ["Recorders"]


class Recorders:
    """The levels, the calibration and the monitor of one session."""

    def __init__(
        self,
        levels: LevelSet,
        device: str,
        stack: LevelStack,
        context: LevelContext,
        output: RunOutput,
        errors: RunErrors,
        record: RunRecord,
        *,
        monitor: bool,
        calibrates: bool,
    ) -> None:
        self._levels = levels
        self._stack = stack
        self._context = context
        self._output = output
        self._errors = errors
        self._record = record
        self._calibrates = calibrates
        self._calibration: Calibration | None = None
        self._monitor: GpuMonitor | None = None
        if monitor and device.startswith("cuda"):
            index = torch.device(device).index
            self._monitor = GpuMonitor(index if index is not None else torch.cuda.current_device())

    def switch_on(self) -> None:
        """Calibration, monitor and levels on, each part's time in ``switch_on_ms``."""
        record = self._record
        mark = record.mark("levels_on")

        def took(what: str) -> None:  # the switch-on's parts, in run.json's switch_on_ms
            nonlocal mark
            now = time.time_ns()
            record.switch_on_ms[what] = round((now - mark) / 1e6, 2)
            mark = now

        if self._levels.framework and self._calibrates:  # the replay takes F's cost off host times
            self._calibration = Calibration()
            self._calibration.before()
            took(schema.CALIBRATION_PARTS[0])
        if self._monitor is not None:
            reason = self._monitor.start()
            if reason:
                self._errors.add(reason)
            took("monitor")
        failure = self._stack.enable(took)
        record.level_failure = record.level_failure or failure
        if self._calibration is not None:
            priced = self._stack.priced()
            if priced is not None:  # F's records are what it prices
                # F records the ops' shapes in its first measured iteration only: timed both ways
                shapes = priced.set_shapes if priced.shapes_in_first_iteration_only else None
                self._calibration.after(self._context.arena.records_written, priced.sample, shapes)
            took(schema.CALIBRATION_PARTS[1])
        record.mark("enabled")
        record.note_host("measuring")

    def calibration_counts(self) -> RunCounts:
        """The run's counts, begun with the calibration's result (if it priced level F)."""
        if self._calibration is not None and self._calibration.result is not None:
            return {"calibration": self._calibration.result}
        return {}

    def end_provenance(self, counts: RunCounts) -> None:
        """Inductor's provenance is no longer recorded: its counts go into ``counts``."""
        counts.update(self._context.provenance.counts())
        self._context.uninstall_provenance()

    def stop_monitor(self, counts: RunCounts) -> MonitorSamples | None:
        """Stop NVML sampling; keep the samples beside the spans and count them."""
        samples = self._monitor.stop() if self._monitor is not None else None
        if samples is not None:
            self._output.monitor_counts(samples, counts)
        return samples
