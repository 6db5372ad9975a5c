"""``xsp campaign verify``: ``xsp verify`` over each finished job of a campaign, one job at a
time (paired rounds need the GPU to themselves), and the what-if table it yields: each fix's
measured change of the step, job by job ("channels_last: -28.7% on torchvision:resnet50 b64
train").

A job that cannot be verified (no suggestions, a workload that cannot run here again) is
recorded with its one-line reason, and the campaign moves on. ``DIR/verify.json`` holds every
job's rows, written again as each job ends; each job's runs are in its own measurement's
``verify/`` (``xsp.campaign.verify``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import NotRequired, TypedDict

from xsp.campaign import verify as verifying
from xsp.campaign.store import CampaignStore
from xsp.core import store as run_store
from xsp.core.errors import XspError

RESULT_FILE = "verify.json"


class JobVerification(TypedDict):
    """A job's entry of ``DIR/verify.json``: which job, whether it was verified (else why
    not), and its rows (``verify.Row``)."""

    job: str
    model: str
    mode: str
    batch_size: int
    status: NotRequired[str]
    why: NotRequired[str | None]
    rows: NotRequired[list[verifying.Row]]


class CampaignVerification(TypedDict):
    """``DIR/verify.json``, and what ``xsp campaign verify --json`` prints."""

    rounds: int
    jobs: list[JobVerification]
    interrupted: bool


class WhatIf(TypedDict):
    """A row of the what-if table: a fix's measured change of one job's step."""

    fix: str | None
    rule: str
    job: str  # model b<batch> mode
    estimated_ms: float | None
    measured_ms: float | None
    measured_ci_ms: list[float] | None
    step_change_pct: float | None
    numerics_change: bool


#: (job id, what is running, runs done, runs in all) -> None
JobProgress = Callable[[str, str, int, int], None]


def verify_campaign(
    campaign: CampaignStore,
    rounds: int = verifying.DEFAULT_ROUNDS,
    only: Sequence[str] = (),
    progress: JobProgress | None = None,
    rules: Sequence[str] = (),
    in_process: bool = False,
) -> CampaignVerification:
    """Verify the suggestions of every finished job (those whose model matches a glob of
    ``only``, and the suggestions of ``rules``, when given), each fix alternating inside each
    round's process where ``in_process``; returns ``DIR/verify.json``'s document."""
    jobs = [j for j in campaign.spec().jobs() if (r := campaign.result(j)) and r["status"] == "ok"]
    if only:
        jobs = [j for j in jobs if any(fnmatch.fnmatch(j.model, g) for g in only)]
    if not jobs:
        raise XspError(f"{campaign.root}: no finished job to verify")
    document = CampaignVerification(rounds=rounds, jobs=[], interrupted=False)
    for job in jobs:
        entry = JobVerification(
            job=job.id, model=job.model, mode=job.mode, batch_size=job.batch_size
        )
        document["jobs"].append(entry)
        try:
            planned = verifying.plan(campaign.run_dir(job), rounds, rules, in_process)
        except XspError as exc:
            entry["status"], entry["why"], entry["rows"] = "not verified", str(exc), []
            continue

        def forward(rule: str, what: str, done: int, total: int, job_id: str = job.id) -> None:
            if progress is not None:
                progress(job_id, f"{rule}: {what}", done, total)

        found = verifying.run_plan(planned, forward)
        entry["status"], entry["why"], entry["rows"] = "verified", None, found.rows
        run_store.write_json_atomic(campaign.root / RESULT_FILE, document)
        if found.interrupted:
            document["interrupted"] = True
            break
    run_store.write_json_atomic(campaign.root / RESULT_FILE, document)
    return document


def what_if(document: CampaignVerification) -> list[WhatIf]:
    """One row per measured fix and job, largest relative change first: fix, rule, job (model
    b<batch> mode), estimated and measured ms per iteration, the interval, the change of the
    step (negative: faster), whether numerics change."""
    rows = []
    for job in document["jobs"]:
        for row in job["rows"]:
            if row["status"] != verifying.MEASURED:
                continue
            pct = row["measured_gain_pct"]
            rows.append(
                WhatIf(
                    fix=verifying.fix_for(row["rule"]),
                    rule=row["rule"],
                    job=f"{job['model']} b{job['batch_size']} {job['mode']}",
                    estimated_ms=row["predicted_gain_ms_per_iteration"],
                    measured_ms=row["measured_gain_ms_per_iteration"],
                    measured_ci_ms=row["measured_gain_ci_ms"],
                    step_change_pct=-pct if pct is not None else None,
                    numerics_change=row["numerics_change"],
                )
            )
    rows.sort(key=lambda r: (r["fix"], r["step_change_pct"] or 0.0))
    return rows


def what_if_line(row: WhatIf) -> str:
    """``channels_last: -28.7% on torchvision:resnet50 b64 train (measured 9.41 ms ± 0.30,
    estimated 3.42 ms)``."""
    interval = row["measured_ci_ms"]
    assert interval is not None  # a measured fix has its interval
    low, high = interval
    change = row["step_change_pct"]
    estimated = row["estimated_ms"]
    return (
        f"{row['fix']}: {f'{change:+.1f}%' if change is not None else '?'} on {row['job']} "
        f"(measured {row['measured_ms']:.2f} ms ± {(high - low) / 2:.2f}"
        + (f", estimated {estimated:.2f} ms" if estimated is not None else "")
        + (", changes numerics" if row["numerics_change"] else "")
        + ")"
    )


__all__ = ["RESULT_FILE", "verify_campaign", "what_if", "what_if_line"]
