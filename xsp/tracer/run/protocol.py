"""What the runner hands one level-set process: a single ``ChildSpec`` (its ``RunSpec`` and its
pipes), serialized as JSON in the process's arguments, so that a fresh interpreter
(``python -m xsp.tracer.run.child --spec …``) and a process forked from the fork server read the
same object, and a field added to the spec reaches both without a second argument parser to
keep in step. The ranks of a multi-rank job, which a
launcher starts with its own command line, read the same object from their environment
(``RANK_SPEC_ENV``). ``describe_end`` words how a program ended (run.json's ``program``) for
the runner and for the join of a multi-rank job's ranks alike; ``check_program`` refuses a
Python command that cannot run, for the runner before anything starts and for the level-set
process (a rank worker's command reaches only that)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xsp.core.errors import ConfigError
from xsp.tracer.spec import RunSpec

if TYPE_CHECKING:
    from xsp.core.store import ProgramEnd

__all__ = [
    "RANK_SPEC_ENV",
    "READY",
    "SPEC_FLAG",
    "STORED",
    "ChildSpec",
    "check_program",
    "describe_end",
]

SPEC_FLAG = "--spec"
#: The environment variable through which a multi-rank job's level-set process hands its spec
#: to the rank processes that the launcher (torchrun) starts: they inherit its environment, not
#: its arguments.
RANK_SPEC_ENV = "XSP_RANK_SPEC"
#: The progress phase with which a process that runs several level sets in turn says that it
#: has stored one's run and goes on to the next (``xsp.tracer.run.placement.shares_process``).
STORED = "stored"
#: The progress phase with which a process started ahead of its turn says that it has warmed up
#: and waits at its gate: the level sets before it may measure now.
READY = "ready"


@dataclass(frozen=True)
class ChildSpec:
    """A level-set process's run (``xsp.tracer.spec.RunSpec``), the runs it makes after it in
    the same process (``then``: a zoo model's M, then MF), and its ends of the runner's pipes:
    file descriptors inherited from the runner (progress lines out, the gate's byte in), or,
    for rank 0 of a multi-rank job, the progress pipe by path."""

    run: RunSpec
    progress_fd: int | None = None
    gate_fd: int | None = None
    progress_path: str | None = None
    then: tuple[RunSpec, ...] = ()

    @property
    def run_dir(self) -> Path:
        """The run directory (a level-set process always writes one)."""
        if self.run.out is None:
            raise ConfigError("a level-set process needs a run directory (its spec's out)")
        return Path(self.run.out)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def to_argv(self) -> list[str]:
        return [SPEC_FLAG, self.to_json()]

    @classmethod
    def from_json(cls, text: str, what: str = SPEC_FLAG) -> ChildSpec:
        """The spec from its JSON; ConfigError naming ``what`` for anything else."""
        try:
            data = json.loads(text)
            then = tuple(RunSpec.from_dict(run) for run in data.get("then") or ())
            return cls(**{**data, "run": RunSpec.from_dict(data["run"]), "then": then})
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ConfigError(f"bad {what}: {exc}") from exc

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> ChildSpec:
        """The spec from ``--spec JSON``; ConfigError (one line) for anything else."""
        if len(argv) != 2 or argv[0] != SPEC_FLAG:
            raise ConfigError(f"a level-set process takes {SPEC_FLAG} JSON (from xsp run)")
        return cls.from_json(argv[1])


def describe_end(program: ProgramEnd) -> str:
    """``was killed by SIGKILL``, ``exited with 5``, ``raised ValueError: ...``."""
    if "signal" in program:
        return f"was killed by {program.get('signal_name') or program.get('signal')}"
    if program.get("interrupted"):
        return "was interrupted"
    if program.get("exception"):
        return f"raised {program.get('exception')}"
    return f"exited with {program.get('exit_code')}"


def check_program(command: Sequence[str]) -> None:
    """Refuse, before anything runs, a script that is not there or a module that cannot be
    found (as ``python -m`` looks: the working directory first); ``command`` is
    ``script_command``'s."""
    if command[0] == "-c":
        if len(command) < 2:
            raise ConfigError("python -c needs the code to run")
        return
    if command[0] == "-m":
        if len(command) < 2:
            raise ConfigError("python -m needs a module name")
        top = command[1].split(".")[0]  # a parent package is not imported to look
        found = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path])
        if found is None and top not in sys.builtin_module_names:
            raise ConfigError(f"no module named {top!r} (python -m {command[1]})")
        return
    if not Path(command[0]).is_file():
        raise ConfigError(f"script not found: {command[0]}")
