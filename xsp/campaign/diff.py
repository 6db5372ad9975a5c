"""Two campaigns compared job by job: ``xsp campaign diff BEFORE AFTER``.

Jobs match by their id (model, mode, batch size). A job's figure is its untraced step: where
both campaigns kept the job's measurement (``DIR/runs/<job>/`` with an M run), the median of
its M run's steps, with the verdict of ``xsp.analysis.diff`` (a bootstrap of the difference of
medians over the steps); where either kept only the job's result (``DIR/jobs/<job>.json``), the
result's median step, and no verdict ("untested": a median alone says nothing of noise).
``xsp diff BEFORE/runs/<job> AFTER/runs/<job>`` compares one job's measurements in full.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np
import pyarrow as pa

from xsp.analysis import diff as diffs
from xsp.analysis.samples import step_samples
from xsp.campaign.records import JobRecord
from xsp.campaign.store import CampaignStore

__all__ = ["MISSING", "JobRow", "campaign_diff"]

#: What a job row says where one campaign lacks the job or its result is not ok.
MISSING = "missing"


def _step_samples(run_dir: Path) -> np.ndarray | None:
    """The job's M steps (ns), or None where its measurement was not kept or holds no M."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.core.errors import DamagedFileError, StoreError

    if not (run_dir / "M").is_dir():
        return None
    try:
        store = MeasurementStore(run_dir)
        return next(iter(step_samples(store).values.values()))
    except DamagedFileError:
        raise  # a kept measurement that is damaged is an error, never a fallback to medians
    except (StoreError, StopIteration):
        return None


def _step_ms(record: JobRecord | None) -> float | None:
    """The job's measured untraced step (M's median), which its M steps are compared by: not
    the replayed step its summary leads with, a model of it (a record from before has only
    ``latency_ms``, M's median then)."""
    if record is None or record.get("status") != "ok":
        return None
    summary = record.get("summary") or {}
    measured = summary.get("measured_latency_ms")
    return measured if measured is not None else summary.get("latency_ms")


class JobRow(TypedDict):
    """One job of ``campaign_diff``: its step before and after, the change and the verdict."""

    job: str
    before_ms: float | None
    after_ms: float | None
    change_ms: float | None
    change_pct: float | None
    verdict: str
    samples: str


def _job_row(
    job: str,
    before: CampaignStore,
    after: CampaignStore,
    records: tuple[JobRecord | None, JobRecord | None],
) -> JobRow:
    b_record, a_record = records
    b_ms, a_ms = _step_ms(b_record), _step_ms(a_record)
    row = JobRow(
        job=job,
        before_ms=b_ms,
        after_ms=a_ms,
        change_ms=None,
        change_pct=None,
        verdict=diffs.UNTESTED,
        samples="medians",
    )
    if b_ms is None or a_ms is None:
        row["verdict"] = MISSING
        return row
    b_steps = _step_samples(before.runs_dir / job)
    a_steps = _step_samples(after.runs_dir / job)
    if b_steps is not None and a_steps is not None and len(b_steps) and len(a_steps):
        b_ms, a_ms = float(np.median(b_steps)) / 1e6, float(np.median(a_steps)) / 1e6
        interval = diffs.bootstrap_interval(b_steps / 1e6, a_steps / 1e6)
        row["before_ms"], row["after_ms"] = b_ms, a_ms
        row["verdict"] = diffs.verdict(interval, "ms")
        row["samples"] = "steps"
    row["change_ms"] = a_ms - b_ms
    row["change_pct"] = 100.0 * (a_ms - b_ms) / b_ms if b_ms else None
    return row


def campaign_diff(before: CampaignStore, after: CampaignStore) -> pa.Table:
    """One row per job of either campaign: job, before_ms, after_ms, change_ms, change_pct,
    verdict (faster, slower, noise; untested from two medians; missing where a side has no
    successful result) and samples ("steps" or "medians"); largest change first."""
    before.spec()  # a directory that is no campaign is named
    after.spec()
    b = {r["job"]: r for r in before.results()}
    a = {r["job"]: r for r in after.results()}
    rows = [_job_row(job, before, after, (b.get(job), a.get(job))) for job in sorted({*b, *a})]
    rows.sort(key=lambda r: (r["change_ms"] is None, -abs(r["change_ms"] or 0.0), r["job"]))
    schema = pa.schema(
        [
            ("job", pa.string()),
            ("before_ms", pa.float64()),
            ("after_ms", pa.float64()),
            ("change_ms", pa.float64()),
            ("change_pct", pa.float64()),
            ("verdict", pa.string()),
            ("samples", pa.string()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)
