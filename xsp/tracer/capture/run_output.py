"""Where a session's run goes: its sinks, its run.json and its monitor samples.

``RunOutput`` holds the run's one finish (``xsp.tracer.export.finish.RunFinish``, told the run's
``RunIdentity``), which stores the live session's records and a continuous session's batches
(``xsp.tracer.export.batches``) alike; it decides what a failed conversion costs, shuts the sinks
down and writes ``run.json`` (under a lock: a continuous session's exporter thread rewrites it
while the program runs).
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from xsp.core import schema, store
from xsp.core.levelset import LevelSet
from xsp.core.records import MonitorSamples
from xsp.core.run_sections import RunCounts
from xsp.core.store import RunMeta, Status
from xsp.tracer.capture.levels import LevelContext
from xsp.tracer.capture.run_errors import RunErrors
from xsp.tracer.export.batches import BatchExporter, Totals
from xsp.tracer.export.finish import Losses, RunFinish, RunIdentity
from xsp.tracer.export.sinks import CompositeSink, Sink, StoreSink

__all__ = ["RunOutput", "run_resource", "run_status"]

log = logging.getLogger(__name__)


def run_status(error: str | None, interrupted: bool, losses: Losses) -> Status:
    """The status a finished run's ``error`` and ``losses`` earn it: ``partial`` when something
    is missing (fewer iterations, a level's losses, a sink), ``error`` when the workload failed
    or nothing usable was stored."""
    if interrupted:
        return Status.INTERRUPTED
    if error is not None:
        return Status.ERROR
    if losses.missing:
        return Status.PARTIAL
    return Status.OK


def _xsp_version() -> str:
    try:
        from importlib.metadata import version

        return version("xsp")
    except Exception:
        return "0+unknown"


def run_resource(
    device: str,
    run_id: str,
    measurement_id: str,
    workload: str,
    levels: LevelSet,
    rank: int | None,
    world_size: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The OpenTelemetry resource of the run's spans: host, device, versions, ``extra``."""
    if device.startswith("cuda"):
        device_name = torch.cuda.get_device_name(torch.device(device))
    else:
        device_name = platform.processor() or platform.machine()
    resource: dict[str, Any] = {
        schema.RES_SERVICE_NAME: schema.SERVICE_NAME,
        schema.RES_HOST_NAME: socket.gethostname(),
        schema.RES_RUN_ID: run_id,
        schema.RES_MEASUREMENT_ID: measurement_id,
        schema.RES_WORKLOAD: workload,
        schema.RES_LEVELS: levels,
        schema.RES_DEVICE: device,
        schema.RES_DEVICE_NAME: device_name,
        schema.RES_TORCH_VERSION: torch.__version__,
        schema.RES_CUDA_VERSION: torch.version.cuda or "none",
        schema.RES_PYTHON_VERSION: platform.python_version(),
        schema.RES_XSP_VERSION: _xsp_version(),
        "process.pid": os.getpid(),
        "process.command_line": " ".join(sys.argv)[:500],
    }
    if rank is not None:
        resource.update({schema.RES_RANK: rank, schema.RES_WORLD_SIZE: world_size})
    resource.update(extra)
    return resource


class RunOutput:
    """The run's sinks (the store first, when there is a run directory) and its run.json."""

    def __init__(self, identity: RunIdentity, sinks: Sequence[Sink], errors: RunErrors) -> None:
        self.identity = identity
        self._errors = errors
        run_dir = identity.run_dir
        self.store_sink = StoreSink(run_dir) if run_dir is not None else None
        self.sink = CompositeSink(([self.store_sink] if self.store_sink else []) + list(sinks))
        self.finish = RunFinish(identity, self.sink, self.store_sink)
        self._meta_lock = threading.Lock()

    def files(self) -> list[str]:
        """The store's files so far."""
        return [p.name for p in self.store_sink.files] if self.store_sink else []

    def exporter(self, on_stored: Callable[[Totals], None]) -> BatchExporter:
        """A continuous session's background exporter of its batches."""
        return BatchExporter(self.finish, on_stored=on_stored)

    def store(
        self,
        raw: dict[str, Any],  # open: each level's records, by letter
        samples: MonitorSamples | None,
        failures: dict[int, str],
        context: LevelContext,
        counts: RunCounts,
        losses: Losses,
    ) -> tuple[int | None, Path | None]:
        """Convert the records and export them (``xsp.tracer.export.finish``; ``counts``: the
        levels' own, to which the conversion's are added). Returns when conversion ended, and
        where it failed, the path of the capture arena it keeps."""
        try:
            stored = self.finish.store(raw, counts, losses, failures=failures, monitor=samples)
        except Exception as exc:
            message = f"conversion failed: {type(exc).__name__}: {exc}"
            kept = context.keep_arena()
            if kept is not None:
                message += f" (levels M and F's raw records are kept in {kept})"
            self._errors.add(message)
            losses.fatal.append(message)
            counts["spans"] = 0
            log.exception("xsp: converting the recorded spans failed")
            return None, kept
        if stored is None:
            return None, None
        counts.update(stored.counts())
        self._errors.extend(stored.errors)
        return stored.converted_ns, None

    def shut_down(self, counts: RunCounts, losses: Losses) -> None:
        """Flush and close the sinks; a failed store leaves no spans stored."""
        errors, store_failed = self.finish.shut_down(losses)
        self._errors.extend(errors)
        if store_failed:
            counts["spans"] = 0

    def otlp_sent(self) -> RunCounts:
        maybe = [getattr(s, "spans_sent", None) for s in self.sink.sinks]
        sent: list[int] = [n for n in maybe if n is not None]
        return {"otlp_spans_sent": sum(sent)} if sent else {}

    def monitor_counts(self, samples: MonitorSamples, counts: RunCounts) -> None:
        """Count the NVML samples into ``counts`` and keep them beside the spans."""
        counts["monitor"] = {
            "samples": len(samples.time_ns),
            "unavailable": samples.unavailable,
            "gpm_unavailable": samples.gpm_unavailable,
        }
        self._write_monitor(samples)

    def _write_monitor(self, samples: MonitorSamples) -> None:
        """Keep the raw samples beside the spans: RUN_DIR/<levels>/monitor.parquet."""
        run_dir = self.identity.run_dir
        if run_dir is None or not samples.time_ns:
            return
        import pyarrow as pa

        from xsp.core.columns import arrow

        columns = {"time_ns": arrow(samples.time_ns, pa.int64())}
        columns.update({k: arrow(v, pa.float64()) for k, v in samples.values.items()})
        try:
            # from_arrays: pa.table(dict) would import pandas (0.4 s) to ask if it is a frame
            table = pa.Table.from_arrays(list(columns.values()), names=list(columns))
            store.write_monitor_samples(run_dir, table)
        except OSError as exc:
            self._errors.add(f"cannot write {run_dir / store.MONITOR}: {exc}")

    def write_meta(self, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Write run.json as ``build`` makes it, one writer at a time; returns it."""
        with self._meta_lock:  # a continuous session's exporter writes it too
            meta = build()
            run_dir = self.identity.run_dir
            if run_dir is not None:
                try:
                    store.write_run_meta(run_dir / store.RUN_META, RunMeta.from_json(meta))
                except OSError as exc:
                    log.error("xsp: cannot write %s: %s", run_dir / store.RUN_META, exc)
            return meta
