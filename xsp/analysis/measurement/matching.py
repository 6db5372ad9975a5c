"""Spans of different level-set runs matched by structure: the keys the reconstruction, the
replay and the overhead analysis join runs on, and which run measures each level.

A span's structural key hashes its iteration and its path of (name, ordinal among same-named
siblings by start time) from the root, so repeated identical kernels keep distinct keys, which
matching by name alone (XSP's original code) merged.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.derived import DerivedPer
from xsp.analysis.measurement.store import MeasurementStore, parent_rows
from xsp.core.columns import numbers
from xsp.core.intervals import break_cycles, depths

__all__ = [
    "STRUCTURAL_KEYS",
    "TREE_DEPTHS",
    "keyed",
    "level_sources",
    "roots",
    "structural_keys",
    "tree_depths",
]

_MULT = np.uint64(0x9E3779B97F4A7C15)


def _name_hashes(names: pa.Array) -> np.ndarray:
    """A stable 64-bit hash of each row's name (hashed once per distinct name)."""
    encoded = names.dictionary_encode() if not pa.types.is_dictionary(names.type) else names
    values = [
        int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8).digest(), "little")
        for v in encoded.dictionary.to_pylist()
    ]
    table = np.array(values or [0], dtype=np.uint64)
    return table[numbers(encoded.indices, null=0).astype(np.int64, copy=False)]


def structural_keys(
    table: pa.Table, parent: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(key, parent row) per span: the key hashes the span's iteration and its path of
    (name, ordinal among same-named siblings by start time) from the root, so repeated
    identical kernels keep distinct keys. Vectorized: one pass per tree depth. ``parent``:
    ``parent_rows(table)``, where the caller has them (the store finds them at open)."""
    start = numbers(table.column("start_ns")).astype(np.int64, copy=False)
    names = _name_hashes(table.column("name").combine_chunks())
    if parent is None:
        parent = parent_rows(table)
    # ordinal among siblings of the same name, by start time
    order = np.lexsort((start, names, parent))
    same = np.zeros(len(order), dtype=bool)
    if len(order) > 1:
        same[1:] = (parent[order][1:] == parent[order][:-1]) & (
            names[order][1:] == names[order][:-1]
        )
    run_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(order))))
    ordinal = np.empty(len(order), dtype=np.uint64)
    ordinal[order] = (np.arange(len(order)) - run_start).astype(np.uint64)
    iteration = numbers(table.column("iteration"), null=-1).astype(np.int64, copy=False)
    key = np.zeros(len(order), dtype=np.uint64)
    depth = depths(parent)
    with np.errstate(over="ignore"):
        for level in range(int(depth.max()) + 1 if len(depth) else 0):
            rows = np.nonzero(depth == level)[0]
            if level == 0:  # roots: the iteration alone (trace titles name the level set)
                mixed = (iteration[rows].astype(np.uint64) + np.uint64(1)) * _MULT
            else:
                mixed = (key[parent[rows]] ^ names[rows]) * _MULT + ordinal[rows]
            key[rows] = mixed ^ (mixed >> np.uint64(29))
    return key, parent


def keyed(store: MeasurementStore, index: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """(spans, structural keys, parent rows) of run ``index``, computed once per store."""
    return STRUCTURAL_KEYS.of(store, index)


def tree_depths(store: MeasurementStore, index: int) -> np.ndarray:
    """Each row's depth in run ``index``'s span tree (``keyed``'s parents), computed once per
    store: the replay, its host timeline and the FLOP count walk the same tree."""
    return TREE_DEPTHS.of(store, index)


def level_sources(store: MeasurementStore) -> tuple[list[tuple[int, Any]], dict[str, int]]:
    """Runs by depth, and for each level the run that measures it with the fewest levels."""
    runs = sorted(enumerate(store.runs), key=lambda item: len(item[1].levels))
    source_of: dict[str, int] = {}
    for index, run in runs:
        for name in run.level_set.timed_levels:  # H (counters) times nothing
            source_of.setdefault(name, index)
    return runs, source_of


def roots(parent: np.ndarray) -> np.ndarray:
    """Each row's root: follow parents up until none is left, by pointer jumping (a row takes
    the row its ancestor points at: log2(depth) rounds). A row on a cycle of parents is a
    root (``break_cycles``)."""
    root = np.where(parent >= 0, parent, np.arange(len(parent)))
    rounds = len(parent).bit_length()  # past the root of any chain: more is a cycle
    while len(alive := np.nonzero(root[root] != root)[0]):
        if rounds == 0:
            return roots(break_cycles(parent)[0])
        rounds -= 1
        root[alive] = root[root[alive]]
    return root


def _structural_keys(
    store: MeasurementStore, index: int
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    spans = store.run_spans(index)
    return (spans, *structural_keys(spans, store.parents(index)))


def _tree_depths(store: MeasurementStore, index: int) -> np.ndarray:
    return depths(keyed(store, index)[2])


#: Run ``index``'s spans with their structural keys and parent rows (``keyed``).
STRUCTURAL_KEYS = DerivedPer("structural_keys", _structural_keys)
#: Each span's depth in run ``index``'s span tree (``tree_depths``).
TREE_DEPTHS = DerivedPer("tree_depths", _tree_depths, needs=("structural_keys",))
