"""Op input shapes for the iterations that did not record them, copied from the one that did.

Recording input shapes makes PyTorch box every op's inputs for the callback: on the H200 that
was 16% of a ResNet-50 b64 training step under MFLG (1.343x against 1.183x without). So level F
records them in its first measured iteration only (``XSP_OP_SHAPES=every`` records them in
every one). In a program whose shapes do not change, an iteration that ran the same ops in the
same order on the same threads had the same inputs, and takes the first one's shapes and dtypes
by position. An iteration whose ops differ keeps none: conversion counts it, and run.json says
how many (``iterations_without_op_shapes``).
"""

from __future__ import annotations

import numpy as np

from xsp.tracer.convert.records import FrameworkRecords, Interned


def copy_first_iterations_shapes(
    rec: FrameworkRecords,
    rows: np.ndarray,
    iteration: np.ndarray,
    thread: np.ndarray,
    start: np.ndarray,
    is_module: np.ndarray,
) -> int:
    """Fill the shapes and dtypes of the op rows (``rows`` into ``rec``, with their iteration,
    thread and start; module calls carry their own shapes) of every iteration that recorded
    none from the first that did, where the two ran the same ops; rewrites
    ``rec.input_shapes`` and ``rec.input_dtypes``. Returns how many iterations stay without."""
    values = rec.input_shapes.values
    shapes = np.frombuffer(rec.input_shapes.codes, dtype=np.int32).copy()
    if not len(shapes) or not len(rows):
        return 0
    blank = values.index("[]") if "[]" in values else -1
    ops = ~is_module
    order = np.lexsort((start[ops], thread[ops], iteration[ops]))
    op_rows, op_iteration, op_thread = rows[ops][order], iteration[ops][order], thread[ops][order]
    names = np.frombuffer(rec.name.codes, dtype=np.int32)[op_rows]
    _, first = np.unique(op_iteration, return_index=True)
    bounds = list(zip(first.tolist(), [*first[1:].tolist(), len(op_rows)], strict=True))
    recorded = [bool((shapes[op_rows[a:b]] != blank).any()) for a, b in bounds]
    if all(recorded) or not any(recorded):
        return 0
    dtypes = np.frombuffer(rec.input_dtypes.codes, dtype=np.int32).copy()
    a0, b0 = bounds[recorded.index(True)]
    reference = op_rows[a0:b0]
    left = 0
    for (a, b), has in zip(bounds, recorded, strict=True):
        if has:
            continue
        same = (
            b - a == b0 - a0
            and np.array_equal(names[a:b], names[a0:b0])
            and np.array_equal(op_thread[a:b], op_thread[a0:b0])
        )
        if not same:
            left += 1
            continue
        shapes[op_rows[a:b]] = shapes[reference]
        dtypes[op_rows[a:b]] = dtypes[reference]
    rec.input_shapes = Interned.from_codes(shapes, values)
    rec.input_dtypes = Interned.from_codes(dtypes, rec.input_dtypes.values)
    return left
