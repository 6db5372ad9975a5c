"""The ``xsp`` command line.

    xsp run --model torchvision:resnet18 --batch-size 2 --levels M,MF --device cpu --out R
    xsp run --levels M,MF --iterations 5 --out R -- python train.py --epochs 1
    xsp export R --format otlp-json -o trace.jsonl
    xsp summary R
    xsp verify R --rounds 3
    xsp models --source timm --filter vit

Every failure prints one line, ``xsp: error: ...``, and exits with status 2 (bad input) or 1 (the
workload failed; what it recorded is still in the store). ``xsp run`` passes the traced
program's own exit code on (128+N when signal N killed it) and exits 130 when interrupted.
What a reader leaves out of a store (a missing level set, no manifest) prints as
``xsp: warning: ...``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from xsp.core.errors import XspError
from xsp.tracer.export.formats import FORMATS

if TYPE_CHECKING:
    from xsp.core.store import Run
    from xsp.tracer.export.formats import ExportSource, RunSpans
    from xsp.tracer.export.sinks import SpanBatch

console = Console(stderr=True)
out_console = Console()


def _fail(message: str, code: int = 2) -> None:
    # messages quote what failed (a gloo error's "[/…/pair.cc:561]"): never read as markup
    console.print(f"[bold red]xsp: error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def _warn(message: str) -> None:
    console.print(f"[yellow]xsp: warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _labelled_bars(label: str) -> Progress:
    """Bars kept on screen when done, each labelled in bold by the task field ``label`` (a
    format such as ``{task.fields[key]}``), then what it does, done of total, time taken."""
    return Progress(
        TextColumn(f"[bold]{label}"),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def _bar_per_key() -> Iterator[Callable[[str, str, int, int], None]]:
    """A progress callback ``(key, what, done, total)`` that draws one bar per key (a rule, a
    campaign job), labelled with the key in bold, kept on screen when done."""
    with _labelled_bars("{task.fields[key]}") as bar:
        tasks: dict[str, Any] = {}

        def progress(key: str, what: str, done: int, total: int) -> None:
            if key not in tasks:
                tasks[key] = bar.add_task(what, total=total, key=key)
            bar.update(tasks[key], description=what, completed=done, total=total)

        yield progress


#: Ctrl-C: 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except XspError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            _fail("interrupted", EXIT_INTERRUPTED)


@click.group(cls=_Group)
@click.version_option(package_name="xsp")
def main() -> None:
    """xsp: across-stack tracing of PyTorch workloads (model, framework, library, GPU)."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--model", help="Zoo model, SOURCE:NAME (see `xsp models`).")
@click.option("--batch-size", type=int, default=1, show_default=True)
@click.option("--mode", type=click.Choice(["train", "infer"]), default="infer", show_default=True)
@click.option(
    "--levels", default="M,MF", show_default=True, help="Level sets, one run each: M,MF,..."
)
@click.option(
    "--iterations",
    type=int,
    default=10,
    show_default=True,
    help="Measured iterations; 0: until the program ends or is stopped (a service, docs/serving.md).",
)
@click.option(
    "--duration",
    type=float,
    metavar="SECONDS",
    help="Stop measuring after this long (a service); stored in batches while it runs.",
)
@click.option(
    "--sample-every",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="With --iterations 0 or --duration: levels below M record every Nth iteration.",
)
@click.option(
    "--sample-rate",
    type=float,
    metavar="R",
    help="With --iterations 0 or --duration: levels below M record at most R iterations a second.",
)
@click.option(
    "--export-every",
    type=float,
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="With --iterations 0 or --duration: store (and send) finished iterations this often.",
)
@click.option(
    "--warmup",
    type=int,
    default=2,
    show_default=True,
    help="Untraced iterations first, at least; a zoo model warms up on until its step is steady (run.json: warmup, warmup_settled).",
)
@click.option("--device", help="cpu, cuda or cuda:N (default: cuda when present).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory (default: xsp-runs/<time>).",
)
@click.option("--otlp-endpoint", help="Also send spans over OTLP (OTEL_EXPORTER_OTLP_* apply).")
@click.option(
    "--op-shapes/--no-op-shapes",
    default=True,
    show_default=True,
    help="Record aten ops' input shapes and dtypes (level F).",
)
@click.option(
    "--channels-last", is_flag=True, help="Zoo models: NHWC (channels_last) weights and inputs."
)
@click.option(
    "--counter-iterations",
    type=int,
    default=1,
    show_default=True,
    help="Iterations the hardware-counter level set (MH, under ncu) measures.",
)
@click.option(
    "--m-processes",
    type=int,
    default=None,
    help="Time M in this many processes (the host's speed varies between processes): M is "
    "reported as a median with a 95% interval. 1: one process, no interval. [default: 3, "
    "or XSP_M_PROCESSES]",
)
@click.option(
    "--interleave/--no-interleave",
    default=True,
    show_default=True,
    help="With two level sets or more, the one that prices F's cost runs an untraced iteration "
    "before each traced one, so that the replay is checked against untraced steps of the same "
    "process (a script then needs --warmup + 2 x --iterations steps).",
)
@click.option(
    "--fix",
    "fixes",
    multiple=True,
    help="Apply a fix without editing the program (repeatable): channels_last, tf32, bf16, "
    "cudnn_benchmark, dataloader, compile, cuda_graphs, alloc_conf (docs/verify.md).",
)
@click.option(
    "--iteration-fn",
    metavar="MODULE.QUALNAME",
    help="Each call of this function is one iteration (a whole request), e.g. "
    "transformers.GenerationMixin.generate.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    model: str | None,
    batch_size: int,
    mode: str,
    levels: str,
    iterations: int,
    duration: float | None,
    sample_every: int,
    sample_rate: float | None,
    export_every: float,
    warmup: int,
    device: str | None,
    out: Path | None,
    otlp_endpoint: str | None,
    op_shapes: bool,
    channels_last: bool,
    counter_iterations: int,
    m_processes: int | None,
    interleave: bool,
    fixes: tuple[str, ...],
    iteration_fn: str | None,
    command: tuple[str, ...],
) -> None:
    """Profile a zoo model, or a Python command given after --, once per level set.

    Level set MH reads hardware counters (FLOPs by precision, DRAM and L2 bytes, occupancy,
    throughput) of every kernel of its measured iterations under Nsight Compute (ncu, which
    replays each kernel); without ncu it is skipped with one line and the others run.

    Each level set runs in a process of its own (a zoo model's forked from a server that
    imported torch once; XSP_FORK_SERVER=0: fresh interpreters), started while the one before
    finishes but measuring only once it has exited (a zoo model's on a GPU all start at once,
    warm up side by side and measure in turn; XSP_OVERLAP=0: one after the other), and
    writes RUN_DIR/<levels>/. A zoo model's MF runs in M's process once M has stored its run
    (XSP_SHARE_PROCESS=0: a process of its own);
    RUN_DIR/manifest.json ties them into one leveled measurement. A summary is printed at the
    end. A multi-rank job (-- torchrun ... or -- python -m torch.distributed.run ...) is traced
    on every rank, one trace per iteration across ranks.

    \b
    How a command's iterations are found (run.json: iteration_boundary):
      marked            xsp.step() or `with xsp.iteration():` in the script; these win
      function:NAME     --iteration-fn NAME: each call of the function
      optimizer-step    training: from one optimizer.step() to the next
      root-module-call  inference: each call of the outermost module (a forward pass;
                        under transformers' generate(), one decoding step)
    Optimizer steps are the boundary if one comes during the warm-up, else root-module
    calls (see docs/profiling.md).

    A service: --iterations 0 measures until the program ends or is stopped (Ctrl-C,
    SIGTERM), --duration for a time; finished iterations are stored every --export-every
    seconds while it runs. M records every iteration, the levels below it the sample that
    --sample-every / --sample-rate pick (docs/serving.md).

    Exits 0 when every level set is ok; the program's own exit code when it exited nonzero
    (128+N when signal N killed it); 1 when a level set failed or is partial otherwise; 2 on
    bad input; 130 when interrupted (Ctrl-C stops the level-set process too; the manifest
    keeps what finished).
    """
    import time

    from xsp.tracer.run.procfs import process_age_ns

    started_ns = time.time_ns() - (process_age_ns() or 0)
    from xsp.core import config
    from xsp.core.levelset import parse_level_sets
    from xsp.tracer.run.runner import LeveledSpec, check_arguments, run_leveled
    from xsp.tracer.spec import ProfileSpec

    try:
        level_sets = parse_level_sets(levels)
    except ValueError as exc:
        raise XspError(str(exc)) from exc
    out = out or Path("xsp-runs") / time.strftime("%Y%m%d-%H%M%S")
    profile = ProfileSpec(
        iterations=iterations,
        warmup=warmup,
        device=device,
        model=model,
        batch_size=batch_size,
        mode=mode,
        channels_last=channels_last,
        command=command,
        otlp_endpoint=otlp_endpoint,
        op_shapes=op_shapes,
        counter_iterations=counter_iterations,
        fixes=fixes,
        iteration_fn=iteration_fn,
        duration_s=duration,
        sample_every=sample_every,
        sample_rate=sample_rate,
        export_every_s=export_every,
    )
    spec = LeveledSpec(
        out=out,
        profile=profile,
        level_sets=tuple(level_sets),
        fork_server=config.switch("XSP_FORK_SERVER", True),
        overlap=config.switch("XSP_OVERLAP", True),
        share_process=config.switch("XSP_SHARE_PROCESS", True),
        m_processes=config.m_processes() if m_processes is None else m_processes,
        interleave=interleave,
    )
    check_arguments(spec)  # before torch is imported and the bars drawn: bad input in a blink
    _import_in_background(_SUMMARY_MODULES)
    with _labelled_bars("{task.fields[levels]:>5}") as bar:
        tasks: dict[str, Any] = {}

        def progress(levels: str, phase: str, done: int, total: int) -> None:
            if phase == "start":
                tasks[levels] = bar.add_task("starting", total=total or None, levels=levels)
            elif phase == "end":
                bar.update(tasks[levels], description="done" if done == 0 else f"exit {done}")
            elif phase == "measure" and not total:  # a service: measured until stopped
                bar.update(
                    tasks[levels], description="measure (until stopped)", completed=done, total=done
                )
            else:
                bar.update(tasks[levels], description=phase, completed=done, total=total or None)

        result = run_leveled(spec, progress)
    if result.runs and not result.stored:  # nothing measured: one line, no summary of nothing
        _fail(f"{result.failure}; nothing was stored", code=result.exit_code)
    try:
        _print_summary(out)
    except XspError as exc:  # nothing finished (an interrupt, a crash): no summary to print
        _warn(f"no summary: {exc}")
    if said := _note_own_time(out, started_ns):
        out_console.print(said, highlight=False, soft_wrap=True)
    console.print(f"spans stored in [bold]{out}[/]", highlight=False)
    if result.interrupted:
        _fail(f"interrupted; the finished level sets are in {out}", code=result.exit_code)
    if not result.ok:
        _fail(f"{result.failure}; spans recorded so far are in {out}", code=result.exit_code)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
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
    runs = open_measurement(run_dir, _warn, foreign=True)  # another sender's: as it came in
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
    from xsp.analysis.reconstruct import reconstruct, reconstructed_resource
    from xsp.analysis.store import MeasurementStore
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


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
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
    from xsp.core.store import open_measurement
    from xsp.tracer.export.sinks import OtlpSink
    from xsp.tracer.export.transport import OtlpConfig, make_transport

    runs = open_measurement(run_dir, _warn, foreign=True)  # another sender's: as it came in
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


@main.group()
def collector() -> None:
    """The OTLP collector service."""


@collector.command()
@click.option(
    "--store",
    "store_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Run store to write (created if missing).",
)
@click.option(
    "--grpc",
    "grpc_address",
    default="127.0.0.1:4317",
    show_default=True,
    help="OTLP/gRPC HOST:PORT ('' to disable).",
)
@click.option(
    "--http",
    "http_address",
    default="127.0.0.1:4318",
    show_default=True,
    help="OTLP/HTTP HOST:PORT ('' to disable).",
)
@click.option("--forward", help="Also forward every request to this OTLP endpoint (e.g. Jaeger).")
@click.option(
    "--token", envvar="XSP_COLLECTOR_TOKEN", help="Require 'Authorization: Bearer TOKEN'."
)
@click.option("--tls-cert", type=click.Path(exists=True, path_type=Path))
@click.option("--tls-key", type=click.Path(exists=True, path_type=Path))
@click.option("--max-request-mib", type=float, default=32, show_default=True)
def serve(
    store_dir: Path,
    grpc_address: str,
    http_address: str,
    forward: str | None,
    token: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    max_request_mib: float,
) -> None:
    """Receive OTLP traces (gRPC, HTTP protobuf/JSON) into a run store until interrupted.

    A request is acknowledged once its spans are in the write-ahead spool (fsync'ed), so a killed
    collector loses no acknowledged span: the next start stores what the spool holds.
    """
    from xsp.collector.server import CollectorConfig
    from xsp.collector.server import serve as run_server

    config = CollectorConfig(
        store=store_dir,
        grpc_address=grpc_address or None,
        http_address=http_address or None,
        forward=forward,
        token=token,
        tls_cert=tls_cert,
        tls_key=tls_key,
        max_request_bytes=int(max_request_mib * 1024 * 1024),
        store_workers=1,  # conversion in its own process: the receivers keep the GIL
    )

    def ready(c: Any) -> None:
        parts = []
        if c.grpc_port:
            parts.append(f"gRPC {grpc_address.rsplit(':', 1)[0]}:{c.grpc_port}")
        if c.http_port:
            parts.append(f"HTTP {http_address.rsplit(':', 1)[0]}:{c.http_port}")
        replaying = len(c.spool.recovered)
        console.print(
            f"xsp collector: receiving on {', '.join(parts)}; store {store_dir}"
            + (f"; storing {replaying} spooled segments in the background" if replaying else ""),
            highlight=False,
        )

    run_server(config, ready)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
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
    from xsp.analysis.reconstruct import reconstruct
    from xsp.core.store import RECONSTRUCTED, check_output, check_run_destination

    if report is not None:
        check_output(report)  # before the work: never over the store's own files
    if save_reconstruction:  # nor through a link into another run's
        check_run_destination(run_dir / RECONSTRUCTED, run_dir)
    store = _open_store(run_dir)
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
        _print_summary(run_dir, store, replay_warnings=False)
        if median_ms is not None:
            console.print(
                f"reconstructed: {spans.num_rows:,} spans, model latency median {median_ms:.3f} "
                f"ms; {mismatches.num_rows} spans without a counterpart in a shallower run",
                highlight=False,
            )
        _print_replay(store)
        skip = {"level_sets", "layer_info"}  # printed above / too wide for a terminal
        for section in sections(store):
            if section.table.num_rows and section.key not in skip:
                _print_table(section.title, section.table, rows, section.note, section.text)
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
        "measurement": str(run_dir),
        "reconstruction": {
            "spans": spans,
            "model_latency_median_ms": median_ms,
            "spans_without_counterpart": mismatches,
            "replay": _replay_summary(store),
        },
        "analyses": analyses,
    }
    click.echo(json.dumps(document, indent=1, default=str))


def _replay_summary(store: Any) -> dict[str, Any]:
    """The replay's check against M (``reconstruction.replay``)."""
    from xsp.analysis.replay import replay

    return replay(store).summary()


def _print_replay(store: Any) -> None:
    """The replayed step against M's, its two checks (the F process's held-out untraced steps,
    M's interval across processes), then F's cost taken off where a check changed it, the
    ranks' waits for each other, and what could not be checked or did not hold."""
    found = _replay_summary(store)
    if found is None or found["step_ms"] is None:
        return
    against = (
        f" against M's {found['measured_step_ms']:.3f} ms ({found['error_pct']:+.1f}%)"
        if found["measured_step_ms"]
        else ""
    )
    unsteady = found["unsteady_iterations"]
    console.print(
        f"replayed step {found['step_ms']:.3f} ms{against}"
        + (f"; iterations {unsteady} not steady, left out" if unsteady else ""),
        highlight=False,
    )
    for line in _replay_check_lines(found):
        console.print(f"  {line}", highlight=False)
    calib = found["calibration"]
    if calib["scaled_to_own_steps"] is not None and calib["framework_ns_per_record"]:
        checks = calib["source"].split("; ", 1)[-1]
        console.print(
            f"F's cost taken off the host's times: {calib['framework_ns_per_record'] / 1e3:.2f} µs "
            f"an op record, {calib['scaled_to_own_steps']:g}x the probe's ({checks})",
            highlight=False,
        )
    waits = found["median_collective_wait_ms"]
    if waits:
        each = ", ".join(f"rank {rank} {ms:.3f} ms" for rank, ms in waits.items())
        console.print(
            f"collectives replayed across ranks; each rank's wait for the last to arrive, median "
            f"a step: {each}",
            highlight=False,
        )
    for line in _replay_warnings(found):
        _warn(line)


def _replay_check_lines(found: dict[str, Any]) -> list[str]:
    """The two checks that ran, one line each (``xsp.analysis.replay_checks``)."""
    lines = []
    own = found.get("in_process")
    if own is not None:
        lines.append(
            f"in-process check: {own['error_pct']:+.1f}% against the {own['run']} process's "
            f"untraced {own['untraced_ms']:.3f} ms ({len(own['checked_iterations'])} held-out "
            f"of {own['pairs']} untraced/traced pairs; within {own['tolerance_pct']:g}%: "
            f"{'yes' if own['holds'] else 'no'})"
        )
    across = found.get("m_interval")
    if across is not None and across["processes"] > 1:
        each = ", ".join(f"{ms:.3f}" for ms in across["process_medians_ms"])
        lines.append(
            f"across processes: {across['position']} M's {across['coverage']:.0%} interval "
            f"{across['low_ms']:.3f}-{across['high_ms']:.3f} ms over {across['processes']} "
            f"processes (their medians {each} ms)"
        )
    return lines


def _replay_warnings(found: dict[str, Any]) -> list[str]:
    """Why the replayed step may be off: the F run measured no cost of its own to take off the
    host's times, a check could not run (``unchecked``), or a check did not hold."""
    from xsp.analysis.host_timeline import NO_CALIBRATION

    lines = []
    if NO_CALIBRATION in found["calibration"]["source"]:
        lines.append(
            f"{found['calibration']['source']} (a store older than the probe): the host's times "
            "keep the tracer's cost, so the replayed step and its verdict overstate host work; "
            "record it again to read them"
        )
    lines += [f"unchecked {why}" for why in found.get("unchecked") or []]
    own = found.get("in_process")
    if own is not None and not own["holds"]:
        lines.append(
            f"the replayed step is {own['error_pct']:+.1f}% off the {own['run']} process's own "
            f"held-out untraced steps ({own['untraced_ms']:.3f} ms): the host changed speed "
            "within that process, or F's cost per record is not one figure for this workload"
        )
    across = found.get("m_interval")
    if across is not None and across["processes"] > 1 and across["position"] != "inside":
        lines.append(
            f"the replayed step {across['replayed_ms']:.3f} ms is {across['position']} M's "
            f"interval {across['low_ms']:.3f}-{across['high_ms']:.3f} ms: the F process's host "
            "ran at another speed than M's processes did"
        )
    return lines


def _save_reconstruction(run_dir: Path, store: Any, spans: Any) -> None:
    from xsp.analysis.reconstruct import reconstructed_resource
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


def _fits(view: Any, ellipses: int) -> bool:
    """True when ``view`` renders at the terminal's width with no cell cut short and no line
    cropped (rich would otherwise cut cells with "…" or crop the table's right side)."""
    import io

    from rich.console import Console

    probe = Console(file=io.StringIO(), width=out_console.width, color_system=None)
    probe.print(view)
    rendered = probe.file.getvalue()  # type: ignore[attr-defined]
    # a cropped table loses its right border: its top edge no longer ends in a corner
    top = next((line for line in rendered.splitlines() if line.startswith("┏")), "┓")
    return top.endswith("┓") and rendered.count("…") <= ellipses


def _print_table(title: str, table: Any, rows: int, note: str = "", lead: str = "") -> None:
    """A table that reads at 80 columns: headers as words with units, numbers whole and never
    wrapped, long names cut (kernel names lose their template arguments; --json and the HTML
    report keep them whole). A table too wide for the terminal prints one block per row.
    ``lead`` is a line printed under the title, before the table (a chart in characters)."""
    from xsp.analysis.present import display, header

    records = table.slice(0, rows).to_pylist()
    cells = [{name: display(name, value, 48) for name, value in r.items()} for r in records]
    if lead:
        out_console.print(f"[bold]{title}[/]", highlight=False)
        out_console.print(lead, highlight=False)
    view = Table(title=None if lead else title, title_justify="left", caption_justify="left")
    for name in table.column_names:
        numeric = any(isinstance(r[name], (int, float)) for r in records)
        longest = max((len(c[name]) for c in cells), default=1)
        # numbers never wrap; text narrower than 14 columns wraps into too many lines to read
        width = longest if numeric else min(longest, 14)
        view.add_column(
            header(name),
            justify="right" if numeric else "left",
            min_width=width,
            overflow="ellipsis" if numeric else "fold",  # a long name wraps, whole
        )
    for row in cells:
        view.add_row(*row.values())
    captions = []
    if table.num_rows > rows:
        captions.append(f"{rows} of {table.num_rows} rows shown (--rows N for more)")
    if note:
        captions.append(note)
    caption = "; ".join(captions)
    if _fits(view, sum(c.count("…") for row in cells for c in row.values())):
        view.caption = caption or None
        out_console.print(view)
        return
    if not lead:
        out_console.print(f"[bold]{title}[/]", highlight=False)
    for index, record in enumerate(records, start=1):
        row = {name: display(name, value, 200) for name, value in record.items()}
        block = Table(show_header=False, box=None, padding=(0, 1), title=f"{index}.")
        block.title_justify = "left"
        block.add_column(style="dim")
        block.add_column()
        for name, text in row.items():
            block.add_row(header(name), text)
        out_console.print(block)
    if caption:
        out_console.print(caption, highlight=False)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
def summary(run_dir: Path) -> None:
    """Print the summary of a stored measurement."""
    _print_summary(run_dir)


@main.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
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
    "only before" or "only after". With --json, stdout holds one object: ``before``, ``after``,
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
    result = diff(_open_store(before), _open_store(after))
    for message in result.warnings:
        _warn(message)
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
    out_console.print(f"before {result.before}\nafter  {result.after}\n{changes}", highlight=False)
    for section in result.sections:
        if section.key == "replayed_step":
            continue  # a row of the step's table
        if section.absent:
            console.print(f"{section.title}: {section.absent}", highlight=False)
            continue
        table = section.table
        if section.key == "step" and result.section("replayed_step").table.num_rows:
            table = pa.concat_tables([table, result.section("replayed_step").table])
        _print_table(section.title, _diff_view(table), rows, section.note)
    console.print(f"verdicts: {result.test}", highlight=False)


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


@main.command()
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


@main.command()
@click.option("--source", type=click.Choice(["torchvision", "timm", "transformers"]))
@click.option("--filter", "pattern", help="Substring or shell pattern, e.g. resnet or 'vit_*224'.")
def models(source: str | None, pattern: str | None) -> None:
    """List the zoo models (random weights, synthetic inputs, nothing downloaded)."""
    from xsp.tracer.workloads.names import list_models

    entries = list_models(source, pattern)
    for entry in entries:
        click.echo(f"{entry.qualified}\t{entry.task}")  # plain tab-separated lines, for scripts
    console.print(f"{len(entries)} models", highlight=False)


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


def _system_allocator() -> None:
    """Arrow buffers from the C library's allocator, unless ARROW_DEFAULT_MEMORY_POOL names
    one. pyarrow's default, mimalloc, backs large buffers with transparent huge pages; where the
    kernel compacts memory for them on request (THP defrag "madvise", a common default) a page
    fault can stall: reading a 1M-span store spent 1.2-3.1 s in the kernel on the dev machine,
    against 0.3 s with malloc, and held 100 MB more."""
    import os

    import pyarrow as pa

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        pa.set_memory_pool(pa.system_memory_pool())


def _open_store(run_dir: Path) -> Any:
    """The measurement, its reader's warnings printed (what it left out or guessed)."""
    from xsp.analysis.store import MeasurementStore

    _system_allocator()
    store = MeasurementStore(run_dir)
    for message in store.warnings:
        _warn(message)
    return store


def run_warnings(run: Any) -> list[str]:
    """Lines on what a level-set run lost: a status other than ok with its reasons, CUPTI's
    dropped and undecodable records (the kernel and API counts are then not exact)."""
    meta = run.meta
    lines = []
    status = meta.get("status")
    if status != "ok":
        reasons = meta.get("status_reasons") or ([meta["error"]] if meta.get("error") else [])
        text = "; ".join(str(r) for r in reasons) or "no reason recorded"
        lines.append(f"level set {run.levels}: {status}: {text}")
    cupti = meta.get("cupti")
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


def _print_gpu_layers(store: Any, limit: int = 5, warn: bool = True) -> bool:
    """With level G (single-rank): the replay's verdict and why it may be off, then the layers
    with the most GPU time (forward + backward); False where there is none to print."""
    from xsp.analysis import critical_path, distributed

    if not critical_path.has_gpu(store) or distributed.is_multi_rank(store):
        return False
    try:
        rows = critical_path.layers(store, limit=limit).to_pylist()
        verdict = critical_path.verdict(store)
    except XspError as exc:
        _warn(f"no replay: {exc}")
        return False
    if not rows:
        return False
    out_console.print(verdict, highlight=False)
    if warn:
        for line in _replay_warnings(_replay_summary(store)):
            _warn(line)
    lt = Table(title="layers by GPU time (forward + backward, replayed step)", title_justify="left")
    for name in ("layer", "fwd ms", "bwd ms", "GPU ms", "path ms", "% of step"):
        lt.add_column(name, justify="left" if name == "layer" else "right")
    for r in rows:
        lt.add_row(
            r["layer"],
            _fmt(r["forward_gpu_ms"], 3),
            _fmt(r["backward_gpu_ms"], 3),
            _fmt(r["gpu_ms"], 3),
            _fmt(r["critical_path_ms"], 3),
            _fmt(r["share_pct"], 1),
        )
    out_console.print(lt)
    return True


def _print_summary(run_dir: Path, store: Any = None, replay_warnings: bool = True) -> None:
    """The measurement's summary; a ``store`` given was opened by ``_open_store``, which printed
    its reader's warnings. ``replay_warnings``: say why the replay may be off M (analyze says it
    after its replay line instead)."""
    from xsp.analysis.summary import level_sets, own_time_line, time_line, top_layers
    from xsp.core.store import MANIFEST, read_json

    store = store or _open_store(run_dir)
    rows = level_sets(store).to_pylist()
    table = Table(title=f"xsp measurement {run_dir}", title_justify="left")
    for name in (
        "levels",
        "status",
        "iters",
        "median ms",
        "min ms",
        "max ms",
        "spans/iter",
        "vs first",
    ):
        table.add_column(name, justify="right" if name not in ("levels", "status") else "left")
    for r in rows:
        table.add_row(
            r["levels"],
            str(r["status"]),
            _fmt(r["iterations"]),
            _fmt(r["step_median_ms"]),
            _fmt(r["step_min_ms"]),
            _fmt(r["step_max_ms"]),
            _fmt(r["spans_per_iteration"], 0),
            _ratio(r["overhead_x"], r.get("overhead_verdict")),
        )
    out_console.print(table)
    _print_m_interval(store)
    if not _print_gpu_layers(store, warn=replay_warnings) and (
        layers := top_layers(store).to_pylist()
    ):
        lt = Table(
            title="slowest layers (forward host time, shallowest run with F; no G run for GPU time)",
            title_justify="left",
        )
        for name in ("layer", "type", "calls/iter", "mean ms", "% of step"):
            lt.add_column(name, justify="left" if name in ("layer", "type") else "right")
        for r in layers:
            lt.add_row(
                r["module_path"],
                r["module_type"],
                _fmt(r["calls_per_iteration"], 0),
                _fmt(r["mean_ms"], 3),
                _fmt(r["share_pct"], 1),
            )
        out_console.print(lt)
    spans = sum(r["spans_per_iteration"] * r["iterations"] for r in rows)
    if spans:
        out_console.print(
            f"store: {store.bytes_on_disk() / spans:.1f} bytes per span on disk", highlight=False
        )
    for run_ in store.counter_runs:
        out_console.print(counter_line(run_), highlight=False)
    manifest = read_json(store.root / MANIFEST) if (store.root / MANIFEST).exists() else {}
    for said in (time_line(manifest), own_time_line(manifest)):
        if said:
            out_console.print(said, highlight=False, soft_wrap=True)
    for run_ in [*store.runs, *store.counter_runs]:
        for line in run_warnings(run_):
            _warn(line)


def _print_m_interval(store: Any) -> None:
    """M's median and interval over its processes, or why there is no interval (one process;
    with a G run the replay's "unchecked across processes" warning says it instead)."""
    from xsp.analysis.critical_path import has_gpu
    from xsp.analysis.m_interval import m_interval

    if not store.runs or store.runs[0].levels != "M":
        return
    interval = m_interval(store)
    if interval is None:
        return
    if interval.single:
        if has_gpu(store):
            return
        out_console.print(
            "M ran in one process: the host's variance between processes cannot be told apart "
            "from overhead (--m-processes 3 gives M an interval)",
            highlight=False,
        )
    else:
        out_console.print(interval.describe(), highlight=False)


#: What the summary at the end of ``xsp run`` imports (numpy, pyarrow, duckdb under them).
_SUMMARY_MODULES = (
    "xsp.analysis.store",
    "xsp.analysis.summary",
    "xsp.analysis.critical_path",
    "xsp.analysis.distributed",
)


def _import_in_background(modules: tuple[str, ...]) -> None:
    """Import ``modules`` on a thread while the first level-set process starts (seconds of
    importing torch), so that the summary after the measurement does not wait for them (0.5 s
    of its 0.9 s on the H200, profiled). Nothing is measured then; a failure is left to the
    import at use."""
    import importlib
    import threading

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # the summary's own import says what is wrong
                return

    threading.Thread(target=load, name="xsp-summary-imports", daemon=True).start()


def _note_own_time(out: Path, started_ns: int) -> str | None:
    """Record in the manifest the seconds ``xsp run``'s own process spent before the
    measurement (interpreter, imports, checks) and after it (the summary just printed), and
    return the line that says so; None without a manifest."""
    import time

    from xsp.analysis.summary import own_time_line
    from xsp.core.store import MANIFEST, read_json, write_json_atomic

    path = out / MANIFEST
    try:
        manifest = read_json(path)
        before = (manifest["created_ns"] - started_ns) / 1e9
        after = (time.time_ns() - manifest["finished_ns"]) / 1e9
    except (XspError, KeyError, TypeError):
        return None  # no manifest (nothing measured) or one without its end
    manifest["runner_s"] = {"before": round(before, 3), "after": round(after, 3)}
    with contextlib.suppress(OSError, XspError):  # said all the same; the measurement is whole
        write_json_atomic(path, manifest)
    return own_time_line(manifest)


def counter_line(run: Any) -> str:
    """One line on a hardware-counter run: kernels, iterations, replay passes, time."""
    counters = run.meta.get("counters") or {}
    passes = counters.get("passes") or {}
    seconds = (run.meta.get("finished_ns") or 0) - (run.meta.get("started_ns") or 0)
    parts = [
        f"counter run {run.levels}: {counters.get('kernels', 0):,} kernels",
        f"{run.meta.get('iterations_measured', 0)} iteration(s) under {counters.get('tool', 'ncu')}",
    ]
    if passes:
        parts.append(f"{passes.get('median')} replay passes per kernel (median)")
    if seconds > 0:
        parts.append(f"{seconds / 1e9:.0f} s")
    return ", ".join(parts)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--rounds",
    type=int,
    default=3,
    show_default=True,
    help="Paired rounds (without, with the fix; each run a process of its own).",
)
@click.option("--rule", "rules", multiple=True, help="Verify only this rule (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
def verify(run_dir: Path, rounds: int, rules: tuple[str, ...], as_json: bool) -> None:
    """Measure each suggestion of a measurement: re-run its workload untraced (level set M)
    without and with the suggestion's fix, applied without editing the program, in paired
    rounds (the order alternates, each run a process of its own), then once with the fix at the
    measurement's deepest level set to show what changed. A suggestion that needs a change to
    the program's code says so and is not run.

    Runs are stored in RUN_DIR/verify/<rule>/ (round-K/base, round-K/fixed, mechanism); the
    rows in RUN_DIR/verify/verify.json. Each row: rule, predicted_gain_ms_per_iteration,
    measured_gain_ms_per_iteration, measured_gain_ci_ms, measured_gain_pct, numerics_change,
    rounds, status, evidence (docs/verify.md says how the gain and its interval are computed).
    Exits 0 when every rule was verified or needs a code change, 1 when a run failed, 2 on bad
    input, 130 when interrupted.
    """
    import json

    from xsp.campaign import verify as verifying

    planned = verifying.plan(run_dir, rounds, rules)  # bad input: one line, before any bar
    with _bar_per_key() as progress:
        result = verifying.run_plan(planned, progress)
    if as_json:
        click.echo(json.dumps(result.document(), indent=1))
    else:
        for found in result.results:
            out_console.print(verifying.summary_line(found), highlight=False, soft_wrap=True)
        console.print(f"runs and verify.json in {run_dir / verifying.VERIFY_DIR}", highlight=False)
    if result.interrupted:
        _fail("interrupted; the rules verified so far are in verify.json", EXIT_INTERRUPTED)
    failed = [found.row["rule"] for found in result.results if found.failed]
    if failed:
        _fail(f"runs failed for {', '.join(failed)}; their reasons are in verify.json", code=1)


@main.group()
def campaign() -> None:
    """Batch characterization: a models x batch sizes x modes matrix of leveled runs."""


@campaign.command("run")
@click.argument("campaign_file", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Campaign directory.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", help="Ray cluster address (auto, ray://host:10001); default: local.")
@click.option("--parallel", type=int, help="Jobs at a time (default: one per GPU; 1 on CPU).")
@click.option("--limit", type=int, help="Run at most this many pending jobs (a part).")
@click.option("--only", help="Run only models matching these comma-separated globs (a part).")
def campaign_run(
    campaign_file: Path,
    out: Path,
    executor: str,
    address: str | None,
    parallel: int | None,
    limit: int | None,
    only: str | None,
) -> None:
    """Run (or resume) a campaign: finished jobs are skipped, failed ones retried; a failing
    job is recorded with its reason and the campaign moves on."""
    import time

    from rich.progress import TimeRemainingColumn

    from xsp.campaign import executor as executors
    from xsp.campaign.files import load
    from xsp.campaign.store import CampaignStore
    from xsp.campaign.summary import job_line

    spec = load(campaign_file)
    store = CampaignStore(out)
    store.begin(spec)
    jobs = spec.jobs()
    pending = store.pending(jobs)
    if only:
        import fnmatch

        globs = [g.strip() for g in only.split(",") if g.strip()]
        pending = [j for j in pending if any(fnmatch.fnmatch(j.model, g) for g in globs)]
    if limit is not None:
        pending = pending[:limit]
    console.print(
        f"campaign {spec.name}: {len(jobs)} jobs, {len(jobs) - len(store.pending(jobs))} done, "
        f"running {len(pending)}",
        highlight=False,
    )
    failed = 0
    finished = 0
    began = time.monotonic()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("jobs", total=len(pending))

        def done(record: dict[str, Any]) -> None:
            nonlocal failed, finished
            store.save(record)
            finished += 1
            if record["status"] != "ok":
                failed += 1
                bar.console.print(
                    f"[red]{record['job']}[/]: {record['reason']}: {record.get('error') or ''}",
                    highlight=False,
                )
            elif not bar.console.is_terminal:  # a log has no bar to watch: a line per job
                bar.console.print(
                    job_line(record, finished, len(pending), time.monotonic() - began),
                    highlight=False,
                    soft_wrap=True,
                )
            bar.update(task, advance=1, description=record["job"])

        if executor == "ray":
            executors.run_ray(spec, store, pending, done, address)
        else:
            executors.run_local(spec, store, pending, done, parallel)
    console.print(
        f"{len(pending) - failed} jobs ok, {failed} failed; results in {out}", highlight=False
    )
    if failed:
        _fail(f"{failed} of {len(pending)} jobs failed; their reasons are in {out}/jobs", code=1)


@campaign.command("report")
@click.argument("campaign_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Default: DIR/report.html.")
@click.option(
    "--run-reports/--no-run-reports",
    default=True,
    show_default=True,
    help="Also make each run's own report (the drill-down links).",
)
def campaign_report(campaign_dir: Path, output: Path | None, run_reports: bool) -> None:
    """Write the campaign's comparative HTML report."""
    from xsp.campaign.report import write_campaign_report
    from xsp.campaign.store import CampaignStore

    output = output or campaign_dir / "report.html"
    count = write_campaign_report(CampaignStore(campaign_dir), output, run_reports)
    console.print(f"wrote the report of {count} jobs to {output}", highlight=False)


@campaign.command("verify")
@click.argument("campaign_dir", type=click.Path(path_type=Path))
@click.option("--rounds", type=int, default=3, show_default=True, help="Paired rounds per fix.")
@click.option("--only", help="Verify only models matching these comma-separated globs.")
@click.option("--rule", "rules", multiple=True, help="Verify only this rule (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print DIR/verify.json's object.")
def campaign_verify(
    campaign_dir: Path, rounds: int, only: str | None, rules: tuple[str, ...], as_json: bool
) -> None:
    """Run `xsp verify` on each finished job, one at a time, and print the what-if table: each
    fix's measured change of the step, job by job. A job that cannot be verified (no
    suggestions, a workload that cannot run here) is recorded with its reason. Rows go to
    DIR/verify.json, each job's runs to its own measurement's verify/."""
    import json

    from xsp.campaign.store import CampaignStore
    from xsp.campaign.whatif import verify_campaign, what_if, what_if_line

    campaign = CampaignStore(campaign_dir)
    campaign.spec()  # a directory that is no campaign is named before the bar
    globs = [g.strip() for g in (only or "").split(",") if g.strip()]
    with _bar_per_key() as progress:
        document = verify_campaign(campaign, rounds, globs, progress, rules)
    if as_json:
        click.echo(json.dumps(document, indent=1))
    else:
        for row in what_if(document):
            out_console.print(what_if_line(row), highlight=False, soft_wrap=True)
        for job in document["jobs"]:
            if job["status"] != "verified":
                console.print(f"{job['job']}: not verified: {job['why']}", highlight=False)
    if document["interrupted"]:
        _fail("interrupted; the jobs verified so far are in verify.json", EXIT_INTERRUPTED)


@campaign.command("sql")
@click.argument("campaign_dir", type=click.Path(path_type=Path))
@click.argument("query")
@click.option("--csv", "as_csv", is_flag=True, help="Print every row as CSV (wide results).")
def campaign_sql(campaign_dir: Path, query: str, as_csv: bool) -> None:
    """Query a campaign with SQL: tables ``jobs`` (one row per job) and ``spans`` (all spans,
    with job, model, mode, batch_size and levels)."""
    import duckdb

    from xsp.campaign.store import CampaignStore

    campaign = CampaignStore(campaign_dir)
    campaign.spec()  # a directory that is no campaign is named, as report does
    try:
        relation = campaign.connect().sql(query)
        if as_csv:
            import csv

            writer = csv.writer(sys.stdout)
            writer.writerow(relation.columns)
            writer.writerows(relation.fetchall())
            return
        table = relation.to_arrow_table()
    except duckdb.Error as exc:
        raise XspError(f"query failed: {exc}") from exc
    _print_table("", table, 1000)


@campaign.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--rows", type=int, default=20, show_default=True, help="Rows shown.")
@click.option("--json", "as_json", is_flag=True, help="Print every job's row as JSON.")
def campaign_diff(before: Path, after: Path, rows: int, as_json: bool) -> None:
    """Compare two campaigns job by job: each job's untraced step before and after, with a
    verdict (faster, slower or noise) where both kept the job's measurement (a bootstrap over
    its M steps), "untested" where only the jobs' median steps remain, "missing" where a side
    has no successful result. ``xsp diff BEFORE/runs/JOB AFTER/runs/JOB`` compares one job in
    full."""
    import json

    from xsp.analysis.diff import TEST
    from xsp.campaign.diff import campaign_diff as compare_campaigns
    from xsp.campaign.store import CampaignStore

    table = compare_campaigns(CampaignStore(before), CampaignStore(after))
    if as_json:
        click.echo(json.dumps({"test": TEST, "jobs": table.to_pylist()}, indent=1))
        return
    _print_table(f"campaign diff: {before} -> {after}", table, rows)
    verdicts = table.column("verdict").to_pylist()
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))
    console.print(f"{table.num_rows} jobs: {counts}; verdicts: {TEST}", highlight=False)
