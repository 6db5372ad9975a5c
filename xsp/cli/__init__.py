"""The ``xsp`` command line.

    xsp run --model torchvision:resnet18 --batch-size 2 --levels M,MF --device cpu --out R
    xsp run --levels M,MF --iterations 5 --out R -- python train.py --epochs 1
    xsp export R --format otlp-json -o trace.jsonl
    xsp summary R
    xsp verify R --rounds 3
    xsp estimate R --fix channels_last
    xsp models --source timm --filter vit

Every failure prints one line, ``xsp: error: ...``, and exits with status 2 (bad input) or 1 (the
workload failed; what it recorded is still in the store). ``xsp run`` passes the traced
program's own exit code on (128+N when signal N killed it) and exits 130 when interrupted.
What a reader leaves out of a store (a missing level set, no manifest) prints as
``xsp: warning: ...``.

One module per command or group of commands (run, export and push, collector, analyze, summary,
diff, native and models, verify, campaign); common.py holds what they share (the consoles,
errors, progress bars), render.py the terminal tables and the replay's lines. A command's
heavy imports (torch, pyarrow, the analyses) stay inside it: the store-only commands never load
torch (tests/test_layout.py).
"""

from __future__ import annotations

import click

from xsp.cli import (
    analyze,
    campaign,
    collector,
    diff,
    estimate,
    export,
    install,
    run,
    summary,
    verify,
)
from xsp.cli.common import XspGroup

__all__ = ["main"]


@click.group(cls=XspGroup)
@click.version_option(package_name="xsp")
def main() -> None:
    """xsp: across-stack tracing of PyTorch workloads (model, framework, library, GPU)."""


main.add_command(run.run)
main.add_command(export.export)
main.add_command(export.push)
main.add_command(collector.collector)
main.add_command(analyze.analyze)
main.add_command(summary.summary)
main.add_command(diff.diff_command)
main.add_command(install.native)
main.add_command(install.models)
main.add_command(verify.verify)
main.add_command(estimate.estimate)
main.add_command(campaign.campaign)
