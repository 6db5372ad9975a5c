"""Shapes for the iterations that did not record them, copied from the one that did.

Recording input shapes makes PyTorch box every op's inputs for the callback: on the H200 that
was 16% of a ResNet-50 b64 training step under MFLG (1.343x against 1.183x without). So level F
records shapes (ops' inputs, module calls' arguments and outputs) in its first measured
iteration only (``XSP_OP_SHAPES=every`` records them in every one). In a program whose shapes
do not change, an iteration that ran the same ops and module calls in the same order on the same
threads had the same inputs, and takes the first one's shapes and dtypes by position. An
iteration that ran others keeps none: conversion counts it, and run.json says how many
(``iterations_without_op_shapes``).
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
    call: np.ndarray,
) -> int:
    """Fill the shapes and dtypes of ``rows`` (into ``rec``, with their iteration, thread and
    start; ``call``: the module call number of a module row, -1 on the others) in every
    iteration that recorded none from the first that did, where the two ran the same ops and
    modules. Rewrites ``rec``'s shape columns; returns how many iterations stay without."""
    values = rec.input_shapes.values
    shapes = np.frombuffer(rec.input_shapes.codes, dtype=np.int32).copy()
    if not len(shapes) or not len(rows):
        return 0
    blank = values.index("[]") if "[]" in values else -1
    order = np.lexsort((start, thread, iteration))
    rows, iteration, thread, call = rows[order], iteration[order], thread[order], call[order]
    module = np.asarray([*rec.call_module, 0], dtype=np.int64)  # a row without modules: [0]
    # what ran: an op's name, or a module call's module (its range name is unique per call)
    ran = np.where(
        call >= 0, -2 - module[np.maximum(call, 0)], np.frombuffer(rec.name.codes, np.int32)[rows]
    )
    has_call_shapes = np.array([s is not None for s in rec.call_input_shapes] + [False])
    recorded_row = np.where(call >= 0, has_call_shapes[call], shapes[rows] != blank)
    _, first = np.unique(iteration, return_index=True)
    bounds = list(zip(first.tolist(), [*first[1:].tolist(), len(rows)], strict=True))
    recorded = [bool(recorded_row[a:b].any()) for a, b in bounds]
    if all(recorded) or not any(recorded):
        return 0
    dtypes = np.frombuffer(rec.input_dtypes.codes, dtype=np.int32).copy()
    a0, b0 = bounds[recorded.index(True)]
    calls_in, calls_out = rec.call_input_shapes, rec.call_output_shapes
    left = 0
    for (a, b), has in zip(bounds, recorded, strict=True):
        if has:
            continue
        if not (
            np.array_equal(ran[a:b], ran[a0:b0]) and np.array_equal(thread[a:b], thread[a0:b0])
        ):
            left += 1
            continue
        shapes[rows[a:b]] = shapes[rows[a0:b0]]
        dtypes[rows[a:b]] = dtypes[rows[a0:b0]]
        for target, source in zip(call[a:b].tolist(), call[a0:b0].tolist(), strict=True):
            if target >= 0:
                calls_in[target] = calls_in[source]
                if source in calls_out:
                    calls_out[target] = calls_out[source]
    rec.input_shapes = Interned.from_codes(shapes, values)
    rec.input_dtypes = Interned.from_codes(dtypes, rec.input_dtypes.values)
    return left
