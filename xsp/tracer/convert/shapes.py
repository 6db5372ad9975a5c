"""Shapes for the iterations that did not record them, copied from the one that did.

Recording input shapes makes PyTorch box every op's inputs for the callback: on the H200 that
was 16% of a ResNet-50 b64 training step under MFLG (1.343x against 1.183x without). So level F
records shapes (ops' inputs, module calls' arguments and outputs) in its first measured
iteration only (``XSP_OP_SHAPES=every`` records them in every one), with each op's calling
Python line (``file:line function``, the ``source`` column), and the arguments of root
module calls in every iteration. Within one iteration, the ops a thread ran take the shapes
of the ops the same thread ran in the first iteration, by position, when the two ran the same
ops and module calls in the same order (names compared without a trailing ``#<number>``, as in
``ProfilerStep#3``) and their root calls had the same arguments: the same program on the same
inputs. An iteration of which some thread's ops stay without (other ops, another batch shape:
the last, smaller batch) is counted, and run.json says how many (``iterations_without_op_shapes``).
"""

from __future__ import annotations

import re

import numpy as np

from xsp.core.records import FrameworkRecords, Interned

__all__ = ["copy_first_iterations_shapes"]

_COUNTER = re.compile(r"#\d+$")


def copy_first_iterations_shapes(
    rec: FrameworkRecords,
    rows: np.ndarray,
    iteration: np.ndarray,
    thread: np.ndarray,
    start: np.ndarray,
    call: np.ndarray,
) -> int:
    """Fill the shapes and dtypes of ``rows`` (into ``rec``, with their iteration, thread and
    start; ``call``: the module call number of a module row, -1 on the others) where their
    iteration recorded none, from the first iteration that did (see the module's docstring).
    Rewrites ``rec``'s shape columns; returns how many iterations keep rows without."""
    values = rec.input_shapes.values
    shapes = np.frombuffer(rec.input_shapes.codes, dtype=np.int32).copy()
    if not len(shapes) or not len(rows):
        return 0
    blank = values.index("[]") if "[]" in values else -1
    order = np.lexsort((start, thread, iteration))
    rows, iteration, thread, call = rows[order], iteration[order], thread[order], call[order]
    recorded_row = (call < 0) & (shapes[rows] != blank)  # root calls record theirs every time
    _, first = np.unique(iteration, return_index=True)
    bounds = list(zip(first.tolist(), [*first[1:].tolist(), len(rows)], strict=True))
    recorded = [bool(recorded_row[a:b].any()) for a, b in bounds]
    if all(recorded) or not any(recorded):
        return 0
    ran = _what_ran(rec, rows, call)
    template = _by_thread(*bounds[recorded.index(True)], thread)
    dtypes = np.frombuffer(rec.input_dtypes.codes, dtype=np.int32).copy()
    # the ops' calling lines are recorded with their shapes, and copied with them
    sources = np.frombuffer(rec.op_source.codes, dtype=np.int32).copy()
    calls_in, calls_out = rec.call_input_shapes, rec.call_output_shapes
    left = 0
    for (a, b), has in zip(bounds, recorded, strict=True):
        if has:
            continue
        complete = True
        for th, (c, d) in _by_thread(a, b, thread).items():
            if th not in template:
                complete = False
                continue
            c0, d0 = template[th]
            same = np.array_equal(ran[c:d], ran[c0:d0]) and all(
                calls_in[target] == calls_in[source]
                for target, source in zip(call[c:d].tolist(), call[c0:d0].tolist(), strict=True)
                if target >= 0 and calls_in[target] is not None  # a root call
            )
            if not same:
                complete = False
                continue
            shapes[rows[c:d]] = shapes[rows[c0:d0]]
            dtypes[rows[c:d]] = dtypes[rows[c0:d0]]
            if len(sources):
                sources[rows[c:d]] = sources[rows[c0:d0]]
            modules = np.nonzero(call[c:d] >= 0)[0]
            for target, source in zip(
                call[c:d][modules].tolist(), call[c0:d0][modules].tolist(), strict=True
            ):
                calls_in[target] = calls_in[source]
                if source in calls_out:
                    calls_out[target] = calls_out[source]
        left += not complete
    rec.input_shapes = Interned.from_codes(shapes, values)
    rec.input_dtypes = Interned.from_codes(dtypes, rec.input_dtypes.values)
    if len(sources):
        rec.op_source = Interned.from_codes(sources, rec.op_source.values)
    return left


def _what_ran(rec: FrameworkRecords, rows: np.ndarray, call: np.ndarray) -> np.ndarray:
    """Per row, what ran: its op's name without a trailing counter, as a code >= 0, or its
    module call's module, as a code <= -2 (a module range's name is unique per call)."""
    names = rec.name.values
    base: dict[str, int] = {}
    plain = np.array([base.setdefault(_COUNTER.sub("", n), len(base)) for n in names] + [0])
    module = np.asarray([*rec.call_module, 0], dtype=np.int64)  # a run without modules: [0]
    name_codes = np.frombuffer(rec.name.codes, dtype=np.int32)[rows]
    return np.where(call >= 0, -2 - module[np.maximum(call, 0)], plain[name_codes])


def _by_thread(a: int, b: int, thread: np.ndarray) -> dict[int, tuple[int, int]]:
    """The [start, end) slice of each thread's rows within [a, b) (rows sorted by thread)."""
    threads, first = np.unique(thread[a:b], return_index=True)
    ends = [*first[1:].tolist(), b - a]
    return {int(t): (a + f, a + e) for t, f, e in zip(threads, first.tolist(), ends, strict=True)}
