"""The counter run's kernels paired with the G run's, by structure (``xsp.analysis.tables.counters``,
algorithm notes 1 and 2): within each iteration in launch order, as a diff of their own function
names (and launch shapes where both sides recorded them)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from xsp.core.counter_names import kernel_base, kernel_key

__all__ = ["Alignment", "align_kernels", "iteration_of", "keyed"]


@dataclass(frozen=True)
class Alignment:
    """Counter-run kernels paired with G-run kernels: ``pairs`` maps a G row's index to its
    counter row's; ``matching`` says per counted iteration what matched and what did not."""

    pairs: dict[int, int]
    matching: pa.Table


def keyed(rows: Iterable[Mapping[str, object]], name: str) -> list[tuple[int, str, int]]:
    """(iteration, key, ordinal among same-key kernels of the iteration) per row, rows given in
    launch order within each iteration; the key is ``kernel_key`` of the row's ``name``."""
    seen: dict[tuple[int, str], int] = {}
    out = []
    for row in rows:
        key = kernel_key(str(row[name]))
        it = iteration_of(row)
        ordinal = seen.get((it, key), 0)
        seen[(it, key)] = ordinal + 1
        out.append((it, key, ordinal))
    return out


def iteration_of(row: Mapping[str, object]) -> int:
    """A row's iteration (the rows are those of two tables: open records)."""
    value = row["iteration"]
    if not isinstance(value, (int, float)):
        raise TypeError(f"iteration {value!r} is not a number")
    return int(value)


def _by_iteration(rows: Sequence[Mapping[str, object]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        out.setdefault(iteration_of(row), []).append(index)
    return out


def _tokens(
    rows: Sequence[Mapping[str, object]], indices: list[int], name: str, shapes: bool
) -> list[tuple[str, ...]]:
    if shapes:
        return [
            (kernel_base(str(rows[i][name])), str(rows[i]["grid"]), str(rows[i]["block"]))
            for i in indices
        ]
    return [(kernel_base(str(rows[i][name])),) for i in indices]


def _pairs(a: list[tuple[str, ...]], b: list[tuple[str, ...]]) -> list[tuple[int, int]]:
    """Positions of ``a`` and ``b`` that align: the common prefix and suffix, then difflib's
    matching blocks in between (the usual case, identical sequences, costs one pass)."""
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    pairs = [(i, i) for i in range(head)]
    middle_a, middle_b = a[head : len(a) - tail], b[head : len(b) - tail]
    if middle_a and middle_b:
        matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
        for block in matcher.get_matching_blocks():
            pairs += [(head + block.a + k, head + block.b + k) for k in range(block.size)]
    pairs += [(len(a) - tail + k, len(b) - tail + k) for k in range(tail)]
    return pairs


def align_kernels(
    gpu: Sequence[Mapping[str, object]], counted: Sequence[Mapping[str, object]]
) -> Alignment:
    """Pair the counter run's kernels (rows with ``iteration``, ``kernel``, optional ``grid``
    and ``block``) with the G run's (``name`` instead of ``kernel``), each list in launch order
    within an iteration, iteration by iteration (see the module notes), and say per counted
    iteration how many matched, how many of those the tools spell differently, what either
    side has alone, and the first kernel of each that the other lacks."""
    g_by, c_by = _by_iteration(gpu), _by_iteration(counted)
    pairs: dict[int, int] = {}
    rows = []
    for it in sorted(c_by):
        g, c = g_by.get(it, []), c_by[it]
        shapes = all(gpu[i].get("grid") and gpu[i].get("block") for i in g) and all(
            counted[i].get("grid") and counted[i].get("block") for i in c
        )
        matched = _pairs(_tokens(gpu, g, "name", shapes), _tokens(counted, c, "kernel", shapes))
        for gi, ci in matched:
            pairs[g[gi]] = c[ci]
        got_g, got_c = {gi for gi, _ in matched}, {ci for _, ci in matched}
        only_g = [g[i] for i in range(len(g)) if i not in got_g]
        only_c = [c[i] for i in range(len(c)) if i not in got_c]
        spelled = sum(
            1
            for gi, ci in matched
            if kernel_key(str(gpu[g[gi]]["name"])) != kernel_key(str(counted[c[ci]]["kernel"]))
        )
        rows.append(
            {
                "iteration": it,
                "gpu_run_kernels": len(g),
                "counter_run_kernels": len(c),
                "matched": len(matched),
                "spelled_differently": spelled,
                "only_in_gpu_run": len(only_g),
                "only_in_counter_run": len(only_c),
                "first_only_in_gpu_run": kernel_key(str(gpu[only_g[0]]["name"]))
                if only_g
                else None,
                "first_only_in_counter_run": kernel_key(str(counted[only_c[0]]["kernel"]))
                if only_c
                else None,
            }
        )
    return Alignment(pairs, pa.Table.from_pylist(rows, schema=_MATCHING_SCHEMA))


_MATCHING_SCHEMA = pa.schema(
    [
        ("iteration", pa.int64()),
        ("gpu_run_kernels", pa.int64()),
        ("counter_run_kernels", pa.int64()),
        ("matched", pa.int64()),
        ("spelled_differently", pa.int64()),
        ("only_in_gpu_run", pa.int64()),
        ("only_in_counter_run", pa.int64()),
        ("first_only_in_gpu_run", pa.string()),
        ("first_only_in_counter_run", pa.string()),
    ]
)
