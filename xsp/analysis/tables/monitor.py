"""The monitor summary: what the GPU did during each level-set run, from the NVML/GPM samples
summarized onto model spans. SM active and occupancy are set beside NVML's "utilization", which
only says that some kernel was running."""

from __future__ import annotations

import pyarrow as pa

from xsp.analysis.measurement.store import MeasurementStore
from xsp.core.schema import MONITOR_SUMMARIES

__all__ = ["monitor_summary"]


def monitor_summary(store: MeasurementStore) -> pa.Table:
    """levels, then the mean over iterations of each ``gpu_*`` summary column (null without a
    monitor); runs without samples are left out."""
    means = ", ".join(f"avg(gpu_{name}) AS {name}" for name in MONITOR_SUMMARIES)
    return store.sql(
        f"""SELECT levels, {means} FROM spans WHERE kind = 'step'
            GROUP BY levels, run_index HAVING count(gpu_power_w) > 0 ORDER BY run_index"""
    )
