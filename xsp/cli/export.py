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

__all__ = ["JAEGER_UI_PORT", "export", "push"]


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
@click.option(
    "--reconstructed",
    is_flag=True,
    help="Export the leveled reconstruction (each span timed by its level's shallowest run).",
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), help="File to write (default: stdout)."
)
def export(run_dir: Path, fmt: str, reconstructed: bool, output: Path | None) -> None:
    """Write a run's traces as OTLP JSON Lines (one trace, i.e. iteration, per line) or as a
    Chrome/Perfetto trace."""
    from xsp.core.store import check_output, open_measurement

    if output is not None:
        check_output(output)  # never into the store's own files, nor a missing directory
    runs = open_measurement(run_dir, warn, foreign=True)  # another sender's: as it came in
    said = FORMATS[fmt].write(_source(run_dir, runs, reconstructed), output)
    if said:
        console.print(said, highlight=False)


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
@click.option("--reconstructed", is_flag=True, help="Send the leveled reconstruction instead.")
@click.option(
    "--as-stored",
    is_flag=True,
    help="Send the spans as stored: one service, stored names and parents (no viewer layout).",
)
@click.option(
    "--ui",
    "ui_url",
    help="Jaeger UI base URL for the printed link (default: the endpoint's host, port 16686).",
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
    reconstructed: bool,
    as_stored: bool,
    ui_url: str | None,
    max_spans_per_trace: int,
) -> None:
    """Send a stored run to Jaeger, the xsp collector or any OTLP endpoint, and print the Jaeger
    UI link that finds its traces.

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
    with console.status("reading the spans" + (" and rebuilding them" if reconstructed else "")):
        batches = [spans.batch for spans in _source(run_dir, runs, reconstructed).spans()]
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
    added = f" and {layers} backward layer spans" if layers else ""
    if sink.spans_folded:
        added += f"; {sink.spans_folded} spans folded into {sink.summaries_sent} summaries"
    console.print(
        f"sent {sink.spans_sent} spans{added} in {sink.requests_sent} requests to "
        f"{config.endpoint} ({config.protocol})",
        highlight=False,
        soft_wrap=True,
    )
    link = _jaeger_link(ui_url or _default_ui(config.endpoint), batches, not as_stored)
    if link:
        out_console.print(f"open in Jaeger: {link}", highlight=False, soft_wrap=True)


#: Jaeger's query service (its UI) listens here unless configured otherwise.
JAEGER_UI_PORT = 16686


def _default_ui(endpoint: str) -> str:
    """The Jaeger UI next to an OTLP endpoint: the endpoint's host, port 16686."""
    import urllib.parse

    host = urllib.parse.urlsplit(endpoint).hostname or "127.0.0.1"
    return f"http://{host if ':' not in host else f'[{host}]'}:{JAEGER_UI_PORT}"


def _jaeger_link(ui: str, batches: list[SpanBatch], per_level: bool) -> str | None:
    """The UI's search for the pushed traces: the model level's service over the measurement's
    time range (microseconds, as the UI's URL takes them), so a run of any age is found."""
    import urllib.parse

    import pyarrow.compute as pc

    from xsp.core import schema

    tables = [b.table for b in batches if b.table.num_rows]
    if not tables:
        return None
    if per_level and all(t.column("level").null_count == t.num_rows for t in tables):
        per_level = False  # another sender's spans (no xsp level): its own service names
    start = min(pc.min(t.column("start_ns")).as_py() for t in tables)
    end = max(pc.max(pc.add(t.column("start_ns"), t.column("dur_ns"))).as_py() for t in tables)
    service = str(batches[0].resource.get(schema.RES_SERVICE_NAME) or schema.SERVICE_NAME)
    query = {
        "service": f"{service}.{schema.LEVEL_MODEL}" if per_level else service,
        "start": start // 1000,
        "end": -(-end // 1000),
        "lookback": "custom",
        "limit": 100,
    }
    return f"{ui.rstrip('/')}/search?{urllib.parse.urlencode(query)}"
