"""Level M: one root span per iteration, bounded by device synchronization.

The iteration's start and end are read with ``time.time_ns()`` (CLOCK_REALTIME, the clock of the
profiler's and CUPTI's records) right after the device has drained, so the span's duration is the
true step latency, with no queued GPU work spilling into the next iteration.
"""

from __future__ import annotations

import time

from xsp.tracer.convert.records import StepRecords


class ModelLevel:
    letter = "M"

    def __init__(self, device: str) -> None:
        self._sync = _synchronizer(device)
        self._records = StepRecords()
        self._open: tuple[int, int] | None = None

    def enable(self) -> None:
        pass

    def begin_iteration(self, index: int) -> None:
        self._sync()
        self._open = (index, time.time_ns())

    def end_iteration(self, index: int) -> None:
        self._sync()
        end = time.time_ns()
        if self._open is None:
            return
        start_index, start = self._open
        self._open = None
        self._records.iteration.append(start_index)
        self._records.start_ns.append(start)
        self._records.end_ns.append(end)

    def disable(self) -> None:
        pass

    def drain(self) -> StepRecords:
        records, self._records = self._records, StepRecords()
        return records


def _synchronizer(device: str):  # type: ignore[no-untyped-def]
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
