"""``xsp analyze``: a leveled measurement's reconstruction and analyses, as tables, as one JSON
object, or as an HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xsp.cli.common import console, open_store, say, store_location
from xsp.cli.render import print_replay, print_table, replay_summary
from xsp.cli.summary import print_summary
from xsp.core.errors import XspError

__all__ = ["KEY_SECTIONS", "analyze"]

#: The analyses printed without --all: what to change, where the step goes, the layers,
#: kernels and program lines that cost most, and a multi-rank job's ranks.
KEY_SECTIONS = (
    "suggestions",
    "step_causes",
    "layers_by_gpu_time",
    "kernels_by_name",
    "source_lines",
    "ranks",
    "communication_overlap",
    "collective_skew",
)
KEY_ROWS = 5
ALL_ROWS = 15


@click.command()
@click.argument("run_dir", type=store_location(writes=True))
@click.option(
    "--rows",
    type=int,
    default=None,
    help=f"Rows per table [default: {KEY_ROWS}; with --all, {ALL_ROWS}].",
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Print every analysis's table, not only the key ones (what to change, where the step "
    "goes, the top layers, kernels and program lines).",
)
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    help="Also write a self-contained HTML report (flame view, timeline, charts, tables).",
)
@click.option(
    "--save-reconstruction",
    is_flag=True,
    help="Store the reconstruction as a run in RUN_DIR/reconstructed (export/push it like any).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print every analysis and suggestion as one JSON object instead of tables.",
)
def analyze(
    run_dir: Path,
    rows: int | None,
    every: bool,
    report: Path | None,
    save_reconstruction: bool,
    as_json: bool,
) -> None:
    """Reconstruct a leveled measurement and print its summary, the verdict, the replay's check
    and the top rows of the key analyses: suggestions, where the step goes, layers, kernels and
    program lines by their time (and a multi-rank job's ranks). Tables fit the terminal's
    width (COLUMNS where set): columns left out, named under the table, rather than rows cut.

    With --all, every analysis: also per-level overhead, the GPU monitor, layers (A3, A5;
    layer info, A2, only in --json and the report), kernels (A11, A13), HTA's GPU time
    breakdowns, FLOPs and memory, and with a counter run (level set MH) the hardware-counter analyses: kernel info (A8), the
    kernel roofline (A9), GPU metrics per layer (A12), the layer roofline (A14) and the model's
    aggregate (A15); without one, a line says they are absent. For a multi-rank job also each
    rank's step, communication against computation and the skew of each collective across
    ranks (its straggler named).

    With --json, stdout holds one object: ``measurement``, ``reconstruction`` (spans, model
    latency, mismatches, GPU-lane layout) and ``analyses``, keyed by analysis (``suggestions``,
    ``kernels_by_name``, ...), each with its ``title``, ``note`` and ``rows``; row keys are the
    analysis' column names, which carry their units (``gain_ms_per_iteration``, ``share_pct``).
    """
    import pyarrow.compute as pc

    from xsp.analysis.reconstruction.reconstruct import reconstruct
    from xsp.core.store import RECONSTRUCTED, check_output, check_run_destination

    if report is not None:
        check_output(report)  # before the work: never over the store's own files
    if save_reconstruction:  # nor through a link into another run's
        check_run_destination(run_dir / RECONSTRUCTED, run_dir)
    store = open_store(run_dir, out=not as_json)
    store.require_spans()
    spans, mismatches = reconstruct(store)
    complete = pc.and_(pc.equal(spans.column("kind"), "step"), pc.is_null(spans["status_message"]))
    steps = spans.filter(complete).column("dur_ns")  # failed and cut-short ones left out
    median_ms = pc.approximate_median(steps).as_py() / 1e6 if len(steps) else None
    if save_reconstruction:
        _save_reconstruction(run_dir, store, spans)
    if as_json:
        _print_json(run_dir, spans.num_rows, median_ms, mismatches.num_rows, store)
    else:
        print_summary(run_dir, store, warn_replay=False, gpu_layers=False)
        if median_ms is not None:
            say(
                f"reconstructed: {spans.num_rows:,} spans, model latency median {median_ms:.3f} "
                f"ms; {mismatches.num_rows} spans without a counterpart in a shallower run",
                hang="  ",
            )
        print_replay(store)
        _print_sections(store, run_dir, rows, every)
    if report is not None:
        from xsp.analysis.report import write_report

        try:
            count = write_report(store, report, f"xsp: {run_dir}")
        except OSError as exc:
            raise XspError(f"cannot write {report}: {exc}") from exc
        console.print(f"wrote a report of {count} analyses to {report}", highlight=False)


def _print_sections(store: Any, run_dir: Path, rows: int | None, every: bool) -> None:
    """The analyses' tables: the key ones (``KEY_SECTIONS``) with their top rows, or with
    ``every`` all of them, and the analyses the measurement cannot have, one line each."""
    from xsp.analysis.catalog import sections

    skip = {"level_sets", "layer_info"}  # printed above / too wide for a terminal
    count = rows if rows is not None else (ALL_ROWS if every else KEY_ROWS)
    left = 0
    for section in sections(store):
        if section.key in skip or not (section.table.num_rows or section.absent):
            continue
        if not every and section.key not in KEY_SECTIONS:
            left += 1
        elif section.absent:
            say(f"{section.title}: {section.note}")
        else:
            # the summary printed the verdict, the cause table's note, above
            note = "" if section.key == "step_causes" else section.note
            print_table(section.title, section.table, count, note, section.text)
    if left:
        say(
            f"{left} more analyses: xsp analyze {run_dir} --all prints every table, --report "
            "FILE.html draws them"
        )


def _print_json(
    run_dir: Path, spans: int, median_ms: float | None, mismatches: int, store: Any
) -> None:
    import json
    import math

    from xsp.analysis.catalog import sections
    from xsp.core.store.location import shown

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, bytes):
            return value.hex()
        return value

    analyses = {
        section.key: {
            "title": section.title,
            "note": section.note,
            "rows": [{k: clean(v) for k, v in row.items()} for row in section.table.to_pylist()],
            **(section.data or {}),
        }
        for section in sections(store)
    }
    document = {
        "measurement": shown(str(run_dir)),  # an object store by its URI
        "reconstruction": {
            "spans": spans,
            "model_latency_median_ms": median_ms,
            "spans_without_counterpart": mismatches,
            "replay": replay_summary(store).to_json(),
        },
        "analyses": analyses,
    }
    click.echo(json.dumps(document, indent=1, default=str))


def _save_reconstruction(run_dir: Path, store: Any, spans: Any) -> None:
    from xsp.analysis.reconstruction.reconstruct import reconstructed_resource
    from xsp.core import store as run_store

    deepest = max(store.runs, key=lambda r: len(r.levels))
    out = run_dir / run_store.RECONSTRUCTED
    try:
        run_store.write_run(
            out,
            spans,
            deepest.levels,
            reconstructed_resource(store),
            reconstructed_from=[r.levels for r in store.runs],
        )
    except OSError as exc:
        raise XspError(f"cannot write {out}: {exc}") from exc
    console.print(f"stored the reconstruction in {out}", highlight=False)
