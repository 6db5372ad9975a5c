"""The store worker's decoder of xsp's own spans: native first, numpy when unsure.

``otlp_columns.common_columns`` reads a batch's spans with numpy, field by field: about 3 µs a
span, most of the store worker's time, so the worker stored fewer spans a second than the
receivers acknowledged. ``native/span_columns.c`` walks each span's bytes once, in C and without
the GIL, into column buffers that arrow wraps as they are, and answers "not sure" for anything
outside xsp's common case; ``common_columns`` then decides (and protobuf's own parse after it,
span by span). Its rules are that decoder's or stricter, and its columns the same, so the native
path changes what is stored in no case, only how fast.

Built like the door's check (``xsp.core.native.load_c_module``); where no C compiler
is found the collector says so once and decodes with numpy. ``XSP_NATIVE_COLUMNS=0`` turns it off.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TypedDict

import numpy as np
import pyarrow as pa

from xsp.core import schema
from xsp.core.native import load_c_module, optional_c_module
from xsp.core.otlp import columns as otlp_columns
from xsp.core.otlp.attributes import KINDS

__all__ = ["SOURCE", "WHAT", "column_specs", "decode", "load", "prepare"]

SOURCE = Path(__file__).with_name("native") / "span_columns.c"
WHAT = "the collector's native span decoder"
_INT64 = (-(1 << 63), (1 << 63) - 1)
# the column kinds of span_columns.c
_STRING, _INT, _DOUBLE = 0, 1, 2


class _NativeColumns(TypedDict):
    """What span_columns.c's ``decode`` returns: each fixed-width column as its bytes, the
    names as Arrow string buffers, the failed spans' (row, message), the links (null count,
    validity, trace ids, span ids; None: no span has one) and each used attribute column
    (index in ``ATTRIBUTE_COLUMNS``, null count, validity, values, string data or None)."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    start_ns: bytes
    dur_ns: bytes
    name_offsets: bytes
    names: bytes
    errors: list[tuple[int, str]]
    links: tuple[int, bytes, bytes, bytes] | None
    attributes: list[tuple[int, int, bytes, bytes, bytes | None]]


def decode(spans: list[bytes], firsts: np.ndarray | None = None) -> dict[str, pa.Array] | None:
    """``otlp_columns.common_columns``'s columns of ``spans`` (the same arguments and answer)."""
    native = _native()
    if native is not None:
        raw = native.decode(spans)
        if raw is not None:
            return _columns(raw, len(spans), firsts)
    return otlp_columns.common_columns(spans, firsts)


def prepare() -> bool:
    """Build and load the native decoder now (a collector's start); whether it is in use."""
    return _native() is not None


def load() -> ModuleType:
    """The decoder's extension, built first where this Python has none yet."""
    return load_c_module(SOURCE, WHAT)


def column_specs() -> list[tuple[str, int, int, int]]:
    """The attribute columns as the C decoder takes them, in ``ATTRIBUTE_COLUMNS``' order:
    (key, kind, low, high), an int column's bounds clamped to int64's (an int_value's)."""
    specs = []
    for column in schema.ATTRIBUTE_COLUMNS:
        kind = KINDS[str(column.attribute)]
        if kind.is_float:
            specs.append((kind.key, _DOUBLE, 0, 0))
        elif kind.high is None:
            specs.append((kind.key, _STRING, 0, 0))
        else:
            specs.append((kind.key, _INT, max(kind.low, _INT64[0]), min(kind.high, _INT64[1])))
    return specs


@functools.lru_cache(maxsize=1)
def _native() -> ModuleType | None:
    return optional_c_module(
        SOURCE, WHAT, "XSP_NATIVE_COLUMNS", column_specs(), "spans are decoded with numpy"
    )


def _columns(raw: _NativeColumns, n: int, firsts: np.ndarray | None) -> dict[str, pa.Array]:
    """The C decoder's buffers as ``common_columns``' arrays (wrapped, not copied)."""

    def fixed(data: bytes, type_: pa.DataType) -> pa.Array:
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(data)])

    messages: list[str | None] = [None] * n
    for row, message in raw["errors"]:  # few: the spans that failed
        messages[row] = message
    columns: dict[str, pa.Array] = {
        "trace_id": fixed(raw["trace_id"], pa.binary(16)),
        "span_id": fixed(raw["span_id"], pa.uint64()),
        "start_ns": fixed(raw["start_ns"], pa.int64()),
        "dur_ns": fixed(raw["dur_ns"], pa.int64()),
        "status_message": pa.array(messages, pa.string()),
        **_links(raw["links"], n),
    }
    for index, nulls, valid, values, text in raw["attributes"]:
        column = schema.ATTRIBUTE_COLUMNS[index]
        buffers = [pa.py_buffer(valid), pa.py_buffer(values)]
        if text is None:
            numbers = pa.float64() if pa.types.is_floating(column.type) else pa.int64()
            array = pa.Array.from_buffers(numbers, n, buffers, null_count=nulls)
        else:  # interned once per batch
            buffers.append(pa.py_buffer(text))
            array = pa.Array.from_buffers(pa.string(), n, buffers, null_count=nulls)
            array = array.dictionary_encode()
        columns[column.name] = array.cast(schema.SPAN_SCHEMA.field(column.name).type)
    names = pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(raw["name_offsets"]), pa.py_buffer(raw["names"])]
    )
    span_ids = np.frombuffer(raw["span_id"], np.uint64)
    parent_ids = np.frombuffer(raw["parent_span_id"], np.uint64).copy()  # finish_columns writes
    return otlp_columns.finish_columns(columns, names, span_ids, parent_ids, firsts)


def _links(links: tuple[int, bytes, bytes, bytes] | None, n: int) -> dict[str, pa.Array]:
    if links is None:
        return {
            "link_trace_id": pa.nulls(n, pa.binary(16)),
            "link_span_id": pa.nulls(n, pa.uint64()),
        }
    nulls, valid, traces, spans = links
    return {
        "link_trace_id": pa.Array.from_buffers(
            pa.binary(16), n, [pa.py_buffer(valid), pa.py_buffer(traces)], null_count=nulls
        ),
        "link_span_id": pa.Array.from_buffers(
            pa.uint64(), n, [pa.py_buffer(valid), pa.py_buffer(spans)], null_count=nulls
        ),
    }
