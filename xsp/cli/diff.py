"""``xsp diff``: two measurements of one workload compared section by section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xsp.cli.common import console, open_store, say, store_location, warn
from xsp.cli.render import print_table
from xsp.core.errors import XspError

__all__ = ["diff_command"]


@click.command("diff")
@click.argument("before", type=store_location())
@click.argument("after", type=store_location())
@click.option("--rows", type=int, default=10, show_default=True, help="Rows per table.")
@click.option("--json", "as_json", is_flag=True, help="Print every section's rows as JSON.")
@click.option(
    "--report",
    type=click.Path(path_type=Path),
    help="Also write an HTML diff report (the step's waterfall first, then every section).",
)
def diff_command(before: Path, after: Path, rows: int, as_json: bool, report: Path | None) -> None:
    """Compare two measurements of one workload (two configurations, GPUs or commits; before
    and after a fix): the untraced step, layers by GPU time and by critical-path time, GPU
    kernels by name with their calls, ops, memory per layer, hardware counters where both have
    them, and the critical path's causes.

    Each row has before, after, change and a verdict (faster, slower or noise) from the
    per-iteration samples: a bootstrap interval of the difference of medians. Layers match by
    module path, ops by layer and name, kernels by name; a kernel one side lacks is marked
    "only before" or "only after". The tables fit the terminal's width: where it is too narrow,
    a secondary column (the change in %, calls) is left out and named under the table. With --json, stdout holds one object: ``before``, ``after``,
    ``test``, ``changes``, ``warnings`` and ``sections`` (``step``, ``replayed_step``,
    ``layers_gpu``, ``layers_critical_path``, ``kernels``, ``ops``, ``memory``, ``counters``,
    ``causes``), each with its ``rows`` (``before_ms``, ``after_ms``, ``change_ms``,
    ``change_pct``, ``ci_low_ms``, ``ci_high_ms``, ``verdict``, ``match``).

        xsp diff runs/r50 runs/r50-channels-last --report diff.html
    """
    import json

    from xsp.analysis.diff import diff, rows_json

    if report is not None:
        from xsp.core.store import check_output

        check_output(report)
    result = diff(open_store(before, out=not as_json), open_store(after, out=not as_json))
    for message in result.warnings:  # beside the tables they qualify; --json keeps stdout JSON
        warn(message, out=not as_json)
    if as_json:
        click.echo(json.dumps(rows_json(result), indent=1))
    else:
        _print_diff(result, rows)
    if report is not None:
        from xsp.analysis.diff_report import write_diff_report

        try:
            write_diff_report(result, report)
        except OSError as exc:
            raise XspError(f"cannot write {report}: {exc}") from exc
        console.print(f"wrote the diff report to {report}", highlight=False)


def _print_diff(result: Any, rows: int) -> None:
    """The diff's tables: the step (M's and the replayed one together), then each section with
    its label, before, after, change, verdict (and calls, and which side has a row alone)."""
    import pyarrow as pa

    changes = "; ".join(result.changes) or "no configuration change recorded"
    for line in (f"before {result.before}", f"after  {result.after}", changes):
        say(line, hang="  ")
    for section in result.sections:
        if section.key == "replayed_step":
            continue  # a row of the step's table
        if section.absent:
            say(f"{section.title}: {section.absent}")
            continue
        table = section.table
        if section.key == "step" and result.section("replayed_step").table.num_rows:
            table = pa.concat_tables([table, result.section("replayed_step").table])
        print_table(section.title, _diff_view(table), rows, section.note)
    say(f"verdicts: {result.test}")


def _diff_view(table: Any) -> Any:
    """A diff section as the terminal shows it: the interval left to --json, the side a row
    exists on alone beside its verdict ("faster, only before"), calls as "11 -> 0"."""
    import pyarrow as pa

    records = table.to_pylist()
    view: dict[str, list[Any]] = {}
    for name in table.column_names:
        if name.startswith("ci_") or name in {"match", "after_calls_per_iteration"}:
            continue
        if name == "verdict":
            view[name] = [
                r["verdict"]
                if r.get("match", "both") == "both"
                else f"{r['verdict']}, {r['match']}"
                for r in records
            ]
        elif name == "before_calls_per_iteration":
            view["calls"] = [  # per iteration
                f"{r[name]:g} -> {r['after_calls_per_iteration']:g}" for r in records
            ]
        else:
            view[name] = table.column(name).to_pylist()
    return pa.table(view) if records else table
