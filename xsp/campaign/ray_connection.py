"""The driver's connection to a Ray cluster: reaching it, noticing that it is gone, and saying
either in one ``ClusterError`` line (exit status 75) that tells the user the same command
resumes.

Ray's C++ core writes its own complaints straight to file descriptor 2 (40 lines and a
traceback when the head stops; for a GCS that went away, a minute of retries and then it ends
the process itself). While connected, descriptor 2 therefore goes to a log file, and Python's
``sys.stderr`` (the progress bar, xsp's lines) to a copy of the terminal's descriptor. A lost
cluster is noticed by the driver itself, its GCS no longer taking connections, before Ray's
minute is up.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from xsp.core.errors import ClusterError

__all__ = ["GcsWatch", "connect", "disconnect", "first_line", "lost"]

#: Seconds to wait for a TCP answer from a cluster address before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Looks in a row at a GCS that takes no connection before the cluster counts as lost.
GCS_MISSES = 3

_RESUME = "then run the same command to resume"


@dataclass
class _Redirect:
    """Descriptor 2 sent to Ray's log, and how to undo it."""

    saved_fd: int
    python_stderr: TextIO

    def undo(self) -> None:
        ours = sys.stderr
        ours.flush()
        os.dup2(self.saved_fd, 2)
        os.close(self.saved_fd)
        sys.stderr = self.python_stderr
        ours.close()


_redirect: _Redirect | None = None


def connect(address: str | None, log: Path) -> None:
    """``ray.init``, with Ray's own output going to ``log``; a cluster that is not there or
    refuses is one ``ClusterError`` line. An address with nothing listening is found out at
    once (Ray itself retries one for minutes)."""
    import ray

    if ray.is_initialized():
        return
    if address not in (None, "auto"):
        _check_listening(address)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = log.stat().st_size if log.exists() else 0
    _send_fd2_to(log)
    try:
        ray.init(
            address=address,
            ignore_reinit_error=True,
            log_to_driver=False,
            logging_level=logging.WARNING,
            include_dashboard=False,
        )
        return
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:
        error: BaseException = exc
    _restore_fd2()
    with log.open(errors="replace") as said:
        said.seek(start)
        refused = any(word in said.read() for word in ("InvalidAuthToken", "Unauthenticated"))
    where = address or "this machine"
    if refused or isinstance(error, ray.exceptions.AuthenticationError):
        raise ClusterError(
            f"the Ray cluster at {where} refused the connection: it uses token "
            "authentication; set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, or "
            f"~/.ray/auth_token) as on its nodes, {_RESUME}"
        ) from error
    raise ClusterError(_nobody(where, first_line(error))) from error


def disconnect(cluster_lost: bool) -> None:
    """``ray.shutdown`` and Ray's output back on the terminal; after a lost cluster, neither
    (its shutdown would wait on the dead GCS, and its core still logs): the process is ending."""
    import ray

    if cluster_lost:
        return
    ray.shutdown()
    _restore_fd2()


class GcsWatch:
    """Whether the cluster's GCS still takes connections (the driver's own look: Ray's core
    retries a lost GCS for a minute, then ends the process)."""

    def __init__(self) -> None:
        import ray

        self.address: str | None = None
        self.misses = 0
        try:
            self.address = ray.get_runtime_context().gcs_address
        except Exception:  # a Ray client connection (ray://) has none to look at
            self.address = None

    def answers(self) -> bool:
        """False once the GCS has refused ``GCS_MISSES`` looks in a row."""
        if not self.address:
            return True
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S).close()
            self.misses = 0
        except OSError:
            self.misses += 1
        return self.misses < GCS_MISSES


def lost(address: str | None, why: str, finished: int, total: int) -> str:
    return (
        f"lost the Ray cluster at {address or 'this machine'} after {finished} of {total} jobs "
        f"({why}); the finished jobs are recorded: run the same command to resume"
    )


def first_line(exc: BaseException) -> str:
    """An exception's message, its first line only (Ray's carry tracebacks), shortened."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _nobody(where: str, reason: str) -> str:
    return (
        f"no Ray cluster at {where} ({reason}); start one (ray start --head) or give its "
        f"address with --address, {_RESUME}"
    )


def _check_listening(address: str) -> None:
    """Refuse an address whose host does not answer on its port, at once."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"bad --address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ClusterError(_nobody(address, reason)) from exc


def _send_fd2_to(log: Path) -> None:
    global _redirect
    if _redirect is not None:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    python_stderr = sys.stderr
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, errors="backslashreplace")
    _redirect = _Redirect(saved, python_stderr)


def _restore_fd2() -> None:
    global _redirect
    if _redirect is not None:
        _redirect.undo()
        _redirect = None
