"""Leveled reconstruction: one hierarchy per iteration, each span timed by the shallowest run that
measures its level (model latency from M, layers and ops from MF, library calls from MFL, kernels
from MFLG), plus the overhead each added level put on the levels above it.

Algorithm:
1. Every span of every run gets a structural key: its parent's key, its name and its ordinal among
   same-named siblings (by start time), under its iteration. Repeated identical kernels stay
   distinct, which matching by name alone (XSP's original code) merged.
2. The deepest run gives the hierarchy. A span of level L takes the duration of the span with the
   same key in the shallowest run that has level L; a span with no counterpart keeps its own and
   is reported as a mismatch (a structure that differs between runs is reported, not guessed).
3. Layout, top-down: children keep their durations and order; when a parent's duration is
   shorter than what the deep run measured, the gaps between its children (and at its edges)
   shrink in proportion to absorb the difference; when it is longer, the last gap grows.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

from analysis.store import MeasurementStore
from tracer import schema


def _keys(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """span_id -> structural key (iteration, (name, ordinal), (name, ordinal), ...)."""
    children: dict[int, list[dict[str, Any]]] = defaultdict(list)
    roots: list[dict[str, Any]] = []
    for row in rows:
        (children[row["parent_span_id"]] if row["parent_span_id"] else roots).append(row)
    keys: dict[int, tuple[Any, ...]] = {}
    stack: list[tuple[dict[str, Any], tuple[Any, ...]]] = [
        (root, (root["iteration"], ("step", 0))) for root in roots
    ]
    while stack:
        span, key = stack.pop()
        keys[span["span_id"]] = key
        seen: dict[str, int] = defaultdict(int)
        for child in sorted(children.get(span["span_id"], []), key=lambda r: r["start_ns"]):
            ordinal = seen[child["name"]]
            seen[child["name"]] += 1
            stack.append((child, (*key, (child["name"], ordinal))))
    return keys


def _rows(store: MeasurementStore, run_index: int) -> list[dict[str, Any]]:
    return store.sql(
        f"SELECT * EXCLUDE (run_index, levels) FROM spans WHERE run_index = {run_index}"
    ).to_pylist()


def reconstruct(store: MeasurementStore) -> tuple[pa.Table, pa.Table]:
    """(reconstructed spans following schema.SPAN_SCHEMA, mismatches: level, name, iteration)."""
    runs = sorted(enumerate(store.runs), key=lambda item: len(item[1].levels))
    deepest_index, _deepest = runs[-1]
    source_of: dict[str, int] = {}  # level -> the run measuring it with the fewest levels
    for index, run in runs:
        for letter in run.levels:
            source_of.setdefault(schema.LEVEL_BY_LETTER[letter], index)
    durations: dict[int, dict[tuple[Any, ...], int]] = {}
    for index in set(source_of.values()):
        rows = _rows(store, index)
        keys = _keys(rows)
        durations[index] = {keys[r["span_id"]]: r["dur_ns"] for r in rows if r["span_id"] in keys}
    rows = _rows(store, deepest_index)
    keys = _keys(rows)
    mismatches = []
    new_dur: dict[int, int] = {}
    for row in rows:
        accurate = durations[source_of[row["level"]]].get(keys.get(row["span_id"], ()))
        if accurate is None:
            mismatches.append(
                {"level": row["level"], "name": row["name"], "iteration": row["iteration"]}
            )
            accurate = row["dur_ns"]
        new_dur[row["span_id"]] = int(accurate)
    new_start = _layout(rows, new_dur)
    for row in rows:
        row["start_ns"] = new_start[row["span_id"]]
        row["dur_ns"] = new_dur[row["span_id"]]
    spans = pa.Table.from_pylist(rows, schema=schema.SPAN_SCHEMA)
    miss = pa.Table.from_pylist(
        mismatches,
        schema=pa.schema(
            [("level", pa.string()), ("name", pa.string()), ("iteration", pa.int32())]
        ),
    )
    return spans, miss


def _layout(rows: list[dict[str, Any]], new_dur: dict[int, int]) -> dict[int, int]:
    children: dict[int, list[dict[str, Any]]] = defaultdict(list)
    roots: list[dict[str, Any]] = []
    for row in rows:
        (children[row["parent_span_id"]] if row["parent_span_id"] else roots).append(row)
    start: dict[int, int] = {}
    stack: list[dict[str, Any]] = []
    for root in roots:
        start[root["span_id"]] = root["start_ns"]
        stack.append(root)
    while stack:
        parent = stack.pop()
        kids = sorted(children.get(parent["span_id"], []), key=lambda r: r["start_ns"])
        if not kids:
            continue
        # The gaps the deep run measured: before the first child, between children, after the last.
        edges = [parent["start_ns"]]
        gaps = []
        for kid in kids:
            gaps.append(max(0, kid["start_ns"] - edges[-1]))
            edges.append(max(edges[-1], kid["start_ns"] + kid["dur_ns"]))
        gaps.append(max(0, parent["start_ns"] + parent["dur_ns"] - edges[-1]))
        room = new_dur[parent["span_id"]] - sum(new_dur[k["span_id"]] for k in kids)
        total = sum(gaps)
        scale = min(1.0, max(0.0, room / total)) if total > 0 else 0.0
        cursor = start[parent["span_id"]]
        for kid, gap in zip(kids, gaps, strict=False):
            cursor += round(gap * scale)
            start[kid["span_id"]] = cursor
            cursor += new_dur[kid["span_id"]]
            stack.append(kid)
    return start


def level_overhead(store: MeasurementStore, trim: float = 0.1) -> pa.Table:
    """How much each deeper run inflated the spans of each level, against the run that measures
    that level with the fewest levels: level, run (its level set), spans, mean_added_ms,
    trimmed_mean_added_ms, p50_added_ms, p90_added_ms."""
    runs = sorted(enumerate(store.runs), key=lambda item: len(item[1].levels))
    source_of: dict[str, int] = {}
    for index, run in runs:
        for letter in run.levels:
            source_of.setdefault(schema.LEVEL_BY_LETTER[letter], index)
    keyed = {}
    for index, _ in runs:
        rows = _rows(store, index)
        keys = _keys(rows)
        keyed[index] = {
            (r["level"], keys[r["span_id"]]): r["dur_ns"] for r in rows if r["span_id"] in keys
        }
    out = []
    for level, source in source_of.items():
        for index, run in runs:
            if index == source or level not in {schema.LEVEL_BY_LETTER[c] for c in run.levels}:
                continue
            added = [
                (dur - keyed[source][key]) / 1e6
                for key, dur in keyed[index].items()
                if key[0] == level and key in keyed[source]
            ]
            if not added:
                continue
            values = np.sort(np.asarray(added))
            cut = int(len(values) * trim)
            trimmed = values[cut : len(values) - cut] if len(values) > 2 * cut else values
            out.append(
                {
                    "level": level,
                    "run": run.levels,
                    "spans": len(values),
                    "mean_added_ms": float(values.mean()),
                    "trimmed_mean_added_ms": float(trimmed.mean()),
                    "p50_added_ms": float(np.percentile(values, 50)),
                    "p90_added_ms": float(np.percentile(values, 90)),
                }
            )
    return pa.Table.from_pylist(out)
