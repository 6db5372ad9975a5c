"""xsp's exceptions.

Every failure that xsp reports to its user is one of these::

    XspError                      base class; str(err) is a one-line message naming the problem
    ├── ConfigError               bad configuration, raised at construction (also a ValueError)
    ├── WorkloadError             an unknown zoo model, or a workload that cannot be built or run
    ├── DeviceError               the requested device is missing (no GPU, no CUDA build)
    ├── StoreError                a run directory or store file that is missing, corrupt or truncated
    │   └── DamagedFileError      a store file whose bytes or values are damaged: never read as data
    ├── ExportError               an OTLP endpoint that refuses, times out or cannot be reached
    └── ClusterError              a Ray cluster that cannot be reached or was lost mid-campaign

Errors from third-party code (pyarrow, grpc, urllib, torch) are translated at the boundary with
``raise ... from exc``. Misuse on the hot path (``xsp.step()`` with no session, say) never raises:
it logs once and carries on, so the traced program never sees an xsp exception.

``EXIT_INTERRUPTED`` is the one exit status every xsp process gives for an interrupt. The CLI
exits with an error's ``exit_code``: 2, or ``EXIT_CLUSTER`` for a ``ClusterError``.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CLUSTER",
    "EXIT_INTERRUPTED",
    "ClusterError",
    "ConfigError",
    "DamagedFileError",
    "DeviceError",
    "ExportError",
    "StoreError",
    "WorkloadError",
    "XspError",
]

#: Ctrl-C (or a service's SIGTERM): 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130
#: A cluster that is not there or went away: try again later (sysexits' EX_TEMPFAIL), since
#: the same command resumes where the campaign stopped.
EXIT_CLUSTER = 75


class XspError(Exception):
    """Base class of every error xsp raises."""

    #: The CLI's exit status for it (``xsp: error: ...``): 2, bad input or configuration.
    exit_code = 2


class ConfigError(XspError, ValueError):
    """A bad option value; the message names the value."""


class WorkloadError(XspError):
    """A workload that cannot be built or run (unknown model, failing user script)."""


class DeviceError(XspError):
    """The requested device is not available."""


class StoreError(XspError):
    """A run store that cannot be read or written; the message names the file."""


class DamagedFileError(StoreError):
    """A store file that fails its checksums, cannot be decoded, or holds values no writer
    stores (a negative duration); no figure is computed from it. The message names the file."""


class ExportError(XspError):
    """An OTLP export that failed after its retries."""


class ClusterError(XspError):
    """A Ray cluster that cannot be reached, refuses xsp, or was lost mid-campaign; what
    finished is recorded, so the same command resumes."""

    exit_code = EXIT_CLUSTER
