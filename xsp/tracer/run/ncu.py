"""Nsight Compute for the hardware-counter level set (MH): find ``ncu``, pick the metrics the
device offers, wrap the level-set process's command, and turn ncu's report into the run's
counter table.

The level-set process runs as ``ncu [PROFILE_FLAGS] --metrics ... --export RUN/MH/counters
python -m xsp.tracer.run.child --spec ...``. ncu starts it (``--target-processes all``: the
program's own children too), profiles nothing until the level calls ``cudaProfilerStart`` at a
measured iteration's start (``--profile-from-start off``), and records the NVTX ranges that label
each kernel with its iteration (``--nvtx``). GPU clocks stay as the workload drives them
(``--clock-control none``, as in the timing runs); caches are flushed before each replay pass
(ncu's default), so DRAM traffic is that of a cold L2. Once the process has exited,
``finish`` imports the report (``ncu --import --csv --page raw``), parses it with
``xsp.tracer.convert.ncu`` and stores ``counters.parquet`` beside the run's spans.

No ncu, or one that cannot run: the level set is skipped with one line saying so, and every other
level set runs (``unavailable``).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from xsp.core import config, store
from xsp.core.errors import StoreError
from xsp.core.store import CounterInfo, ManifestRun, RunMeta, Status
from xsp.tracer.convert import ncu as counters

PROFILE_FLAGS = (
    "--target-processes",
    "all",
    "--clock-control",
    "none",
    "--profile-from-start",
    "off",
    "--nvtx",
    "--force-overwrite",
)
IMPORT_FLAGS = ("--csv", "--page", "raw", "--print-units", "base")
#: Where Nsight Compute installs itself when it is not on PATH (newest version first).
INSTALL_GLOBS = (
    "/usr/local/cuda/bin/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/usr/local/cuda-*/bin/ncu",
)
QUERY_TIMEOUT_S = 180
IMPORT_TIMEOUT_S = 900
#: Fewer names than this in ``--query-metrics`` output: its format was not understood, so no
#: metric is left out on its account.
MIN_LISTED_METRICS = 50


def find(env: Mapping[str, str] | None = None) -> str | None:
    """The ncu to use: ``XSP_NCU``, else ``ncu`` on PATH, else an installed one; None if none."""
    named = config.ncu_path(env)
    if named is not None:
        path = shutil.which(named)
        return path
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in INSTALL_GLOBS:
        matches = sorted(glob.glob(pattern), reverse=True)
        if matches and os.access(matches[0], os.X_OK):
            return matches[0]
    return None


def unavailable(env: Mapping[str, str] | None = None) -> str | None:
    """Why the hardware-counter level cannot run here (one line), or None when it can."""
    named = config.ncu_path(env)
    if find(env) is not None:
        return None
    if named is not None:
        return f"XSP_NCU={named!r} is not an executable"
    return "no counter tool: Nsight Compute's ncu is not on PATH (set XSP_NCU to its path)"


@functools.lru_cache(maxsize=4)
def available_metrics(ncu: str) -> frozenset[str] | None:
    """Base names of the metrics this machine's GPU offers (``ncu --query-metrics``); None when
    the query fails or its output is not understood (then no metric is left out)."""
    try:
        done = subprocess.run(
            [ncu, "--query-metrics"], capture_output=True, text=True, timeout=QUERY_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = counters.parse_metric_names(done.stdout)
    return frozenset(names) if done.returncode == 0 and len(names) >= MIN_LISTED_METRICS else None


def selection(ncu: str) -> tuple[list[str], list[str], bool]:
    """(metrics to collect, quantities the device has no metric for, whether the device's list
    was read)."""
    offered = available_metrics(ncu)
    metrics, missing = counters.requested_metrics(offered, lean=config.counter_set() == "lean")
    return metrics, missing, offered is not None


def profile_command(ncu: str, run_dir: Path, command: Sequence[str]) -> list[str]:
    """``command`` (the level-set process) under ncu, its report and log into ``run_dir``."""
    metrics, _, _ = selection(ncu)
    report = run_dir / store.NCU_REPORT
    return [
        ncu,
        *PROFILE_FLAGS,
        "--metrics",
        ",".join(metrics),
        "--export",
        str(report.with_suffix("")),  # ncu appends .ncu-rep
        "--log-file",
        str(run_dir / store.NCU_LOG),
        *command,
    ]


@functools.lru_cache(maxsize=4)
def version(ncu: str) -> str | None:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


def import_csv(ncu: str, report: Path) -> str:
    """The report's raw page as CSV, one row per kernel, demangled names, base units."""
    base = [ncu, "--import", str(report), *IMPORT_FLAGS]
    # an ncu without one of the printing options still exports: the parser scales units itself
    attempts = [[*base, "--print-kernel-base", "demangled"], base, base[: -len(IMPORT_FLAGS) + 3]]
    failure = ""
    for argv in attempts:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            failure = str(exc)
            continue
        if done.returncode == 0:
            return done.stdout
        lines = (done.stderr or done.stdout).strip().splitlines()
        failure = lines[-1] if lines else f"exit status {done.returncode}"
    raise StoreError(f"{report}: ncu could not import it ({failure or 'no output'})")


def log_errors(run_dir: Path, limit: int = 3) -> list[str]:
    """ncu's own error lines (``==ERROR== ...``) from its log."""
    try:
        text = (run_dir / store.NCU_LOG).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if "==ERROR==" in line][:limit]


def finish(run_dir: Path, entry: ManifestRun, ncu: str) -> ManifestRun:
    """After the level-set process has exited: import ncu's report into ``counters.parquet``,
    record what was collected in run.json (``counters``) and the manifest entry, and mark the
    run partial when no counters came back. Returns the amended entry."""
    started = time.perf_counter()
    meta: RunMeta | None
    try:
        meta = store.read_run_meta(run_dir / store.RUN_META)
    except StoreError:
        meta = None
    info = _tool_info(meta, ncu)
    errors = log_errors(run_dir)
    reasons = _import_report(run_dir, ncu, meta, info, errors)
    try:
        passes = counters.pass_counts((run_dir / store.NCU_LOG).read_text(errors="replace"))
    except OSError:
        passes = []
    if passes:
        info["passes"] = {
            "min": min(passes),
            "median": statistics.median(passes),
            "max": max(passes),
        }
    if errors:
        info["tool_errors"] = errors
    info["import_s"] = round(time.perf_counter() - started, 3)
    if meta is not None:
        _amend_run(run_dir, meta, info, reasons)
    return _amend_entry(entry, info, reasons, errors)


def _tool_info(meta: RunMeta | None, ncu: str) -> CounterInfo:
    """run.json's ``counters`` so far, with the tool, its flags and the metrics asked for."""
    metrics, missing, listed = selection(ncu)
    info = CounterInfo(**(meta.counters or {})) if meta is not None else CounterInfo()
    info.update(
        CounterInfo(
            tool="Nsight Compute",
            tool_path=ncu,
            tool_version=version(ncu),
            flags=list(PROFILE_FLAGS),
            metric_set=config.counter_set(),
            metrics_requested=metrics,
            quantities_without_metric=missing,
            metrics_checked_against_device=listed,
        )
    )
    return info


def _import_report(
    run_dir: Path, ncu: str, meta: RunMeta | None, info: CounterInfo, errors: list[str]
) -> list[str]:
    """Store ncu's report as the run's counter table and add its figures to ``info``; the
    reasons the run is partial (no report, no kernel, an unreadable report)."""
    report = run_dir / store.NCU_REPORT
    if not report.exists():
        return ["Nsight Compute wrote no report" + (f": {'; '.join(errors)}" if errors else "")]
    try:
        parsed = counters.read_raw_csv(
            import_csv(ncu, report),
            iterations=meta.iterations_measured if meta is not None else None,
        )
        store.write_counters(run_dir, parsed.table)
    except (StoreError, OSError) as exc:
        return [f"the counters could not be read: {exc}"]
    table = parsed.table
    per_iteration: dict[str, int] = {}
    for it in table.column("iteration").to_pylist():
        per_iteration[str(it)] = per_iteration.get(str(it), 0) + 1
    info.update(
        CounterInfo(
            kernels=table.num_rows,
            kernels_per_iteration=per_iteration,
            kernels_outside_iterations=parsed.outside_iterations,
            unreadable_cells=parsed.unreadable_cells,
            iterations_from_nvtx=parsed.iterations_from_ranges,
            metrics_read=parsed.metrics,
        )
    )
    return [] if table.num_rows else ["Nsight Compute profiled no kernel"]


def _amend_run(run_dir: Path, meta: RunMeta, info: CounterInfo, reasons: list[str]) -> None:
    """run.json with its ``counters``, partial where no counters came back."""
    meta = dataclasses.replace(meta, counters=info).with_reasons(reasons)
    store.write_run_meta(run_dir / store.RUN_META, meta)


def _amend_entry(
    entry: ManifestRun, info: CounterInfo, reasons: list[str], errors: list[str]
) -> ManifestRun:
    """The manifest entry with the counters' figures, partial where none came back, and ncu's
    first error beside the program's."""
    kept: dict[str, object] = {
        k: info.get(k) for k in ("kernels", "passes", "import_s", "tool_version") if k in info
    }
    entry = dataclasses.replace(entry, counters=kept).with_reasons(reasons)
    if errors and entry.status == Status.ERROR and entry.error:
        entry = dataclasses.replace(entry, error=f"{entry.error} (ncu: {errors[0]})")
    return entry


__all__ = [
    "PROFILE_FLAGS",
    "available_metrics",
    "find",
    "finish",
    "import_csv",
    "log_errors",
    "profile_command",
    "selection",
    "unavailable",
    "version",
]
