"""``xsp campaign``: run, report, verify, query (SQL) and compare batch characterizations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from xsp.campaign.object_runs import COMMITTED, STAGED
from xsp.cli.common import (
    IN_PROCESS_HELP,
    bar_per_key,
    console,
    fail,
    out_console,
    stdout_to_stderr,
    store_location,
)
from xsp.cli.render import print_table
from xsp.core.errors import EXIT_INTERRUPTED, StoreError, XspError

if TYPE_CHECKING:
    from collections.abc import Callable

    from xsp.campaign.object_runs import ObjectRuns
    from xsp.campaign.records import JobRecord
    from xsp.campaign.spec import Job
    from xsp.campaign.store import CampaignStore

__all__ = [
    "campaign",
    "campaign_diff",
    "campaign_report",
    "campaign_run",
    "campaign_sql",
    "campaign_verify",
]


@click.group()
def campaign() -> None:
    """Batch characterization: a models x batch sizes x modes matrix of leveled runs."""


@campaign.command("run")
@click.argument("campaign_file", type=click.Path(path_type=Path))
@click.option(
    "--out",
    # on an object store: the spec and job records staged; each job publishes its own run
    type=store_location(writes=True, only=STAGED),
    required=True,
    help="Campaign directory (or s3://bucket/prefix).",
)
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", help="Ray cluster address (auto, ray://host:10001); default: local.")
@click.option("--parallel", type=int, help="Jobs at a time (default: one per GPU; 1 on CPU).")
@click.option("--limit", type=int, help="Run at most this many pending jobs (a part).")
@click.option("--only", help="Run only models matching these comma-separated globs (a part).")
def campaign_run(
    campaign_file: Path,
    out: Path,
    executor: str,
    address: str | None,
    parallel: int | None,
    limit: int | None,
    only: str | None,
) -> None:
    """Run (or resume) a campaign: finished jobs are skipped, failed ones retried; a failing
    job is recorded with its reason and the campaign moves on."""
    import time

    from rich.progress import TimeRemainingColumn

    from xsp.campaign import executor as executors
    from xsp.campaign.files import load
    from xsp.campaign.object_runs import ObjectRuns
    from xsp.campaign.store import CampaignStore
    from xsp.campaign.summary import job_line

    spec = load(campaign_file)
    store = CampaignStore(out)
    store.begin(spec)
    remote = ObjectRuns.of_staged(out)  # --out s3://...: out is a copy of its records
    jobs = spec.jobs()
    pending = _part(store.pending(jobs), only, limit)
    if executor == "ray":  # a cluster that is not there is one line, before any other
        from xsp.campaign.ray_connection import connect
        from xsp.campaign.ray_executor import RAY_LOG

        connect(address, out / RAY_LOG)
    console.print(
        f"campaign {spec.name}: {len(jobs)} jobs, {len(jobs) - len(store.pending(jobs))} done, "
        f"running {len(pending)}",
        highlight=False,
    )
    failed = finished = 0
    began = time.monotonic()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("jobs", total=len(pending))
        keep = _keeper(store, remote, pending, publishes=executor == "local")

        def done(record: JobRecord) -> None:
            nonlocal failed, finished
            record = keep(record)
            finished += 1
            if record["status"] != "ok":
                failed += 1
                bar.console.print(
                    f"[red]{record['job']}[/]: {record['reason']}: {record.get('error') or ''}",
                    highlight=False,
                )
            elif not bar.console.is_terminal:  # a log has no bar to watch: a line per job
                bar.console.print(
                    job_line(record, finished, len(pending), time.monotonic() - began),
                    highlight=False,
                    soft_wrap=True,
                )
            bar.update(task, advance=1, description=record["job"])

        if executor == "ray":
            from xsp.campaign.ray_executor import run_ray

            run_ray(spec, store, pending, done, address, remote.uri if remote else None)
        else:
            executors.run_local(spec, store, pending, done, parallel)
    console.print(
        f"{len(pending) - failed} jobs ok, {failed} failed; results in {out}", highlight=False
    )
    if failed:
        fail(f"{failed} of {len(pending)} jobs failed; their reasons are in {out}/jobs", code=1)


def _keeper(
    store: CampaignStore, remote: ObjectRuns | None, jobs: list[Job], publishes: bool
) -> Callable[[JobRecord], JobRecord]:
    """How a finished job is kept: its record saved; on an object store (``remote``) its run
    published first (``publishes``: by the driver, as the local executor ran it there; a Ray
    job published its own) and its record stored at once, so a driver killed later keeps it.
    A run the store refused is the job's failure, ``unstored``, as on Ray (a rerun retries
    it), never the campaign's end: the record as kept."""
    by_id = {job.id: job for job in jobs}

    def keep(record: JobRecord) -> JobRecord:
        job = by_id[record["job"]]
        if remote is not None and publishes:
            try:
                remote.commit(job, store.run_dir(job))
            except StoreError as exc:  # the run is gone with its scratch copy: redo it
                from xsp.campaign.records import unstored

                record = unstored(record, exc)
        store.save(record)
        if remote is not None:
            remote.record(store.root)
        return record

    return keep


def _part(pending: list[Job], only: str | None, limit: int | None) -> list[Job]:
    """The pending jobs this command runs: those whose model matches one of ``only``'s
    comma-separated globs, at most ``limit`` of them."""
    if only:
        import fnmatch

        globs = [g.strip() for g in only.split(",") if g.strip()]
        pending = [j for j in pending if any(fnmatch.fnmatch(j.model, g) for g in globs)]
    return pending if limit is None else pending[:limit]


@campaign.command("report")
@click.argument("campaign_dir", type=store_location(writes=True, committed=COMMITTED))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Default: DIR/report.html.")
@click.option(
    "--run-reports/--no-run-reports",
    default=True,
    show_default=True,
    help="Also make each run's own report (the drill-down links).",
)
def campaign_report(campaign_dir: Path, output: Path | None, run_reports: bool) -> None:
    """Write the campaign's comparative HTML report."""
    from xsp.campaign.report import write_campaign_report
    from xsp.campaign.store import CampaignStore

    output = output or campaign_dir / "report.html"
    count = write_campaign_report(CampaignStore(campaign_dir), output, run_reports)
    console.print(f"wrote the report of {count} jobs to {output}", highlight=False)


@campaign.command("verify")
@click.argument("campaign_dir", type=click.Path(path_type=Path))
@click.option(
    "--rounds",
    type=int,
    default=3,
    show_default=True,
    help="Rounds per fix (paired processes, or --in-process processes).",
)
@click.option("--only", help="Verify only models matching these comma-separated globs.")
@click.option("--rule", "rules", multiple=True, help="Verify only this rule (repeatable).")
@click.option("--in-process", is_flag=True, help=IN_PROCESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print DIR/verify.json's object.")
def campaign_verify(
    campaign_dir: Path,
    rounds: int,
    only: str | None,
    rules: tuple[str, ...],
    in_process: bool,
    as_json: bool,
) -> None:
    """Run `xsp verify` on each finished job, one at a time, and print the what-if table: each
    fix's measured change of the step, job by job. A job that cannot be verified (no
    suggestions, a workload that cannot run here) is recorded with its reason. Rows go to
    DIR/verify.json, each job's runs to its own measurement's verify/."""
    import json

    from xsp.campaign.store import CampaignStore
    from xsp.campaign.whatif import verify_campaign, what_if, what_if_line

    campaign = CampaignStore(campaign_dir)
    campaign.spec()  # a directory that is no campaign is named before the bar
    globs = [g.strip() for g in (only or "").split(",") if g.strip()]
    with stdout_to_stderr(as_json), bar_per_key() as progress:
        document = verify_campaign(campaign, rounds, globs, progress, rules, in_process)
    if as_json:
        click.echo(json.dumps(document, indent=1))
    else:
        for row in what_if(document):
            out_console.print(what_if_line(row), highlight=False, soft_wrap=True)
        for job in document["jobs"]:
            if job["status"] != "verified":
                console.print(f"{job['job']}: not verified: {job['why']}", highlight=False)
    if document["interrupted"]:
        fail("interrupted; the jobs verified so far are in verify.json", EXIT_INTERRUPTED)


@campaign.command("sql")
@click.argument("campaign_dir", type=store_location(committed=COMMITTED))
@click.argument("query")
@click.option("--csv", "as_csv", is_flag=True, help="Print every row as CSV (wide results).")
def campaign_sql(campaign_dir: Path, query: str, as_csv: bool) -> None:
    """Query a campaign with SQL: tables ``jobs`` (one row per job) and ``spans`` (all spans,
    with job, model, mode, batch_size and levels)."""
    import duckdb

    from xsp.campaign.store import CampaignStore

    campaign = CampaignStore(campaign_dir)
    campaign.spec()  # a directory that is no campaign is named, as report does
    try:
        relation = campaign.connect().sql(query)
        if as_csv:
            import csv

            writer = csv.writer(sys.stdout)
            writer.writerow(relation.columns)
            writer.writerows(relation.fetchall())
            return
        table = relation.to_arrow_table()
    except duckdb.Error as exc:
        raise XspError(f"query failed: {exc}") from exc
    print_table("", table, 1000)


@campaign.command("diff")
@click.argument("before", type=store_location(committed=COMMITTED))
@click.argument("after", type=store_location(committed=COMMITTED))
@click.option("--rows", type=int, default=20, show_default=True, help="Rows shown.")
@click.option("--json", "as_json", is_flag=True, help="Print every job's row as JSON.")
def campaign_diff(before: Path, after: Path, rows: int, as_json: bool) -> None:
    """Compare two campaigns job by job: each job's untraced step before and after, with a
    verdict (faster, slower or noise) where both kept the job's measurement (a bootstrap over
    its M steps), "untested" where only the jobs' median steps remain, "missing" where a side
    has no successful result. ``xsp diff BEFORE/runs/JOB AFTER/runs/JOB`` compares one job in
    full."""
    import json

    from xsp.analysis.diff import TEST
    from xsp.campaign.diff import campaign_diff as compare_campaigns
    from xsp.campaign.store import CampaignStore

    table = compare_campaigns(CampaignStore(before), CampaignStore(after))
    if as_json:
        click.echo(json.dumps({"test": TEST, "jobs": table.to_pylist()}, indent=1))
        return
    print_table(f"campaign diff: {before} -> {after}", table, rows)
    verdicts = table.column("verdict").to_pylist()
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))
    console.print(f"{table.num_rows} jobs: {counts}; verdicts: {TEST}", highlight=False)
