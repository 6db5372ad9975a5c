"""One campaign job: the leveled run of one workload at every level set (each level set in its
own process), then a one-row summary of what it measured. Failures are results, never
exceptions: the status is ok, partial (it measured, but something is missing: a level set's
status says what), timeout (a level set ran past ``timeout_s`` and was killed with its process
group) or failed, whose reason is classified (out of memory, unsupported model, ...); the
campaign moves on."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from xsp.campaign.records import JobRecord, RunRecord
from xsp.campaign.spec import CampaignSpec, Job
from xsp.core.errors import DeviceError, WorkloadError, XspError

if TYPE_CHECKING:
    from xsp.core.store import ManifestRun
    from xsp.tracer.run.runner import LeveledResult

__all__ = ["classify_error", "classify_output", "run_job", "stop_stale_processes", "switched_on"]

#: Reason classes of the errors xsp raises before a job runs anything (first match wins).
_REASON_BY_ERROR: tuple[tuple[type[XspError], str], ...] = (
    (WorkloadError, "unsupported"),
    (DeviceError, "device"),
)
#: Reason classes, matched against a failed level set's output (first match wins).
_REASONS = (
    ("out-of-memory", ("CUDA out of memory", "OutOfMemoryError", "Cannot allocate memory")),
    ("unsupported", ("unknown model", "cannot build", "WorkloadError", "not supported")),
    ("device", ("no CUDA GPU", "has no CUDA", "DeviceError")),
)


def switched_on(variable: str) -> bool:
    """A campaign switch, on unless the environment sets it to 0: ``XSP_FORK_SERVER`` (0: a
    fresh interpreter per level set), ``XSP_OVERLAP`` (0: each process and job starts only
    once the one before has ended; while they overlap, two processes hold GPU memory at once)
    and ``XSP_SHARE_PROCESS`` (0: MF in a process of its own, not after M in M's)."""
    from xsp.core import config

    return config.switch(variable, True)


def stop_stale_processes(out: Path, wait_s: float = 10.0) -> list[int]:
    """Kill the level-set processes that a killed campaign left running for this job (a process
    with a time limit has its own process group, which a SIGKILL to the campaign's group does
    not reach): its rerun writes the same run directories. A process is the run's while its pid,
    recorded in run.json, belongs to a process that started before the run did (within a
    minute), so that a reused pid is left alone. Returns the pids killed."""
    import os
    import signal

    from xsp.core.store import Status, read_run_meta
    from xsp.tracer.run.procfs import process_age_ns

    killed = []
    for meta_path in out.glob("*/run.json"):
        try:
            meta = read_run_meta(meta_path)
            pid = int((meta.resource or {})["process.pid"])
            started_ns = int(meta.started_ns)  # type: ignore[arg-type]  # None: TypeError
        except (XspError, ValueError, KeyError, TypeError):
            continue
        age_ns = process_age_ns(pid)
        if meta.status != Status.RUNNING or age_ns is None:
            continue
        if not -1e9 < started_ns - (time.time_ns() - age_ns) < 60e9:  # clock ticks: 10 ms
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + wait_s
    while (
        killed
        and time.monotonic() < deadline
        and any(process_age_ns(p) is not None for p in killed)
    ):
        time.sleep(0.05)
    return killed


def classify_error(exc: XspError) -> str:
    """The reason class of an error raised in this process: its type says it."""
    for kind, reason in _REASON_BY_ERROR:
        if isinstance(exc, kind):
            return reason
    return "failed"


def classify_output(output: str) -> str:
    """The reason class of a failed level set, from its output. Each level set runs in a process
    of its own: what failed there (a torch OutOfMemoryError, an xsp WorkloadError) reaches this
    process only as text, its stderr log and its run.json's failure line, so the text is read."""
    for reason, needles in _REASONS:
        if any(n in output for n in needles):
            return reason
    return "failed"


def run_job(
    spec: CampaignSpec,
    job: Job,
    out: Path,
    gpu: int | str | None = None,
    after: Callable[[], None] | None = None,
    on_measured: Callable[[], None] | None = None,
) -> JobRecord:
    """Run ``job`` into ``out``; return its result record (status, reason, wall time, summary).

    ``gpu`` pins it to one GPU (CUDA_VISIBLE_DEVICES: an index, or a UUID as Ray may give
    it); ``after`` and ``on_measured`` chain it
    to the jobs before and after it on that GPU (see ``run_leveled``). The leveled runner runs
    in this process (each level set in its own process, forked from a server that imported
    torch once), so a job pays no interpreter start-up. Each level set's start-up and warm-up
    overlap the end of the one before, whose measurement is over by then."""
    from xsp.tracer.run.runner import LeveledSpec, run_leveled
    from xsp.tracer.spec import ProfileSpec

    started = time.time()
    record = JobRecord(
        job=job.id,
        model=job.model,
        mode=job.mode,
        batch_size=job.batch_size,
        gpu=gpu,
        started=started,
    )
    profile = ProfileSpec(
        iterations=spec.iterations,
        warmup=spec.warmup,
        device="cuda" if gpu is not None else spec.device,
        model=job.model,
        batch_size=job.batch_size,
        mode=job.mode,
        counter_iterations=spec.counter_iterations,
    )
    stop_stale_processes(out)
    fork_server = switched_on("XSP_FORK_SERVER")
    if fork_server:
        from xsp.tracer.run import forkserver

        forkserver.preload_every_zoo()
    try:
        leveled = LeveledSpec(
            out=out,
            profile=profile,
            level_sets=tuple(spec.level_sets_of(job)),
            env={"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else {},
            timeout_s=spec.timeout_s,
            log_stderr=True,
            fork_server=fork_server,
            overlap=switched_on("XSP_OVERLAP"),
            share_process=switched_on("XSP_SHARE_PROCESS"),
        )
        result = run_leveled(leveled, after=after, on_measured=on_measured)
    except XspError as exc:  # refused before anything ran: an unknown model, a bad device
        record.update(
            JobRecord(status="failed", reason=classify_error(exc), error=str(exc), wall_s=0.0)
        )
        return record
    record["wall_s"] = time.time() - started
    record.update(_runs_record(result))
    if not result.ok:
        record.update(_failure_record(result, out))
        return record
    try:
        from xsp.campaign.summary import summarize

        record.update(JobRecord(status="ok", reason=None, error=None, summary=summarize(out)))
    except Exception as exc:  # a run we cannot read is a failed job, not a crashed campaign
        error = f"{type(exc).__name__}: {exc}"
        record.update(JobRecord(status="failed", reason="unreadable", error=error))
    return record


def _runs_record(result: LeveledResult) -> JobRecord:
    """What a job's record says of each level set's run: its seconds, status and reasons."""
    record = JobRecord(
        seconds_by_level_set={run.levels: run.seconds for run in result.runs},
        runs=[_run_record(run) for run in result.runs],
    )
    if result.skipped:
        record["skipped"] = list(result.skipped)
    return record


def _run_record(run: ManifestRun) -> RunRecord:
    reasons = list(run.status_reasons) if run.status_reasons is not None else None
    record = RunRecord(
        levels=run.levels,
        status=run.status,
        status_reasons=reasons,
        program=run.program,
        cupti=run.cupti,
    )
    if run.counters is not None:
        record["counters"] = run.counters
    return record


def _failure_record(result: LeveledResult, out: Path) -> JobRecord:
    """The status, reason and error of a job that did not run through, read from its result
    and, for a plain failure, its stderr logs."""
    error = result.failure or "failed"
    logs = "\n".join(
        p.read_text(errors="replace")[-4000:] for p in sorted(out.glob("*.stderr.log"))
    )
    if result.interrupted:  # Ctrl-C: a rerun runs it again
        status, reason = "interrupted", "interrupted"
    elif any(run.timed_out for run in result.runs):
        status, reason = "timeout", "timeout"
    elif result.status == "partial":  # it measured, but something is missing
        status, reason = "partial", "partial"
    else:
        status, reason = "failed", classify_output(f"{error}\n{logs}")
    return JobRecord(status=status, reason=reason, error=error[-500:])
