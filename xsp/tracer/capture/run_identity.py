"""A session's run identity: its ids, its rank in a multi-rank job, its run directory (emptied
for this run) and its spans' OpenTelemetry resource, as every finish of it stores them
(``xsp.tracer.export.finish.RunIdentity``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xsp.core import store
from xsp.core.errors import ConfigError
from xsp.tracer.capture.run_output import run_resource
from xsp.tracer.export.finish import RunIdentity
from xsp.tracer.spec import RunSpec

__all__ = ["identify"]


def identify(spec: RunSpec, device: str, resource: Mapping[str, Any]) -> RunIdentity:
    """The identity of the run ``spec`` asks for on ``device`` (``resource``: extra resource
    attributes); ConfigError for a rank outside its world."""
    rank, world_size = spec.rank, spec.world_size
    run_id = spec.run_id or uuid.uuid4().hex
    measurement_id = spec.measurement_id or run_id
    workload = spec.workload if spec.workload is not None else spec.profile.workload
    if rank is not None and (world_size is None or not 0 <= rank < world_size):
        raise ConfigError(f"bad rank {rank} of world size {world_size}")
    run_dir = Path(spec.out) if spec.out is not None else None
    if run_dir is not None:
        store.check_writable(run_dir)
        store.reset_run_dir(run_dir)
    levels = spec.levels
    return RunIdentity(
        run_id,
        measurement_id,
        levels,
        workload,
        run_resource(device, run_id, measurement_id, workload, levels, rank, world_size, resource),
        run_dir,
        rank,
        world_size,
    )
