"""One level-set run in its own process: ``python -m xsp.tracer.run.child --spec JSON`` (a
``ChildSpec``, ``xsp.tracer.run.protocol``), or forked from the fork server with the same spec.

The leveled runner starts one of these per level set so that no level's state (hooks, profiler
buffers, CUPTI subscriptions, allocator caches) leaks into the next; a zoo model's MF runs after
M in M's process (``ChildSpec.then``), since M leaves it nothing but a warm model
(``xsp.tracer.run.placement.shares_process``). It runs either a zoo workload
or a user's Python script under a ``Session``, writes ``RUN_DIR/<levels>/``, reports progress as
lines on its progress pipe and exits with the workload's status: 0, the script's own exit code
(``sys.exit(3)`` exits 3), 1 when it raised, 2 for an xsp error, 3 when cancelled before its
levels came on, 130 on Ctrl-C. ``run.json`` says how the program ended (``program``); when it ends
too hard for that (``os._exit``, a signal), the leveled runner writes it there.

A multi-rank job (``torchrun …``, ``python -m torch.distributed.run …``) runs its launcher here
instead, whose workers each trace their rank (``xsp.tracer.run.launcher``, ``.rank``); once they
have ended, their runs are joined into this level set's run (``xsp.tracer.run.ranks``).

Ctrl-C: the first SIGINT interrupts the workload; the run is closed and stored (status
``interrupted``) while further SIGINTs are ignored, so that a second one, or the runner passing
the first one on, cannot cut the store's writing short (the runner kills the process if it takes
too long). A continuous session (a service: --iterations 0 or --duration) takes SIGTERM the same
way, unless the program has a handler of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from xsp.core import schema
from xsp.core.errors import EXIT_INTERRUPTED, XspError
from xsp.core.store import RunMeta, Status
from xsp.tracer.capture import session as sessions
from xsp.tracer.capture.iterations import RootFinder
from xsp.tracer.capture.session import Session, fail_message
from xsp.tracer.export.sinks import Sink
from xsp.tracer.run import heap
from xsp.tracer.run.protocol import READY, STORED, ChildSpec, check_program
from xsp.tracer.spec import RunSpec

__all__ = ["EXIT_CANCELLED", "EXIT_WORKLOAD_FAILED", "EXIT_XSP_ERROR", "main", "on_interrupt"]

log = logging.getLogger("xsp")

EXIT_WORKLOAD_FAILED = 1
EXIT_XSP_ERROR = 2
EXIT_CANCELLED = 3


_interrupted_by: list[int] = []  # the signal that interrupted the workload
_heap = heap.DEFAULT  # what xsp.tracer.run.heap applied to this process


def on_interrupt(signum: int, frame: Any) -> None:
    """The first Ctrl-C (or, in a rank or a service, SIGTERM) interrupts the workload; later
    ones are ignored while the run is stored."""
    signal.signal(signum, signal.SIG_IGN)
    _interrupted_by.append(signum)
    raise KeyboardInterrupt


def _hold_interrupts() -> None:
    """The program is over and its run is being stored: an interrupt now (a Ctrl-C, or the
    launcher's SIGTERM to the other ranks once one failed) must not cut the writing short."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is on_interrupt:
            signal.signal(signum, signal.SIG_IGN)


def _interrupted() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    current = sessions.current()
    if current is not None:
        current.program = {"interrupted": True}
        by = "SIGTERM" if _interrupted_by[:1] == [signal.SIGTERM] else "Ctrl-C"
        current.close(error=f"interrupted ({by})", interrupted=True)
    print("xsp: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def _progress_writer(fd: int | None, path: str | None = None) -> Any:
    """Progress lines to the runner: through an inherited pipe, or (rank 0 of a multi-rank job,
    whose launcher passes no descriptors on) through that pipe's path."""
    if fd is not None:
        stream: TextIO = os.fdopen(fd, "w", buffering=1)
    elif path is not None:
        try:
            stream = open(path, "w", buffering=1)  # noqa: SIM115 - open while the process runs
        except OSError as exc:
            log.warning("xsp: no progress lines: cannot open %s: %s", path, exc)
            return None
    else:
        return None

    def report(phase: str, done: int, total: int) -> None:
        stream.write(f"{phase} {done} {total}\n")

    return report


def _gate(fd: int | None, report: Any = None) -> Any:
    """Block before the levels come on until the runner writes a byte to ``fd`` (the level set
    before has exited); end the process if the runner closes it instead (that one failed).
    ``report`` tells the runner first that this process has warmed up (``READY``): a level set
    before it may measure now."""
    if fd is None:
        return None

    def wait() -> None:
        if report is not None:
            report(READY, 0, 0)
        with os.fdopen(fd, "rb", buffering=0) as gate:
            opened = gate.read(1)
        if not opened:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_CANCELLED)

    return wait


def _sinks(endpoint: str | None) -> list[Sink]:
    from xsp.core.otlp.transport import OtlpConfig, make_transport
    from xsp.tracer.export.sinks import OtlpSink  # protobuf's import, for OTLP runs only

    config = OtlpConfig.from_env(endpoint)
    return [OtlpSink(make_transport(config))] if config is not None else []


class _Prefixed(logging.Formatter):
    """``xsp: message``, once: most of xsp's own messages already begin with it."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if text.startswith("xsp: ") else f"xsp: {text}"


def main(spec: ChildSpec | None = None) -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(_Prefixed("%(message)s"))
    # on xsp's own loggers only: the program's records stay the program's (its basicConfig
    # takes effect, and an OpenTelemetry exporter's warning does not read as xsp's)
    xsp_log = logging.getLogger("xsp")
    xsp_log.handlers = [handler]
    xsp_log.setLevel(logging.WARNING)
    xsp_log.propagate = False
    global _heap
    try:
        args = spec or ChildSpec.from_argv(sys.argv[1:])
        _heap = heap.keep_freed_memory()  # before the workload allocates
    except XspError as exc:
        print(f"xsp: {exc}", file=sys.stderr)
        return EXIT_XSP_ERROR
    model = args.run.profile.model
    command = [c for c in args.run.profile.command if c != "--"]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_interrupt)
    if args.run.profile.continuous and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # a service is stopped with SIGTERM: what it measured is stored, as after a Ctrl-C
        # (a program that installs its own handler keeps it)
        signal.signal(signal.SIGTERM, on_interrupt)
    try:
        if model:
            code = _run_zoo(args, model)
            # under ncu, a normal exit: ncu's injection sees the process end as it expects
            return code if args.run.levels.counters else _fast_exit(code)
        return _run_script(args, command)
    except XspError as exc:
        print(f"xsp: {exc}", file=sys.stderr)
        return EXIT_XSP_ERROR
    except KeyboardInterrupt:
        code = _interrupted()
        return _fast_exit(code) if model else code


def _fast_exit(code: int) -> int:
    """End a zoo run without interpreter teardown (about 1 s of torch's, per level set): the
    store, the sinks and CUPTI are closed by then. Kept when a tool relies on exit handlers
    (coverage in the tests)."""
    if "coverage" in sys.modules:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _session(args: ChildSpec, run: RunSpec, **options: Any) -> Session:
    """A started session of ``run`` (``args.run`` or one of ``args.then``, completed by the
    workload) with the options every level-set process shares; the progress lines and the gate
    are the process's own unless ``options`` pass them."""
    options["resource"] = {schema.RES_HOST_HEAP: _heap, **options.get("resource", {})}
    if "progress" not in options:
        options["progress"] = _progress_writer(args.progress_fd, args.progress_path)
    if "before_levels" not in options:
        options["before_levels"] = _gate(args.gate_fd, options["progress"])
    return Session.from_spec(
        run,
        # a rank sends nothing: the joined run is sent whole (xsp.tracer.run.ranks)
        sinks=_sinks(run.profile.otlp_endpoint) if run.rank is None else [],
        # kernel replay makes the monitor's samples meaningless (and it would run for minutes)
        monitor=not run.levels.counters,
        **options,
    ).start()


def _fixes_resource(names: tuple[str, ...]) -> dict[str, Any]:
    return {schema.RES_FIXES: ",".join(names)} if names else {}


def _root_changes(session: Session, device: str) -> Callable[[Any], None] | None:
    """Apply the spec's fixes' process-wide parts now, before the workload's first step
    (``xsp.tracer.workloads.fixes``; one that cannot apply is written into run.json's errors);
    return what the root module needs before its first forward pass (the fixes' root parts,
    the numerics probe), or None when nothing."""
    profile = session.spec.profile
    changes: list[Callable[[Any], None]] = []
    if profile.fixes:
        from xsp.tracer.workloads.fixes import AppliedFixes

        fixes = AppliedFixes(profile.fixes, device, on_error=session.add_error).apply()
        if fixes.roots:
            changes.append(fixes.attach)
    if profile.numerics_probe and session.run_dir is not None:
        from xsp.tracer.workloads import numerics

        run_dir = session.run_dir
        changes.append(lambda module: numerics.record(module, run_dir / numerics.PROBE_FILE))
    if not changes:
        return None

    def change(module: Any) -> None:
        for apply in changes:  # the fixes first: the probe sees what the fixed model computes
            apply(module)

    return change


def _run_zoo(args: ChildSpec, model: str) -> int:
    """Build the zoo workload once and measure it for ``args.run``, then for each of
    ``args.then`` in turn (``xsp.tracer.run.placement.shares_process``), saying ``stored`` on the
    progress pipe after each but the last; stop at the first that fails."""
    from xsp.tracer.capture.session import resolve_device
    from xsp.tracer.workloads import zoo

    profile = args.run.profile
    device = resolve_device(profile.device)
    workload = zoo.build(
        model, profile.batch_size, profile.mode, device, channels_last=profile.channels_last
    )
    report = _progress_writer(args.progress_fd, args.progress_path)
    runs = (args.run, *args.then)
    for k, run in enumerate(runs):
        gate = _gate(args.gate_fd, report) if k == 0 else None  # the later ones follow it here
        code, status = _measure_zoo(args, run, model, device, workload, report, gate)
        if code != 0 or status != "ok":
            return code
        if report is not None and k + 1 < len(runs):
            report(STORED, 1, 1)
    return 0


def _measure_zoo(
    args: ChildSpec,
    run: RunSpec,
    model: str,
    device: str,
    workload: Any,
    report: Any,
    gate: Callable[[], None] | None,
) -> tuple[int, str | None]:
    """One level set's session over the zoo workload's steps: (exit code, run.json's status)."""
    profile = run.profile
    session = _session(
        args,
        dataclasses.replace(run, workload=model).with_profile(device=device),
        settle=True,  # this loop runs until the session is done
        progress=report,
        before_levels=gate,
        resource={
            schema.RES_MODE: profile.mode,
            schema.RES_BATCH_SIZE: profile.batch_size,
            schema.RES_MEMORY_FORMAT: "channels_last" if profile.channels_last else "contiguous",
            **_fixes_resource(profile.fixes),
        },
    )
    root = _root_changes(session, device)
    if root is not None:
        root(workload.model)  # the zoo knows its model: no first call to wait for
    try:
        while not session.done:
            with session.iteration():
                workload.step()
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        session.close(error=fail_message(exc))
        print(f"xsp: {model} failed: {fail_message(exc)}", file=sys.stderr)
        return EXIT_WORKLOAD_FAILED, "error"
    closed = RunMeta.from_json(session.close() or {})
    return 0, closed.status


def _run_launcher(args: ChildSpec, command: list[str]) -> int:
    """A multi-rank job: run its launcher, whose workers trace their ranks, then join their
    runs into this level set's; exit as the job did."""
    from xsp.tracer.run import launcher
    from xsp.tracer.run.ranks import RankedRun

    arguments = launcher.worker_arguments(command)  # refused before anything runs
    job = RankedRun(args, workload=" ".join(arguments.training_script_args)[:200])
    job.begin()
    wait = _gate(args.gate_fd)
    if wait is not None:
        wait()
    end = launcher.run_workers(arguments, job.rank_environment())
    meta = job.finish(end, _sinks(args.run.profile.otlp_endpoint))
    if meta.status == Status.INTERRUPTED or end.program.get("interrupted"):
        return EXIT_INTERRUPTED
    code = (meta.program or {}).get("exit_code")
    if isinstance(code, int) and code != 0:
        return code
    return 0 if meta.status in (Status.OK, Status.PARTIAL) else EXIT_WORKLOAD_FAILED


def _run_script(args: ChildSpec, command: list[str]) -> int:
    if not command:
        raise XspError("nothing to run: give --model or a Python command after --")
    from xsp.tracer.run import launcher

    if args.run.rank is None and launcher.is_launcher(command):
        return _run_launcher(args, command)
    run = dataclasses.replace(args.run, workload=args.run.workload or " ".join(command)[:200])
    # as python puts it first: the working directory for -m and -c, else the script's own; set
    # before the session, which imports the function --iteration-fn names from there
    sys.path.insert(0, os.getcwd() if command[0] in ("-m", "-c") else _script_dir(command[0]))
    session = _session(args, run, auto_iterations=True, resource=_fixes_resource(run.profile.fixes))
    root = _root_changes(session, session.device)
    if root is not None:
        RootFinder(root)  # the script's model, as the automatic iterations find it
    sys.argv = list(command)
    code = 0
    try:
        check_program(command)  # the runner checked it too; a rank worker's, only here
        if command[0] == "-m":
            sys.argv = command[1:]
            runpy.run_module(command[1], run_name="__main__", alter_sys=True)
        elif command[0] == "-c":
            sys.argv = ["-c", *command[2:]]
            exec(compile(command[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_path(command[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)  # sys.exit("message") prints it, as Python does
        session.program = {"exit_code": code}
        _hold_interrupts()
        session.close(error=None if code == 0 else f"the program exited with {code}")
        return code
    except XspError as exc:
        session.close(error=f"xsp could not start the script: {exc}")
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _hold_interrupts()
        _print_program_error(exc)  # once; xsp's final line names the level set and the store
        session.program = {"exit_code": EXIT_WORKLOAD_FAILED, "exception": fail_message(exc)}
        session.close(error=fail_message(exc))
        return EXIT_WORKLOAD_FAILED
    session.program = {"exit_code": 0}
    _hold_interrupts()
    session.close()
    return code


def _print_program_error(exc: BaseException) -> None:
    """The program's traceback as Python prints it for the program run alone: the frames of
    xsp and runpy that started it left out, so that it begins at the user's own code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _runs_the_program(tb):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _runs_the_program(tb: Any) -> bool:
    filename = tb.tb_frame.f_code.co_filename
    return filename == __file__ or Path(filename).name in ("runpy.py", "<frozen runpy>")


def _script_dir(script: str) -> str:
    return str(Path(script).resolve().parent)


if __name__ == "__main__":
    sys.exit(main())
