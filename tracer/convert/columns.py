"""Column helpers that every conversion step shares."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


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
    indices = pa.array(compact, pa.int32(), mask=~valid)
    return pa.DictionaryArray.from_arrays(indices, pa.array(kept, pa.string()))
