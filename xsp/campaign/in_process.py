"""``xsp verify --in-process``: one process of a rule's verification, timing the zoo workload
without and with the fix in alternating blocks (``xsp.tracer.workloads.alternating``).

Each process is a fresh interpreter, started as the measurement's runs were (its environment, its
working directory), so the processes sample the drift between processes while each one's two
sides share their own. What a process printed on standard error is kept in
``OUT/stderr.log``, its record in ``OUT/alternated.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsp.core import store
from xsp.tracer.spec import ProfileSpec
from xsp.tracer.workloads.alternating import BASE, DEFAULT_BLOCKS, FIXED

__all__ = ["RECORD_FILE", "AlternatedProcess", "command", "run_process"]

RECORD_FILE = "alternated.json"
STDERR_FILE = "stderr.log"
#: Steps a block runs where the measurement ran until stopped (``--iterations 0``).
CONTINUOUS_BLOCK = 10


@dataclass(frozen=True)
class AlternatedProcess:
    """One process's step times per side (ms), its first forward pass's change
    (``numerics.compare``), or why it failed."""

    path: Path
    steps_ms: dict[str, list[float]]
    numerics: dict[str, Any] | None
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
    profile: ProfileSpec, fix: str, env: dict[str, str], cwd: Path | None, out: Path
) -> AlternatedProcess:
    """Run one alternating process into ``out``; KeyboardInterrupt passes through (the
    process, in the same process group, has had the same Ctrl-C)."""
    from xsp.core.devices import resolve_device

    out.mkdir(parents=True, exist_ok=True)
    line = command(profile, fix, resolve_device(profile.device))
    with open(out / STDERR_FILE, "wb") as stderr:
        done = subprocess.run(
            line,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **env},
            cwd=cwd if cwd is not None and cwd.is_dir() else None,
            check=False,
        )
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        return AlternatedProcess(out, {BASE: [], FIXED: []}, None, _why(out, done.returncode))
    try:
        record = json.loads(lines[-1])
        steps = {side: [float(ms) for ms in record["steps_ms"][side]] for side in (BASE, FIXED)}
    except (ValueError, KeyError, TypeError) as exc:
        return AlternatedProcess(out, {BASE: [], FIXED: []}, None, f"unreadable record: {exc}")
    store.write_json_atomic(out / RECORD_FILE, record)
    return AlternatedProcess(out, steps, record.get("numerics"), None)


def _why(out: Path, returncode: int) -> str:
    """The process's last line on standard error (``xsp: ...``, a traceback's exception)."""
    text = (out / STDERR_FILE).read_text(errors="replace").strip()
    last = text.splitlines()[-1] if text else ""
    return f"exit {returncode}: {last[:300]}" if last else f"exit {returncode}, no message"
