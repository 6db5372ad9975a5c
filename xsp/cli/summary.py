"""``xsp summary``, and the summary ``xsp run`` and ``xsp analyze`` print: the level sets'
steps, M's interval, the layers by GPU time (or host time without a G run), the store's size
and what each run lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from xsp.cli.common import open_store, out_console, plain, store_location, warn
from xsp.cli.render import replay_summary, replay_warnings
from xsp.core.errors import XspError
from xsp.core.store import Status

__all__ = ["counter_line", "print_summary", "run_warnings", "summary"]


@click.command()
@click.argument("run_dir", type=store_location())
def summary(run_dir: Path) -> None:
    """Print the summary of a stored measurement."""
    print_summary(run_dir)


def print_summary(run_dir: Path, store: Any = None, warn_replay: bool = True) -> None:
    """The measurement's summary; a ``store`` given was opened by ``open_store``, which printed
    its reader's warnings. ``warn_replay``: say why the replay may be off M (analyze says it
    after its replay line instead)."""
    from xsp.analysis.tables.summary import level_sets, own_time_line, time_line, top_layers
    from xsp.core.store import MANIFEST, Manifest, read_manifest
    from xsp.core.store.location import shown

    store = store or open_store(run_dir)
    rows = level_sets(store).to_pylist()
    title = shown(f"xsp measurement {run_dir}")  # an object store by its URI
    table = Table(title=title, title_justify="left")
    for name in (
        "levels",
        "status",
        "iters",
        "median ms",
        "min ms",
        "max ms",
        "spans/iter",
        "vs first",
    ):
        table.add_column(name, justify="right" if name not in ("levels", "status") else "left")
    for r in rows:
        table.add_row(
            plain(r["levels"]),
            str(r["status"]),
            _fmt(r["iterations"]),
            _fmt(r["step_median_ms"]),
            _fmt(r["step_min_ms"]),
            _fmt(r["step_max_ms"]),
            _fmt(r["spans_per_iteration"], 0),
            _ratio(r["overhead_x"], r.get("overhead_verdict")),
        )
    out_console.print(table)
    _print_m_interval(store)
    if not _print_gpu_layers(store, warn_replay=warn_replay) and (
        layers := top_layers(store).to_pylist()
    ):
        lt = Table(
            title="slowest layers (forward host time, shallowest run with F; no G run for GPU time)",
            title_justify="left",
        )
        for name in ("layer", "type", "calls/iter", "mean ms", "% of step"):
            lt.add_column(name, justify="left" if name in ("layer", "type") else "right")
        for r in layers:
            lt.add_row(
                plain(r["module_path"]),
                plain(r["module_type"]),
                _fmt(r["calls_per_iteration"], 0),
                _fmt(r["mean_ms"], 3),
                _fmt(r["share_pct"], 1),
            )
        out_console.print(lt)
    spans = sum(r["spans_per_iteration"] * r["iterations"] for r in rows)
    if spans:
        out_console.print(
            f"store: {store.bytes_on_disk() / spans:.1f} bytes per span on disk", highlight=False
        )
    for run_ in store.counter_runs:
        out_console.print(counter_line(run_), highlight=False)
    manifest = (
        read_manifest(store.root / MANIFEST) if (store.root / MANIFEST).exists() else Manifest()
    )
    for said in (time_line(manifest), own_time_line(manifest)):
        if said:
            out_console.print(said, highlight=False, soft_wrap=True)
    for run_ in [*store.runs, *store.counter_runs]:
        for line in run_warnings(run_):
            warn(line)


def _print_m_interval(store: Any) -> None:
    """M's median and interval over its processes, or why there is no interval (one process;
    with a G run the replay's "unchecked across processes" warning says it instead)."""
    from xsp.analysis.replay.critical_path import has_gpu
    from xsp.analysis.replay.m_interval import m_interval

    if not store.runs or store.runs[0].levels != "M":
        return
    interval = m_interval(store)
    if interval is None:
        return
    if interval.single:
        if has_gpu(store):
            return
        out_console.print(
            "M ran in one process: the host's variance between processes cannot be told apart "
            "from overhead (--m-processes 3 gives M an interval)",
            highlight=False,
        )
    else:
        out_console.print(interval.describe(), highlight=False)


def _print_gpu_layers(store: Any, limit: int = 5, warn_replay: bool = True) -> bool:
    """With level G (single-rank): the replay's verdict and why it may be off, then the layers
    with the most GPU time (forward + backward); False where there is none to print."""
    from xsp.analysis.reconstruction import distributed
    from xsp.analysis.replay import critical_path

    if not critical_path.has_gpu(store) or distributed.is_multi_rank(store):
        return False
    try:
        rows = critical_path.layers(store, limit=limit).to_pylist()
        verdict = critical_path.verdict(store)
    except XspError as exc:
        warn(f"no replay: {exc}")
        return False
    if not rows:
        return False
    out_console.print(verdict, highlight=False)
    if warn_replay:
        for line in replay_warnings(replay_summary(store)):
            warn(line)
    lt = Table(title="layers by GPU time (forward + backward, replayed step)", title_justify="left")
    for name in ("layer", "fwd ms", "bwd ms", "GPU ms", "path ms", "% of step"):
        lt.add_column(name, justify="left" if name == "layer" else "right")
    for r in rows:
        lt.add_row(
            plain(r["layer"]),
            _fmt(r["forward_gpu_ms"], 3),
            _fmt(r["backward_gpu_ms"], 3),
            _fmt(r["gpu_ms"], 3),
            _fmt(r["critical_path_ms"], 3),
            _fmt(r["share_pct"], 1),
        )
    out_console.print(lt)
    return True


def run_warnings(run: Any) -> list[str]:
    """Lines on what a level-set run lost: a status other than ok with its reasons, CUPTI's
    dropped and undecodable records (the kernel and API counts are then not exact)."""
    meta = run.document
    lines = []
    if meta.status != Status.OK:
        reasons = meta.status_reasons or ([meta.error] if meta.error else [])
        text = "; ".join(str(r) for r in reasons) or "no reason recorded"
        lines.append(f"level set {run.levels}: {meta.status}: {text}")
    cupti = meta.cupti
    if isinstance(cupti, dict):
        dropped, bad = cupti.get("dropped_records"), cupti.get("undecodable_records")
        if dropped is None:
            lines.append(f"level set {run.levels}: CUPTI could not report its dropped records")
        elif dropped:
            lines.append(
                f"level set {run.levels}: CUPTI dropped {dropped} records (full buffers: raise "
                "XSP_CUPTI_BUFFER_MB); kernel and API counts are short"
            )
        if bad:
            lines.append(
                f"level set {run.levels}: {bad} CUPTI records could not be decoded and are missing"
            )
    return lines


def counter_line(run: Any) -> str:
    """One line on a hardware-counter run: kernels, iterations, replay passes, time."""
    meta = run.document
    counters = meta.counters or {}
    passes = counters.get("passes") or {}
    seconds = (meta.finished_ns or 0) - (meta.started_ns or 0)
    parts = [
        f"counter run {run.levels}: {counters.get('kernels', 0):,} kernels",
        f"{meta.iterations_measured or 0} iteration(s) under {counters.get('tool', 'ncu')}",
    ]
    if passes:
        parts.append(f"{passes.get('median')} replay passes per kernel (median)")
    if seconds > 0:
        parts.append(f"{seconds / 1e9:.0f} s")
    return ", ".join(parts)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ratio(overhead: float | None, verdict: str | None = None) -> str:
    """A level set's step against the first's, with its verdict where it is not "added":
    "noise" inside M's interval across processes (or twice the standard error, with one M
    process), "below M" / "faster" when the deeper run was faster beyond it."""
    if not overhead:
        return "-"
    return f"{overhead:.3f}x" + (f" ({verdict})" if verdict and verdict != "added" else "")
