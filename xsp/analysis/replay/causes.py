"""What each span's time on the critical path is charged to (``xsp.analysis.replay``, step 4),
and the verdict the largest share gives."""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.columns import arrow
from xsp.core.intervals import inherit

__all__ = [
    "CAUSES",
    "CAUSE_COMMUNICATION",
    "CAUSE_DATA",
    "CAUSE_GPU",
    "CAUSE_HOST",
    "CAUSE_LAUNCH",
    "CAUSE_SYNC",
    "VERDICTS",
    "Cause",
    "Verdict",
    "cause_column",
    "span_causes",
]


class Cause(StrEnum):
    """Causes on the critical path, in the order tables list them (a ``str``: tables and JSON
    hold the text)."""

    GPU = "gpu compute"
    HOST = "host work"
    LAUNCH = "launch overhead"
    SYNC = "synchronization"
    DATA = "data loading"
    COMMUNICATION = "communication"


class Verdict(StrEnum):
    """What bounds the step: the verdict of the cause that holds the largest share of it."""

    GPU = "GPU-bound"
    HOST = "host-bound"
    LAUNCH = "launch-bound"
    SYNC = "sync-bound"
    DATA = "input-bound"
    COMMUNICATION = "communication-bound"


CAUSE_GPU = Cause.GPU
CAUSE_HOST = Cause.HOST
CAUSE_LAUNCH = Cause.LAUNCH
CAUSE_SYNC = Cause.SYNC
CAUSE_DATA = Cause.DATA
CAUSE_COMMUNICATION = Cause.COMMUNICATION
CAUSES = tuple(Cause)
#: The verdict each cause gives when it holds the largest share of the step.
VERDICTS = {cause: Verdict[cause.name] for cause in Cause}


def cause_column(causes: np.ndarray) -> pa.Array:
    """A string column of causes (each one of ``CAUSES``), built as codes into ``CAUSES``: a
    string a row took 0.13 s of ``xsp summary``."""
    codes = np.zeros(len(causes), np.int32)
    for code, cause in enumerate(CAUSES):
        codes[causes == cause] = code
    names = arrow(list(CAUSES), pa.string())
    return pa.DictionaryArray.from_arrays(arrow(codes), names).cast(pa.string())


def span_causes(
    parent: np.ndarray,
    depth: np.ndarray,
    kind: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
    communicating: np.ndarray,
) -> np.ndarray:
    """The cause each span's time is charged to on the critical path (step 4); a step's own
    (untraced gaps between its spans) is host work, NCCL's kernels (``communicating``) are
    communication."""
    causes = np.full(len(kind), CAUSE_HOST, dtype=object)
    for marked, cause in (
        (kind == schema.KIND_COLLECTIVE, CAUSE_COMMUNICATION),
        (kind == schema.KIND_DATA_LOADING, CAUSE_DATA),
    ):  # a span inside a collective's or a batch's range is its time
        inside = inherit(np.where(marked, 1, -1), parent, depth) > 0
        causes[inside] = cause
    launcher = np.zeros(len(kind), dtype=bool)
    launcher[parent[gpu & (parent >= 0)]] = True
    causes[launcher & np.isin(kind, (schema.KIND_RUNTIME, schema.KIND_DRIVER))] = CAUSE_LAUNCH
    causes[is_sync] = CAUSE_SYNC
    causes[gpu] = CAUSE_GPU
    causes[communicating] = CAUSE_COMMUNICATION
    return causes
