"""``xsp verify --in-process``: one process of a rule's verification, timing the zoo workload
without and with the fix in alternating blocks (``xsp.tracer.workloads.alternating``).

Each process is a fresh interpreter with a level-set process's environment (the measurement's,
an inductor cache of its own, the shared host's settings), so the processes sample the drift
between processes while each one's two sides share their own. What a process printed is kept
in ``OUT/stdout.log`` and ``OUT/stderr.log``, its record in ``OUT/alternated.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xsp.core import store
from xsp.tracer.spec import ProfileSpec
from xsp.tracer.workloads.alternating import BASE, DEFAULT_BLOCKS, FIXED
from xsp.tracer.workloads.numerics import Comparison

__all__ = ["RECORD_FILE", "AlternatedProcess", "command", "run_process"]

RECORD_FILE = "alternated.json"
STDERR_FILE = "stderr.log"
STDOUT_FILE = "stdout.log"
#: Steps a block runs where the measurement ran until stopped (``--iterations 0``).
CONTINUOUS_BLOCK = 10


@dataclass(frozen=True)
class AlternatedProcess:
    """One process's step times per side (ms), its first forward pass's change
    (``numerics.compare``), or why it failed."""

    path: Path
    steps_ms: dict[str, list[float]]
    numerics: Comparison | None
    error: str | None


def command(profile: ProfileSpec, fix: str, device: str) -> list[str]:
    """The process's command line: the measurement's zoo workload, its fixes, and ``fix``."""
    assert profile.model is not None  # plan() refuses --in-process for a command
    line = [sys.executable, "-m", "xsp.tracer.workloads.alternating", "--model", profile.model]
    line += ["--batch-size", str(profile.batch_size), "--mode", profile.mode]
    line += ["--device", device, "--fix", fix, "--blocks", str(DEFAULT_BLOCKS)]
    line += ["--iterations", str(profile.iterations or CONTINUOUS_BLOCK)]
    line += ["--warmup", str(profile.warmup)]
    for applied in profile.fixes:
        line += ["--applied", applied]
    if profile.channels_last:
        line.append("--channels-last")
    return line


def run_process(
    profile: ProfileSpec, fix: str, env: dict[str, str], out: Path
) -> AlternatedProcess:
    """Run one alternating process into ``out``; KeyboardInterrupt passes through (the
    process, in the same process group, has had the same Ctrl-C)."""
    from xsp.core.devices import resolve_device
    from xsp.core.errors import XspError

    out.mkdir(parents=True, exist_ok=True)
    try:
        line = command(profile, fix, resolve_device(profile.device))
    except XspError as exc:  # the device went away since the plan was checked
        return _failed(out, str(exc))
    with (
        tempfile.TemporaryDirectory(prefix="xsp-compile-") as cache,
        open(out / STDERR_FILE, "wb") as stderr,
    ):
        environment = _environment(env, cache)
        done = subprocess.run(line, stdout=subprocess.PIPE, stderr=stderr, env=environment)
    (out / STDOUT_FILE).write_bytes(done.stdout)
    if done.returncode != 0:
        return _failed(out, _why(out, done.returncode))
    records = [
        text for text in done.stdout.decode(errors="replace").splitlines() if text.startswith("{")
    ]
    try:
        record = json.loads(records[-1])
        steps = {side: [float(ms) for ms in record["steps_ms"][side]] for side in (BASE, FIXED)}
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        return _failed(out, f"no readable record in {out / STDOUT_FILE}: {exc!r}")
    store.write_json_atomic(out / RECORD_FILE, record)
    return AlternatedProcess(out, steps, record.get("numerics"), None)


def _environment(env: dict[str, str], compile_cache: str) -> dict[str, str]:
    """As a level-set process's (``xsp.tracer.run.environment``): the caller's, the spec's, an
    inductor cache of its own unless one is named (what ``compile`` builds is neither read from
    nor left in the user's), and the shared host's settings last."""
    from xsp.tracer.run.environment import COMPILE_CACHE_ENV, SHARED_HOST_ENV

    merged = {**os.environ, **env}
    merged.setdefault(COMPILE_CACHE_ENV, compile_cache)
    return {**merged, "PYTHONUNBUFFERED": "1", **SHARED_HOST_ENV}


def _failed(out: Path, why: str) -> AlternatedProcess:
    return AlternatedProcess(out, {BASE: [], FIXED: []}, None, why)


def _why(out: Path, returncode: int) -> str:
    """A signal's name (the OOM killer's SIGKILL), else the process's last line on standard
    error (``xsp: ...``, a traceback's exception)."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    text = (out / STDERR_FILE).read_text(errors="replace").strip()
    last = text.splitlines()[-1] if text else ""
    return f"exit {returncode}: {last[:300]}" if last else f"exit {returncode}, no message"
