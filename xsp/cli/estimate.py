"""``xsp estimate``: the ops each kernel-changing fix touches, timed in isolation and replayed."""

from __future__ import annotations

from pathlib import Path

import click

from xsp.cli.common import console, out_console

__all__ = ["estimate"]


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--fix",
    "fixes",
    multiple=True,
    help="Time this fix's ops (channels_last, tf32, bf16; repeatable). Default: the fixes of "
    "the measurement's suggestions that change kernels.",
)
@click.option(
    "--budget-ms",
    type=float,
    default=None,
    help="About how long each timing runs (one op's forward or backward, without or with "
    "the fix); default 10.",
)
@click.option("--device", default=None, help="Time on this device (default: the measurement's).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object.")
def estimate(
    run_dir: Path,
    fixes: tuple[str, ...],
    budget_ms: float | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Estimate what a fix that changes kernels (channels_last, TF32, bf16) gains, by measuring
    the ops it changes: each distinct op of the measurement that the fix touches (convolutions,
    batch norms, GEMMs) is rebuilt from its recorded shapes and timed on the measurement's device
    without and with the fix, forward and backward, a few milliseconds each; the step is then
    replayed with each op's kernels (on a CPU, its host time) scaled by its ratio.

    Run it on the machine with the measurement's device. The timings go to
    RUN/estimates/<fix>.json; `xsp analyze RUN` and `xsp verify RUN` then give the suggestion's
    gain as "measured in isolation" instead of modelled (docs/verify.md). Exits 0, or 2 on bad
    input (a fix that changes no op, a measurement without op shapes, no GPU here for a GPU
    measurement).
    """
    import json

    from xsp.campaign import estimate as estimating

    def progress(fix: str, done: int, total: int) -> None:
        if not as_json and (done == total or done % 10 == 0):
            console.print(f"{fix}: {done}/{total} ops timed", highlight=False)

    found = estimating.estimate(run_dir, fixes, budget_ms, device, progress)
    if as_json:
        click.echo(json.dumps({"measurement": str(run_dir), "fixes": [f.record() for f in found]}))
        return
    for result in found:
        out_console.print(estimating.summary_line(result), highlight=False, soft_wrap=True)
    console.print(f"timings in {run_dir / 'estimates'}", highlight=False)
