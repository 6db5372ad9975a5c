"""Column helpers that every conversion step shares.

Conversion builds its arrow arrays with ``arrow`` rather than ``pa.array``: pyarrow's
``pa.array`` first asks whether its input is a pandas object, and to ask it imports pandas,
which in a traced process cost 0.35 s of the finish and 41 MB of resident memory on the dev
machine. ``arrow`` hands numpy's buffers to arrow directly; ``numbers`` reads them back (for
``to_numpy``, which asks pandas too), and ``scalar`` makes the scalars compute functions
compare with (``pa.scalar`` asks it as well).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "NullColumns",
    "arrow",
    "dictionary",
    "dictionary_column",
    "equals",
    "numbers",
    "repeated",
    "rows_table",
    "scalar",
]

#: The numpy type of each fixed-width arrow type conversion writes.
_NUMPY = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def arrow(values: Any, type_: pa.DataType | None = None, mask: Any = None) -> pa.Array:
    """``pa.array(values, type_, mask=mask)`` for numbers, booleans, strings (``None`` is
    null) and fixed-size binaries, without importing pandas. ``mask`` marks nulls."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        if type_ is None:
            type_ = pa.bool_() if values.dtype.kind == "b" else pa.from_numpy_dtype(values.dtype)
    elif type_ is None:
        raise TypeError("arrow(): give the type of a column that is not a numpy array")
    elif type_ not in _NUMPY and type_ != pa.bool_():
        return _variable(list(values), type_, mask)
    n = len(values)
    validity = None
    if mask is not None:
        valid = ~np.asarray(mask, dtype=bool)
        if not valid.all():
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if type_ == pa.bool_():
        data = pa.py_buffer(np.packbits(np.asarray(values, dtype=bool), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=_NUMPY[type_]))
    return pa.Array.from_buffers(type_, n, [validity, data])


class NullColumns:
    """All-null columns of ``n`` rows that share one zeroed buffer for their validity bitmaps,
    values, offsets and dictionary indices. ``pa.nulls`` gives each column its own (8 bytes a
    row for an int64): the 25 or so columns a span of one kind leaves empty took 200 of the span
    table's 350 bytes a row. The buffer comes from numpy's ``zeros`` (calloc), whose pages stay
    unbacked until something reads them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._zeros = pa.py_buffer(np.zeros(8 * n + 8, dtype=np.uint8))

    def __call__(self, type_: pa.DataType) -> pa.Array:
        n, zeros = self.n, self._zeros
        if type_ in _NUMPY:
            return pa.Array.from_buffers(type_, n, [zeros, zeros], null_count=n)
        if type_ in (pa.string(), pa.binary()):  # offsets all 0: every value empty
            return pa.Array.from_buffers(type_, n, [zeros, zeros, zeros], null_count=n)
        if pa.types.is_dictionary(type_) and type_.index_type in _NUMPY:
            column = pa.DictionaryArray.from_arrays(
                self(type_.index_type), arrow([], type_.value_type)
            )
            return column if column.type == type_ else column.cast(type_)
        return pa.nulls(n, type_)


def rows_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema=schema)`` for columns ``arrow`` makes (a missing key
    or ``None`` is null), without importing pandas."""
    columns = []
    for field_ in schema:
        values = [row.get(field_.name) for row in rows]
        if field_.type in _NUMPY or field_.type == pa.bool_():
            missing = np.array([v is None for v in values], dtype=bool)
            dtype = bool if field_.type == pa.bool_() else _NUMPY[field_.type]
            filled = np.array([0 if v is None else v for v in values], dtype=dtype)
            columns.append(arrow(filled, field_.type, mask=missing))
        else:
            columns.append(arrow(values, field_.type))
    return pa.Table.from_arrays(columns, schema=schema)


def scalar(value: Any, type_: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, type_)``, without importing pandas."""
    if type_ in _NUMPY or type_ == pa.bool_():
        return arrow(np.array([value]), type_)[0]
    return arrow([value], type_)[0]


def numbers(column: pa.Array | pa.ChunkedArray, null: Any = None) -> np.ndarray:
    """A fixed-width or boolean arrow column as a numpy array, nulls as ``null`` (which a
    column with nulls needs), without importing pandas."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n, offset = len(column), column.offset
    validity, data = column.buffers()[:2]
    if column.type == pa.bool_():
        bits = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        values = np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(bool)
    else:
        dtype = np.dtype(_NUMPY[column.type])
        values = (
            np.frombuffer(data, dtype=dtype, count=offset + n)[offset:] if n else np.zeros(0, dtype)
        )
    if column.null_count:
        if null is None:
            raise ValueError("numbers(): the column has nulls; say what stands for them")
        bits = np.frombuffer(validity, dtype=np.uint8)
        valid = np.unpackbits(bits, count=offset + n, bitorder="little")[offset:].astype(bool)
        values = np.where(valid, values, null)
    return values


def repeated(value: str, n: int) -> pa.DictionaryArray:
    """``n`` rows of one string, dictionary-encoded (a block's name or kind column)."""
    return pa.DictionaryArray.from_arrays(
        arrow(np.zeros(n, dtype=np.int32)), _variable([value], pa.string(), None, small=True)
    )


def dictionary(values: Sequence[Any], mask: Any = None) -> pa.DictionaryArray | None:
    """Strings as a dictionary array (int32 codes, the distinct values in order of first
    appearance, ``None`` or ``mask`` null): what ``arrow(values, pa.string()).dictionary_encode()``
    gives, with one dict lookup a row instead of an encode and a copy (a service's exporter
    converts its spans beside the requests, and holds the interpreter lock while it does).
    None when a value is not a string: ``arrow`` spells those out one by one."""
    codes: dict[Any, int] = {}
    found = codes.setdefault
    try:
        index = np.array([found(v, len(codes)) for v in values], dtype=np.int32)
    except TypeError:  # a value that cannot be hashed
        return None
    if not all(type(v) is str for v in codes if v is not None):
        return None  # 1 and True share a code; str() of each tells them apart
    null = np.zeros(len(index), dtype=bool) if mask is None else np.array(mask, dtype=bool)
    if None in codes:  # not a value of the dictionary: its rows are null
        gone = codes.pop(None)
        null |= index == gone
        index[index > gone] -= 1
    distinct = _variable(list(codes), pa.string(), None, small=True)
    return pa.DictionaryArray.from_arrays(arrow(index, pa.int32(), mask=null), distinct)


def _variable(
    values: Sequence[Any], type_: pa.DataType, mask: Any, small: bool = False
) -> pa.Array:
    """Strings or fixed-size binaries from a Python sequence; ``None`` (or ``mask``) is null."""
    n = len(values)
    # a column whose values repeat (names, kinds) goes through codes; one of distinct values
    # (a message a row) is spelled out
    if pa.types.is_string(type_) and not small and n > 64 and _repeats(values):
        encoded = dictionary(values, mask)
        if encoded is not None:
            return encoded.dictionary_decode()
    valid = np.array([v is not None for v in values], dtype=bool)
    if mask is not None:
        valid &= ~np.asarray(mask, dtype=bool)
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if pa.types.is_fixed_size_binary(type_):
        width = type_.byte_width
        blank = bytes(width)
        data = b"".join(bytes(v) if ok else blank for v, ok in zip(values, valid, strict=True))
        return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)])
    if not pa.types.is_string(type_):
        raise TypeError(f"arrow(): no fast path for {type_}")
    encoded = [str(v).encode() if ok else b"" for v, ok in zip(values, valid, strict=True)]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(type_, n, buffers)


def _repeats(values: Sequence[Any]) -> bool:
    """Whether the first 64 values hold fewer than 32 distinct ones."""
    try:
        return len(set(values[:64])) < 32
    except TypeError:  # a value that cannot be hashed
        return False


def equals(column: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    """Which rows of a string column (dictionary-encoded or plain) hold ``value``, as a numpy
    mask; a dictionary column is compared once per distinct value, not per row."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            hit = np.array([v == value for v in chunk.dictionary.to_pylist()] + [False])
            codes = numbers(chunk.indices, null=-1).astype(np.int64)
            parts.append(hit[codes])  # a null's code -1 takes the trailing False
        else:
            parts.append(numbers(pc.fill_null(pc.equal(chunk, scalar(value, chunk.type)), False)))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def dictionary_column(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    """A dictionary-encoded string column holding only the values in use; code -1 is null."""
    valid = codes >= 0
    used = np.zeros(len(values), dtype=bool)
    used[codes[valid]] = True
    remap = np.cumsum(used, dtype=np.int64) - 1
    if not values:  # all null (a run without op shapes): nothing to look up
        remap = np.zeros(1, dtype=np.int64)
    compact = np.where(valid, remap[np.maximum(codes, 0)], 0).astype(np.int32)
    kept = [v for v, keep in zip(values, used.tolist(), strict=True) if keep]
    indices = arrow(compact, pa.int32(), mask=~valid)
    return pa.DictionaryArray.from_arrays(indices, arrow(kept, pa.string()))
