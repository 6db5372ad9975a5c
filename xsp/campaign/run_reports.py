"""Each successful job's own ``xsp analyze --report``, the campaign report's drill-down links:
``DIR/reports/<job>.html``, beside the runs rather than in them, on local disk and on an object
store alike. A run on an object store is a prefix published whole by its job
(``ObjectRuns``): nothing else may write into it, or a report made from one attempt could land
in the next attempt's prefix. ``DIR/reports/runs.json`` says which attempt each report was made
from (the job record's ``started``), so a job run again gets a new report, and the others are
kept across reports."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from xsp.campaign.records import JobRecord
from xsp.campaign.store import CampaignStore
from xsp.core.errors import StoreError
from xsp.core.store.json_io import read_json, write_json_atomic

__all__ = ["MADE_FROM", "REPORTS", "run_report", "write_run_reports"]

#: The folder of the runs' reports, in the campaign directory.
REPORTS = "reports"
#: Which attempt of its job each report was made from: ``{job: started}``.
MADE_FROM = "runs.json"


def run_report(store: CampaignStore, job: str) -> Path:
    """Where the report of ``job``'s run is."""
    return store.root / REPORTS / f"{job}.html"


def write_run_reports(store: CampaignStore, results: list[JobRecord], workers: int) -> None:
    """Each successful job's report, made again only where its job ran again since."""
    made_path = store.root / REPORTS / MADE_FROM
    try:
        made = read_json(made_path)
    except StoreError:  # none yet, or damaged: every report is made again
        made = {}
    todo = [
        r
        for r in results
        if r.get("status") == "ok"
        and not (run_report(store, r["job"]).exists() and made.get(r["job"]) == r.get("started"))
    ]

    def one(record: JobRecord) -> None:
        out = run_report(store, record["job"])
        out.unlink(missing_ok=True)  # another attempt's: never linked to this run
        out.parent.mkdir(parents=True, exist_ok=True)
        run_dir = store.runs_dir / record["job"]
        command = [sys.executable, "-m", "xsp", "analyze", str(run_dir), "--report", str(out)]
        subprocess.run(command, capture_output=True, check=False)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, todo))
    for record in todo:
        if run_report(store, record["job"]).exists():
            made[record["job"]] = record.get("started")
    if todo:
        write_json_atomic(made_path, made)
