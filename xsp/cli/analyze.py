"""``xsp analyze``: a leveled measurement's reconstruction and analyses, as tables, as one JSON
object, or as an HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xsp.cli.common import console, open_store, store_location
from xsp.cli.render import print_replay, print_table, replay_summary
from xsp.cli.summary import print_summary
from xsp.core.errors import XspError

__all__ = ["analyze"]


@click.command()
@click.argument("run_dir", type=store_location(writes=True))
@click.option("--rows", type=int, default=15, show_default=True, help="Rows per table.")
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
    run_dir: Path, rows: int, report: Path | None, save_reconstruction: bool, as_json: bool
) -> None:
    """Reconstruct a leveled measurement and print its analyses: suggestions, per-level overhead,
    the GPU monitor, layers (A3, A5; layer info, A2, only in --json and the report), kernels
    (A10, A11, A13), HTA's GPU time breakdowns,
    and with a counter run (level set MH) the hardware-counter analyses: kernel info (A8), the
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

    from xsp.analysis.catalog import sections
    from xsp.analysis.reconstruction.reconstruct import reconstruct
    from xsp.core.store import RECONSTRUCTED, check_output, check_run_destination

    if report is not None:
        check_output(report)  # before the work: never over the store's own files
    if save_reconstruction:  # nor through a link into another run's
        check_run_destination(run_dir / RECONSTRUCTED, run_dir)
    store = open_store(run_dir)
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
        print_summary(run_dir, store, warn_replay=False)
        if median_ms is not None:
            console.print(
                f"reconstructed: {spans.num_rows:,} spans, model latency median {median_ms:.3f} "
                f"ms; {mismatches.num_rows} spans without a counterpart in a shallower run",
                highlight=False,
            )
        print_replay(store)
        skip = {"level_sets", "layer_info"}  # printed above / too wide for a terminal
        for section in sections(store):
            if section.table.num_rows and section.key not in skip:
                print_table(section.title, section.table, rows, section.note, section.text)
            elif section.absent:
                console.print(f"{section.title}: {section.note}", highlight=False)
    if report is not None:
        from xsp.analysis.report import write_report

        try:
            count = write_report(store, report, f"xsp: {run_dir}")
        except OSError as exc:
            raise XspError(f"cannot write {report}: {exc}") from exc
        console.print(f"wrote a report of {count} analyses to {report}", highlight=False)


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
