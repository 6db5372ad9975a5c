"""GPU monitor samples onto model spans: each metric's mean over each step (pure)."""

from __future__ import annotations

from xsp.core.records import FIELDS, MonitorSamples

__all__ = ["summarize"]


def summarize(
    samples: MonitorSamples, starts: list[int], ends: list[int]
) -> dict[str, list[float | None]]:
    """Mean of each metric over each step: the samples taken inside it, or, for a step shorter
    than the sampling interval, the first sample after it (whose window covers the step)."""
    import numpy as np

    times = np.asarray(samples.time_ns, dtype=np.int64)
    out: dict[str, list[float | None]] = {name: [] for name in FIELDS}
    for start, end in zip(starts, ends, strict=True):
        rows = np.nonzero((times >= start) & (times <= end))[0]
        if len(rows) == 0:
            after = np.nonzero(times > end)[0]
            rows = after[:1]
        for name in FIELDS:
            values = [samples.values[name][i] for i in rows]
            present = [v for v in values if v is not None]
            out[name].append(float(np.mean(present)) if present else None)
    return out
