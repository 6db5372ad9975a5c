"""``xsp summary``, and the summary ``xsp run`` and ``xsp analyze`` print: the level sets'
steps, M's interval, the layers by GPU time (or host time without a G run), the store's size
and what each run lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xsp.cli.common import open_store, out_console, say, say_list, store_location, warn
from xsp.cli.fit import Column, Kind, fit
from xsp.cli.render import replay_summary, replay_warnings
from xsp.core.errors import XspError
from xsp.core.store import Status

__all__ = ["counter_line", "print_summary", "run_warnings", "summary"]


@click.command()
@click.argument("run_dir", type=store_location())
def summary(run_dir: Path) -> None:
    """Print the summary of a stored measurement."""
    print_summary(run_dir)


def print_summary(
    run_dir: Path,
    store: Any = None,
    warn_replay: bool = True,
    gpu_layers: bool = True,
    failure_said: str | None = None,
) -> None:
    """The measurement's summary; a ``store`` given was opened by ``open_store``, which printed
    its reader's warnings. ``warn_replay``: say why the replay may be off M (analyze says it
    after its replay line instead); ``gpu_layers``: the table of layers by GPU time under the
    verdict (analyze prints its own); ``failure_said``: the level set whose failure the
    caller says in its last line (xsp run), not warned about here too."""
    from xsp.analysis.tables.summary import level_sets, own_time_line, time_line, top_layers
    from xsp.core.store import MANIFEST, Manifest, read_manifest
    from xsp.core.store.location import shown

    store = store or open_store(run_dir, out=True)
    rows = level_sets(store).to_pylist()
    _print(
        shown(f"xsp measurement {run_dir}"),  # an object store by its URI
        [
            Column("levels", [r["levels"] for r in rows], Kind.NAME, 0),
            Column("status", [str(r["status"]) for r in rows], Kind.NAME, 0),
            _numbers("iters", [r["iterations"] for r in rows]),
            _numbers("median ms", [r["step_median_ms"] for r in rows], priority=0),
            _numbers("min ms", [r["step_min_ms"] for r in rows], priority=3),
            _numbers("max ms", [r["step_max_ms"] for r in rows], priority=3),
            _numbers("spans/iter", [r["spans_per_iteration"] for r in rows], 0),
            Column(
                "vs first",
                [_ratio(r["overhead_x"], r.get("overhead_verdict")) for r in rows],
                Kind.PROSE,
                0,
            ),
        ],
    )
    _print_m_interval(store)
    if not _print_gpu_layers(store, warn_replay=warn_replay, table=gpu_layers) and (
        layers := top_layers(store).to_pylist()
    ):
        _print(
            "slowest layers (forward host time, shallowest run with F; no G run for GPU time)",
            [
                Column("layer", [r["module_path"] for r in layers], Kind.NAME, 0),
                Column("type", [r["module_type"] for r in layers], Kind.NAME, 2),
                _numbers("calls/iter", [r["calls_per_iteration"] for r in layers], 0),
                _numbers("mean ms", [r["mean_ms"] for r in layers], 3, priority=0),
                _numbers("% of step", [r["share_pct"] for r in layers], 1, priority=0),
            ],
        )
    spans = sum(r["spans_per_iteration"] * r["iterations"] for r in rows)
    if spans:
        say(f"store: {store.bytes_on_disk() / spans:.1f} bytes per span on disk")
    for run_ in store.counter_runs:
        say(counter_line(run_), hang="  ")
    manifest = (
        read_manifest(store.root / MANIFEST) if (store.root / MANIFEST).exists() else Manifest()
    )
    for said in (time_line(manifest), own_time_line(manifest)):
        if said:
            say_list(said)
    for run_ in [*store.runs, *store.counter_runs]:
        for line in run_warnings(run_, status=run_.levels != failure_said):
            warn(line, out=True)


def _numbers(header: str, values: list[Any], digits: int = 2, priority: int = 1) -> Column:
    return Column(header, [_fmt(v, digits) for v in values], Kind.NUMBER, priority)


def _print(title: str, columns: list[Column]) -> None:
    """A summary table under its title, fitted to the terminal (``xsp.cli.fit``)."""
    from xsp.cli.common import printable

    columns = [
        Column(c.header, [printable(t) for t in c.cells], c.kind, c.priority) for c in columns
    ]
    say(title, style="bold")
    fitted = fit(columns, out_console.width)
    out_console.print(fitted.table())
    if fitted.dropped:
        say(f"left out to fit {out_console.width} columns: {', '.join(fitted.dropped)}")


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
        say(
            "M ran in one process: the host's variance between processes cannot be told apart "
            "from overhead (--m-processes 3 gives M an interval)"
        )
    else:
        say(interval.describe(), hang="  ")


def _print_gpu_layers(
    store: Any, limit: int = 5, warn_replay: bool = True, table: bool = True
) -> bool:
    """With level G (single-rank): the replay's verdict and why it may be off, then (with
    ``table``) the layers with the most GPU time (forward + backward); False where there is
    no replay to print."""
    from xsp.analysis.reconstruction import distributed
    from xsp.analysis.replay import critical_path

    if not critical_path.has_gpu(store) or distributed.is_multi_rank(store):
        return False
    try:
        rows = critical_path.layers(store, limit=limit).to_pylist()
        verdict = critical_path.verdict(store)
    except XspError as exc:
        warn(f"no replay: {exc}", out=True)
        return False
    if not rows:
        return False
    say(verdict, hang="  ")
    if warn_replay:
        for line in replay_warnings(replay_summary(store)):
            warn(line, out=True)
    if table:
        _print(
            "layers by GPU time (forward + backward, replayed step)",
            [
                Column("layer", [r["layer"] for r in rows], Kind.NAME, 0),
                _numbers("fwd ms", [r["forward_gpu_ms"] for r in rows], 3),
                _numbers("bwd ms", [r["backward_gpu_ms"] for r in rows], 3),
                _numbers("GPU ms", [r["gpu_ms"] for r in rows], 3, priority=0),
                _numbers("path ms", [r["critical_path_ms"] for r in rows], 3, priority=0),
                _numbers("% of step", [r["share_pct"] for r in rows], 1, priority=0),
            ],
        )
    return True


def run_warnings(run: Any, status: bool = True) -> list[str]:
    """Lines on what a level-set run lost: (with ``status``) a status other than ok with its
    reasons, CUPTI's dropped and undecodable records (the kernel and API counts are then not
    exact)."""
    meta = run.document
    lines = []
    if status and meta.status != Status.OK:
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
