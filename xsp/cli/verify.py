"""``xsp verify``: each suggestion's fix measured in paired rounds."""

from __future__ import annotations

from pathlib import Path

import click

from xsp.cli.common import (
    IN_PROCESS_HELP,
    bar_per_key,
    console,
    fail,
    out_console,
    stdout_to_stderr,
)
from xsp.core.errors import EXIT_INTERRUPTED

__all__ = ["verify"]


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--rounds",
    type=int,
    default=3,
    show_default=True,
    help="Rounds: a process without and one with the fix (--in-process: one process, both).",
)
@click.option("--rule", "rules", multiple=True, help="Verify only this rule (repeatable).")
@click.option("--in-process", is_flag=True, help=IN_PROCESS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
def verify(
    run_dir: Path, rounds: int, rules: tuple[str, ...], in_process: bool, as_json: bool
) -> None:
    """Measure each suggestion of a measurement: re-run its workload untraced (level set M)
    without and with the suggestion's fix, applied without editing the program, in paired
    rounds (the order alternates, each run a process of its own), then once with the fix at the
    measurement's deepest level set to show what changed. With --in-process (a zoo model), each
    round is one process that builds the workload without and with the fix and times the two
    in alternating blocks: a host-bound step drifts by more between processes than a small
    fix gains, and inside one process both sides share that drift. A suggestion that needs a
    change to the program's code says so and is not run.

    Runs are stored in RUN_DIR/verify/<rule>/ (round-K/base, round-K/fixed or process-K,
    mechanism); the rows in RUN_DIR/verify/verify.json. Each row: rule,
    predicted_gain_ms_per_iteration, measured_gain_ms_per_iteration, measured_gain_ci_ms,
    measured_gain_pct, numerics_change, rounds, method, status, evidence (docs/verify.md says
    how the gain and its interval are computed).
    Exits 0 when every rule was verified or needs a code change, 1 when a run failed, 2 on bad
    input, 130 when interrupted.
    """
    import json

    from xsp.campaign import verify as verifying

    planned = verifying.plan(
        run_dir, rounds, rules, in_process
    )  # bad input: one line, before any bar
    with stdout_to_stderr(as_json), bar_per_key() as progress:
        result = verifying.run_plan(planned, progress)
    if as_json:
        click.echo(json.dumps(result.document(), indent=1))
    else:
        for found in result.results:
            out_console.print(verifying.summary_line(found), highlight=False, soft_wrap=True)
        console.print(f"runs and verify.json in {run_dir / verifying.VERIFY_DIR}", highlight=False)
    if result.interrupted:
        fail("interrupted; the rules verified so far are in verify.json", EXIT_INTERRUPTED)
    failed = [found.row["rule"] for found in result.results if found.failed]
    if failed:
        fail(f"runs failed for {', '.join(failed)}; their reasons are in verify.json", code=1)
