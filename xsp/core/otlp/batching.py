"""A span table cut into OTLP requests along its traces: one trace each (``split_traces``), or
as many whole traces as fit a span budget (``batches_under``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["batches_under", "split_traces"]


def split_traces(table: pa.Table) -> Iterator[pa.Table]:
    """Yield the rows of each trace, traces in the order of their first row."""
    ordered, sizes = _grouped_by_trace(table)
    offset = 0
    for size in sizes:
        yield ordered.slice(offset, size)
        offset += size


def _grouped_by_trace(table: pa.Table) -> tuple[pa.Table, list[int]]:
    """``table`` with each trace's rows together (traces in the order of their first row, rows
    in their order) and each trace's row count. One sort, not one filter per trace: a service's
    batch holds thousands of one-span traces (each request's model span)."""
    if table.num_rows == 0:
        return table, []
    ids = table.column("trace_id").combine_chunks()
    codes = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)  # first-seen order
    order = np.argsort(codes, kind="stable")
    ordered = table.take(pa.array(order)).combine_chunks()
    return ordered, np.bincount(codes).tolist()


def batches_under(table: pa.Table, max_spans: int) -> Iterator[pa.Table]:
    """Split a table into slices of at most ``max_spans`` rows, never splitting a trace
    unless the trace alone is larger than the limit."""
    ordered, sizes = _grouped_by_trace(table)
    start = rows = 0
    for size in sizes:
        if rows and rows + size > max_spans:
            yield ordered.slice(start, rows)
            start, rows = start + rows, 0
        rows += size
        while rows >= max_spans:  # a trace alone larger than the limit: cut in pieces
            yield ordered.slice(start, max_spans)
            start, rows = start + max_spans, rows - max_spans
    if rows:
        yield ordered.slice(start, rows)
