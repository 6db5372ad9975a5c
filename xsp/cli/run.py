"""``xsp run``: a zoo model or a Python command profiled once per level set, then summarized."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from xsp.cli.common import console, fail, labelled_bars, say_list, store_location, warn
from xsp.cli.summary import print_summary
from xsp.core.errors import XspError

if TYPE_CHECKING:
    from xsp.tracer.run.runner import LeveledResult, LeveledSpec

__all__ = ["run"]


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
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
    "--sample-run",
    type=int,
    default=1,
    show_default=True,
    metavar="K",
    help="The sample in runs of K consecutive iterations, as many in all: on CUDA, L and G pay "
    "CUPTI's start once a run and nothing between runs.",
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
    type=store_location(writes=True),
    default=None,
    help="Run directory (default: xsp-runs/<time>).",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Measure into an --out that holds an earlier measurement: its manifest and level sets "
    "are removed first (without this, such an --out is refused).",
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
def run(**options: Any) -> None:
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
    --sample-every / --sample-rate / --sample-run pick (docs/serving.md).

    Exits 0 when every level set is ok; the program's own exit code when it exited nonzero
    (128+N when signal N killed it); 1 when a level set failed or is partial otherwise; 2 on
    bad input; 130 when interrupted (Ctrl-C stops the level-set process too; the manifest
    keeps what finished). An --out that holds an earlier measurement is refused unless
    --replace is given (nothing is resumed: every level set is measured again).
    """
    from xsp.tracer.run.earlier import refuse_or_remove
    from xsp.tracer.run.plan import plan
    from xsp.tracer.run.runner import run_leveled

    started_ns = _process_started_ns()
    replace = options.pop("replace")
    spec = _leveled_spec(**options)
    refuse_or_remove(spec.out, replace, remove=False)  # one line, before anything is checked
    run_plan = plan(spec)  # before torch is imported and the bars drawn: bad input in a blink
    refuse_or_remove(spec.out, replace)  # the plan holds: the earlier measurement goes
    _import_in_background(_SUMMARY_MODULES)
    with _level_set_bars() as progress:
        result = run_leveled(run_plan, progress)
    _report(spec.out, result, started_ns)


def _process_started_ns() -> int:
    """When this process started (wall clock): the manifest's ``runner_s.before`` counts from
    it, the interpreter's start and imports included."""
    import time

    from xsp.tracer.run.procfs import process_age_ns

    return time.time_ns() - (process_age_ns() or 0)


def _leveled_spec(
    *,
    model: str | None,
    batch_size: int,
    mode: str,
    levels: str,
    iterations: int,
    duration: float | None,
    sample_every: int,
    sample_rate: float | None,
    sample_run: int,
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
) -> LeveledSpec:
    """The measurement ``xsp run``'s options ask for: the level sets parsed, the run directory
    named by the time without --out, the XSP_* switches read."""
    import time

    from xsp.core import config
    from xsp.core.levelset import parse_level_sets
    from xsp.tracer.run.runner import LeveledSpec
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
        sample_run=sample_run,
        export_every_s=export_every,
    )
    return LeveledSpec(
        out=out,
        profile=profile,
        level_sets=tuple(level_sets),
        fork_server=config.switch("XSP_FORK_SERVER", True),
        overlap=config.switch("XSP_OVERLAP", True),
        share_process=config.switch("XSP_SHARE_PROCESS", True),
        m_processes=config.m_processes() if m_processes is None else m_processes,
        interleave=interleave,
    )


@contextlib.contextmanager
def _level_set_bars() -> Iterator[Callable[[str, str, int, int], None]]:
    """The runner's progress callback ``(levels, phase, done, total)``: one bar per level set,
    labelled with its levels, kept on screen when done."""
    with labelled_bars("{task.fields[levels]:>5}") as bar:
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

        yield progress


def _report(out: Path, result: LeveledResult, started_ns: int) -> None:
    """After the measurement: its summary, xsp's own time, where the spans are, and the exit
    status (the program's own, 1 when a level set failed, 130 when interrupted)."""
    from xsp.core.store import Status

    if result.runs and not result.stored:  # nothing measured: one line, no summary of nothing
        fail(f"{result.failure}; nothing was stored", code=result.exit_code)
    # the level set whose failure the last line says (``LeveledResult.failure``): said once
    failed = next((str(r.levels) for r in result.runs if r.status != Status.OK), None)
    try:
        print_summary(out, failure_said=None if result.ok else failed)
    except XspError as exc:  # nothing finished (an interrupt, a crash): no summary to print
        warn(f"no summary: {exc}")
    if said := _note_own_time(out, started_ns):
        say_list(said)
    console.print(f"spans stored in [bold]{out}[/]", highlight=False)
    if result.interrupted:
        fail(f"interrupted; the finished level sets are in {out}", code=result.exit_code)
    if not result.ok:
        fail(f"{result.failure}; spans recorded so far are in {out}", code=result.exit_code)


#: What the summary at the end of ``xsp run`` imports (numpy, pyarrow, duckdb under them).
_SUMMARY_MODULES = (
    "xsp.analysis.measurement.store",
    "xsp.analysis.tables.summary",
    "xsp.analysis.replay.critical_path",
    "xsp.analysis.reconstruction.distributed",
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
    import dataclasses
    import time

    from xsp.analysis.tables.summary import own_time_line
    from xsp.core.store import MANIFEST, read_manifest, write_manifest

    path = out / MANIFEST
    try:
        manifest = read_manifest(path)
    except XspError:
        return None  # no manifest: nothing measured
    if manifest.created_ns is None or manifest.finished_ns is None:
        return None  # one without its end
    before = (manifest.created_ns - started_ns) / 1e9
    after = (time.time_ns() - manifest.finished_ns) / 1e9
    runner_s = {"before": round(before, 3), "after": round(after, 3)}
    manifest = dataclasses.replace(manifest, runner_s=runner_s)
    with contextlib.suppress(OSError, XspError):  # said all the same; the measurement is whole
        write_manifest(path, manifest)
    return own_time_line(manifest)
