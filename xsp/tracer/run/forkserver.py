"""Level-set processes forked from a server that imported torch and the zoo libraries once.

A fresh interpreter spends seconds importing torch, torchvision, timm and transformers before a
level-set run can start (3.7–5 s of a 4–5 s M run on the dev machine). For a zoo model's level
sets (``xsp run --model``, campaigns), the leveled runner forks them instead from a
multiprocessing fork server that preloaded those modules: for one model, torch and its zoo's
library; for a campaign, which forks every family's, all of them. Each level set still gets its
own process: nothing initializes CUDA, CUPTI, NVTX, cuBLAS or oneDNN in the server, so the
variables the levels need (``CUDA_VISIBLE_DEVICES``, NVTX injection, ``ONEDNN_VERBOSE_TIMESTAMP``)
still take effect when the child sets them, before any library starts.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Mapping
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from xsp.tracer.run.protocol import ChildSpec

__all__ = ["EVERY_ZOO", "context", "preload_every_zoo", "preload_for", "start"]

#: xsp's side of a level-set process, imported by every server.
_XSP = ("xsp.tracer.run.child", "xsp.tracer.workloads.zoo")
#: The zoos' libraries, by the prefix of a model's name.
_ZOO_LIBRARIES = ("torchvision", "timm", "transformers")
#: A campaign's server: every zoo's library and the transformers families' modeling code.
EVERY_ZOO = ("torch", *_ZOO_LIBRARIES, *_XSP, "xsp.tracer.workloads.preload")

_context: ForkServerContext | None = None
_lock = threading.Lock()
_every_zoo = False


def preload_for(model: str) -> tuple[str, ...]:
    """What a server for one model's level sets imports: torch, the model's zoo library and xsp's
    child. Importing the other zoos too would cost ``xsp run`` more than it saves (2.3 s of 8.0
    on the dev machine for ResNet-18's three level sets)."""
    library = model.partition(":")[0]
    return ("torch", *((library,) if library in _ZOO_LIBRARIES else ()), *_XSP)


def preload_every_zoo() -> None:
    """Make the server, when it starts, import every zoo (a campaign's jobs span them all)."""
    global _every_zoo
    _every_zoo = True


def context(model: str) -> ForkServerContext:
    """The fork server's context; the server starts with the first process it forks, importing
    ``preload_for(model)`` (or ``EVERY_ZOO``) once for the rest of this process's life."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(EVERY_ZOO if _every_zoo else preload_for(model)))
            _context = ctx
            atexit.register(_stop_server)
        return _context


def _stop_server() -> None:
    """Kill the server at the runner's exit rather than let it exit on its own. It holds the
    runner's stdout and stderr, so a pipe (``| tee``, a caller's capture) stays open until its
    interpreter, torch imported, has finished exiting: 0.7 s on the dev machine. Nothing in it
    needs finishing: it never started CUDA nor opened a file, and the level-set processes it
    forked have ended. (multiprocessing's resource tracker, a small interpreter, exits by
    itself once the runner is gone; waiting for it here could wait on a level set that
    outlived its runner.)"""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)  # None: never started
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass  # already gone


def _entry(
    spec: ChildSpec,
    env: dict[str, str],
    stderr_path: str | None,
    progress: Any,
    gate: Any,
    cwd: str,
    own_group: bool = False,
) -> None:
    """Runs in the forked child: its own process group when asked (a time limit then kills its
    children too), the runner's working directory (the server keeps the one it started in) and
    environment, then ``python -m xsp.tracer.run.child``'s main."""
    if own_group:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if stderr_path:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    spec = dataclasses.replace(spec, progress_fd=os.dup(progress.fileno()))
    progress.close()
    if gate is not None:
        spec = dataclasses.replace(spec, gate_fd=os.dup(gate.fileno()))
        gate.close()
    from xsp.tracer.run import child

    code = child.main(spec)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def start(
    spec: ChildSpec,
    env: Mapping[str, str],
    stderr_path: Path | None,
    gated: bool,
    own_group: bool = False,
) -> tuple[Any, int, int | None]:
    """Fork a level-set process running ``xsp.tracer.run.child`` for ``spec``; return (process, read end of its progress pipe, write end of its
    gate when ``gated``), the ends as fds."""
    ctx = context(spec.run.profile.model or "")
    read, write = ctx.Pipe(duplex=False)
    gate_read, gate_write = ctx.Pipe(duplex=False) if gated else (None, None)
    process = ctx.Process(
        target=_entry,
        args=(
            spec,
            dict(env),
            str(stderr_path) if stderr_path else None,
            write,
            gate_read,
            os.getcwd(),
            own_group,
        ),
        daemon=False,
    )
    process.start()
    write.close()
    fd = os.dup(read.fileno())
    read.close()
    gate_fd = None
    if gate_read is not None and gate_write is not None:
        gate_fd = os.dup(gate_write.fileno())
        gate_write.close()
        gate_read.close()
    return process, fd, gate_fd
