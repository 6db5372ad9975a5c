"""What this installation holds: ``xsp native`` (its native modules, built once) and
``xsp models`` (the zoo models ``xsp run --model`` takes)."""

from __future__ import annotations

import click

from xsp.cli.common import console

__all__ = ["models", "native"]


@click.command()
def native() -> None:
    """Build xsp's native capture core for this torch and the collector's C modules (the door's
    check, the store worker's span decoder) once (later runs reuse them), and say where they are
    and whether the core holds CUPTI (levels L and G)."""
    from xsp.collector import door, span_columns
    from xsp.tracer.native.build import find_cupti, load

    module = load()
    cupti = find_cupti() if module.WITH_CUPTI else None
    console.print(
        f"native capture core: {module.__file__}\n"
        f"CUPTI: {cupti.library if cupti else 'not built in (no CUDA build of torch or no cupti.h)'}\n"
        f"collector door: {door.load().__file__}\n"
        f"collector span decoder: {span_columns.load().__file__}",
        highlight=False,
        soft_wrap=True,  # a path stays whole on its line, however narrow the terminal
    )


@click.command()
@click.option("--source", type=click.Choice(["torchvision", "timm", "transformers"]))
@click.option("--filter", "pattern", help="Substring or shell pattern, e.g. resnet or 'vit_*224'.")
def models(source: str | None, pattern: str | None) -> None:
    """List the zoo models (random weights, synthetic inputs, nothing downloaded)."""
    from xsp.tracer.workloads.names import list_models

    entries = list_models(source, pattern)
    for entry in entries:
        click.echo(f"{entry.qualified}\t{entry.task}")  # plain tab-separated lines, for scripts
    console.print(f"{len(entries)} models", highlight=False)
