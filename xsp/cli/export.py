"""``xsp export`` (a run's traces to a file) and ``xsp push`` (to Jaeger, the xsp collector or
any OTLP endpoint, with the Jaeger UI link that finds them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from xsp.cli.common import console, out_console, store_location, warn
from xsp.core.errors import XspError
from xsp.tracer.export.formats import FORMATS

if TYPE_CHECKING:
    from xsp.core.store import Run
    from xsp.tracer.export.formats import ExportSource, RunSpans
    from xsp.tracer.export.sinks import SpanBatch

__all__ = ["export", "push"]


_TRACED = click.option(
    "--traced",
    is_flag=True,
    help="The level-set runs as traced, each with its own step times (their roots titled "
    "'· MFLG (traced)'), instead of the replayed step.",
)
# the default for a measurement since issue 52; still forces the replay of a single run directory
_RECONSTRUCTED = click.option("--reconstructed", is_flag=True, hidden=True)


@click.command()
@click.argument("run_dir", type=store_location())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    default=next(iter(FORMATS)),
    show_default=True,
    help="; ".join(f"{f.name}: {f.help}" for f in FORMATS.values()) + ".",
)
@_TRACED
@_RECONSTRUCTED
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="File to write (default: stdout)."
)
def export(run_dir: Path, fmt: str, traced: bool, reconstructed: bool, output: Path | None) -> None:
    """Write a measurement's replayed step (the leveled reconstruction: one untraced step per
    iteration), or with --traced its level-set runs as traced, as OTLP JSON Lines (one trace,
    i.e. iteration, per line) or as a Chrome/Perfetto trace."""
    from xsp.core.store import check_output, open_measurement

    if output is not None:
        check_output(output)  # never into the store's own files, nor a missing directory
    runs = open_measurement(run_dir, warn, foreign=True)  # another sender's: as it came in
    said = FORMATS[fmt].write(
        _source(run_dir, runs, _replayed(run_dir, runs, traced, reconstructed)), output
    )
    if said:
        console.print(said, highlight=False)


def _replayed(run_dir: Path, runs: list[Run], traced: bool, reconstructed: bool) -> bool:
    """Whether export and push write the replayed step: by default for a measurement directory
    whose runs recorded the framework level (what the replay needs beyond M's steps); a single
    run directory, a measurement of steps alone and another sender's spans go as stored."""
    from xsp.core import schema
    from xsp.core.store import RUN_META

    if traced and reconstructed:
        raise XspError("--traced and --reconstructed exclude each other")
    if traced or reconstructed:
        return reconstructed
    if (run_dir / RUN_META).exists():
        return False
    return any("F" in str(r.resource.get(schema.RES_LEVELS) or "") for r in runs)


def _source(run_dir: Path, runs: list[Run], reconstructed: bool) -> ExportSource:
    """What export and push write: each run's spans, or the one reconstructed measurement
    (rebuilt only when the spans are read)."""
    from xsp.tracer.export.formats import ExportSource

    if not reconstructed:
        return ExportSource.of_runs(runs)
    return ExportSource(runs, lambda: [_reconstructed(run_dir)])


def _reconstructed(run_dir: Path) -> RunSpans:
    """The leveled reconstruction of a measurement, as one batch of spans."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct, reconstructed_resource
    from xsp.tracer.export.formats import RunSpans
    from xsp.tracer.export.sinks import SpanBatch

    store = MeasurementStore(run_dir)  # its warnings were printed as the runs were opened
    store.require_spans()
    spans, mismatches = reconstruct(store)
    if mismatches.num_rows:
        console.print(
            f"{mismatches.num_rows} spans had no counterpart in a shallower run "
            "and kept their own timing",
            highlight=False,
        )
    return RunSpans(SpanBatch.of(reconstructed_resource(store), spans))


@click.command()
@click.argument("run_dir", type=store_location())
@click.option("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).")
@_TRACED
@_RECONSTRUCTED
@click.option(
    "--as-stored",
    is_flag=True,
    help="Send the spans as stored: one service, stored names and parents (no viewer layout).",
)
@click.option(
    "--ui",
    "ui_url",
    help="Jaeger UI base URL for the printed link (default: the endpoint's host, port 16686); "
    "no link where no Jaeger answers there.",
)
@click.option(
    "--max-spans-per-trace",
    type=click.IntRange(min=0),
    default=8192,  # view.DEFAULT_MAX_SPANS_PER_TRACE (tests/test_view.py checks they agree)
    show_default=True,
    help="Fold a larger trace's API calls and kernels into per-op summaries (0: never); "
    "Jaeger's UI slows past about 2k spans a trace and fails at 20-40k.",
)
def push(
    run_dir: Path,
    endpoint: str | None,
    traced: bool,
    reconstructed: bool,
    as_stored: bool,
    ui_url: str | None,
    max_spans_per_trace: int,
) -> None:
    """Send a measurement's replayed step (with --traced, its level-set runs as traced; a run
    directory as stored) to Jaeger, the xsp collector or any OTLP endpoint, and print the link
    to Jaeger's search for them where a Jaeger UI answers.

    One trace per iteration; requests stay under 3 MiB (Jaeger's gRPC limit is 4 MiB).
    OTEL_EXPORTER_OTLP_* variables choose the protocol, headers and timeout. The spans go out
    laid out for Jaeger (docs/export.md): one service per level (<service>.model, .framework,
    .library, .gpu), each layer's backward under a "<layer> (backward)" span, short kernel
    names (the full name in xsp.kernel.name); the xsp collector stores them as the tracer did.
    A trace of more than --max-spans-per-trace spans keeps its model and framework spans and
    folds its API calls and kernels into per-op summary spans (not stored by a collector).
    """
    from xsp.core.otlp.transport import OtlpConfig, make_transport
    from xsp.core.store import open_measurement
    from xsp.tracer.export.sinks import OtlpSink

    runs = open_measurement(run_dir, warn, foreign=True)  # another sender's: as it came in
    config = OtlpConfig.from_env(endpoint)
    if config is None:
        raise XspError("no endpoint: give --endpoint or set OTEL_EXPORTER_OTLP_ENDPOINT")
    replayed = _replayed(run_dir, runs, traced, reconstructed)
    with console.status("reading the spans" + (" and replaying the step" if replayed else "")):
        batches = [spans.batch for spans in _source(run_dir, runs, replayed).spans()]
    total = sum(batch.table.num_rows for batch in batches)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("sending spans", total=total)
        sink = OtlpSink(
            make_transport(config),
            view=not as_stored,
            on_sent=lambda spans: bar.advance(task, spans),
            max_spans_per_trace=max_spans_per_trace,
        )
        try:
            for batch in batches:
                sink.export(batch)
        finally:
            sink.shutdown()
    layers = sink.view_spans_sent - sink.summaries_sent
    added = f" and {layers} backward layer and gradient accumulation spans" if layers else ""
    if sink.spans_folded:
        added += f"; {sink.spans_folded} spans folded into {sink.summaries_sent} summaries"
    console.print(
        f"sent {sink.spans_sent} spans{added} in {sink.requests_sent} requests to "
        f"{config.endpoint} ({config.protocol})",
        highlight=False,
        soft_wrap=True,
    )
    _print_link(ui_url, config.endpoint, batches, not as_stored, max_spans_per_trace)


def _print_link(
    ui_url: str | None,
    endpoint: str,
    batches: list[SpanBatch],
    per_level: bool,
    max_spans_per_trace: int,
) -> None:
    """The search link on stdout where a Jaeger UI answers at ``--ui`` (default: the
    endpoint's host, port 16686); else one line saying there is none (the xsp collector, or
    another OTLP receiver, took the spans)."""
    from xsp.cli.jaeger_link import default_ui, is_jaeger_ui, search_link

    ui = ui_url or default_ui(endpoint)
    if not is_jaeger_ui(ui):
        console.print(
            f"no link: no Jaeger UI answers at {ui} (--ui URL names one)", highlight=False
        )
        return
    link = search_link(ui, batches, per_level, max_spans_per_trace)
    if link is None:
        return
    out_console.print(f"open in Jaeger: {link.url}", highlight=False, soft_wrap=True)
    if link.limit < link.traces:
        console.print(
            f"the link lists {link.limit} of the {link.traces} traces, so that it opens fast; "
            "raise Limit Results in the search form for more",
            highlight=False,
        )
