"""Collectives among the framework records: which ranges are one, which operation, what it
moves (pure functions, no torch).

A collective shows up twice on a rank: c10d's op, the call the rank makes
(``c10d::allreduce_``, on the calling thread; it carries its tensors as a list, whose shapes the
profiler leaves out), and its backend's work range, which carries the tensors' shapes and dtypes
(gloo's ``gloo:all_reduce`` spans the transfer on gloo's worker thread; NCCL's
``nccl:all_reduce`` covers the enqueue, and its kernels the transfer). The k-th call of an
operation in an iteration pairs with the k-th work range of that operation, since the backend
runs its work in the order it was queued; both then carry the bytes.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

__all__ = [
    "CALL_PREFIX",
    "ELEMENT_BYTES",
    "PREFIXES",
    "WORK_PREFIXES",
    "operation",
    "pair_bytes",
    "tensor_bytes",
]

CALL_PREFIX = "c10d::"
WORK_PREFIXES = ("gloo:", "nccl:")
PREFIXES = (CALL_PREFIX, *WORK_PREFIXES)

#: Bytes per element of the dtype names the profiler records.
ELEMENT_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "int": 4,
    "long int": 8,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}


def operation(name: str) -> str | None:
    """``c10d::allreduce_`` and ``gloo:all_reduce`` -> ``allreduce``; None for a range that is
    not a collective. Underscores differ between c10d's and the backends' names, so they go."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            text = name[len(prefix) :].replace("_", "")
            return text.removesuffix("base") or None
    return None


@lru_cache(maxsize=1024)
def tensor_bytes(shapes: str | None, dtypes: str | None) -> int | None:
    """``[[2372]]``, ``float`` -> 9488: the bytes of the tensor inputs; None where the record
    names no tensor dtype (a tensor list, or NVTX ranges, which carry no dtypes)."""
    if not shapes or not dtypes:
        return None
    try:
        parsed = json.loads(shapes)
    except ValueError:
        return None
    total, found = 0, False
    for shape, dtype in zip(parsed, dtypes.split(","), strict=False):
        size = ELEMENT_BYTES.get(dtype)
        if size is None or not isinstance(shape, list):
            continue
        if not all(isinstance(d, int) for d in shape):
            continue
        total += size * int(np.prod(shape, dtype=np.int64))
        found = True
    return total if found else None


def pair_bytes(
    operations: list[str],
    is_call: np.ndarray,
    iteration: np.ndarray,
    start: np.ndarray,
    own_bytes: np.ndarray,
) -> np.ndarray:
    """Bytes of each collective row (-1: unknown): its own, else its partner's (the k-th call of
    an operation in an iteration and the k-th work range of that operation)."""
    out = own_bytes.copy()
    order = np.lexsort((start, iteration))
    seen: dict[tuple[int, str, bool], int] = {}
    partners: dict[tuple[int, str, bool, int], int] = {}
    for row in order.tolist():
        key = (int(iteration[row]), operations[row], bool(is_call[row]))
        ordinal = seen.get(key, 0)
        seen[key] = ordinal + 1
        partners[(*key, ordinal)] = row
    for (it, op, call, ordinal), row in partners.items():
        if out[row] >= 0:
            continue
        partner = partners.get((it, op, not call, ordinal))
        if partner is not None and own_bytes[partner] >= 0:
            out[row] = own_bytes[partner]
    return out
