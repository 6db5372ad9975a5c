"""Multi-rank jobs: ``torchrun …`` and ``python -m torch.distributed.run …`` under xsp.

The level-set process runs the launcher itself, untraced (it only starts and watches the
workers). Its arguments are parsed by torch's own parser, so that every launcher option keeps
its meaning, and only the worker command changes: each worker runs the rank bootstrap,
``python -u -m xsp.tracer.run.rank [-m] SCRIPT ARGS`` (``xsp.tracer.run.rank``), which traces
the user's script under a session of its own. The workers inherit the level-set process's
environment, and with it the spec (``RANK_SPEC_ENV``) that says what to record and where.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xsp.core.errors import ConfigError
from xsp.tracer.run.protocol import check_program

if TYPE_CHECKING:
    from xsp.core.store import ProgramEnd

__all__ = [
    "BOOTSTRAP",
    "DEPRECATED_LAUNCHERS",
    "LAUNCHERS",
    "JobEnd",
    "is_launcher",
    "run_workers",
    "worker_arguments",
]

#: The launcher modules xsp traces the workers of (``torchrun`` is the first one's script).
LAUNCHERS = ("torch.distributed.run",)
#: Its predecessor passes ``--local-rank`` before the script's own arguments; it is refused.
DEPRECATED_LAUNCHERS = ("torch.distributed.launch",)
#: What each worker runs instead of the user's script, which it then runs itself.
BOOTSTRAP = "xsp.tracer.run.rank"


def is_launcher(command: Sequence[str]) -> bool:
    """``-m torch.distributed.run …`` (what ``torchrun …`` and ``python -m …`` become)."""
    return (
        len(command) >= 2 and command[0] == "-m" and command[1] in LAUNCHERS + DEPRECATED_LAUNCHERS
    )


def worker_arguments(command: Sequence[str]) -> Any:
    """The launcher's arguments, parsed by torch's parser, with the worker command replaced by
    the rank bootstrap; ConfigError (one line) for what xsp cannot trace."""
    if command[1] in DEPRECATED_LAUNCHERS:
        raise ConfigError(
            f"cannot trace {command[1]} (deprecated): run the job with torchrun or "
            "python -m torch.distributed.run"
        )
    from torch.distributed import run as torchrun

    try:
        args = torchrun.parse_args(list(command[2:]))
    except SystemExit as exc:  # argparse has printed the usage error
        raise ConfigError(f"bad {command[1]} arguments (exit {exc.code})") from exc
    if args.no_python:
        raise ConfigError(
            "cannot trace torchrun --no-python: xsp traces Python workers (give the script)"
        )
    script = ["-m", args.training_script] if args.module else [args.training_script]
    args.training_script_args = [*script, *args.training_script_args]
    check_program(args.training_script_args)  # a missing script: one line, before any rank starts
    # --run-path would run the script in a spawned copy of the launcher; a fresh interpreter
    # running the bootstrap runs it the same way
    args.training_script, args.module, args.run_path = BOOTSTRAP, True, False
    return args


@dataclass(frozen=True)
class JobEnd:
    """How a launcher's job ended: its ``program`` as run.json says it (``exit_code``,
    ``signal``, ``interrupted``), the rank that failed first, and how each failed rank ended."""

    program: ProgramEnd
    first_failure: int | None = None
    failed: dict[int, ProgramEnd] = field(default_factory=dict)


def run_workers(arguments: Any, environment: Mapping[str, str]) -> JobEnd:
    """Run the launcher with ``arguments`` (``worker_arguments``) until its workers end."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ.update(environment)
    try:
        torchrun.run(arguments)
    except ChildFailedError as exc:
        first, _ = exc.get_first_failure()
        failed = {int(rank): _ended(f.exitcode) for rank, f in exc.failures.items()}
        return JobEnd(failed[int(first)], int(first), failed)
    except SignalException as exc:  # the launcher was told to stop (Ctrl-C, SIGTERM)
        if exc.sigval == signal.SIGINT:
            return JobEnd({"interrupted": True})
        return JobEnd(_ended(-int(exc.sigval)))
    return JobEnd({"exit_code": 0})


def _ended(exitcode: int) -> ProgramEnd:
    """A process's exit code (negative: the signal that killed it) as run.json's ``program``."""
    code = int(exitcode)
    if code < 0:
        return {"signal": -code, "signal_name": _signal_name(-code)}
    return {"exit_code": code}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
