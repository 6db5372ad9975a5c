"""Nesting of time intervals recorded by a stack (profiler ranges on one thread, NVTX ranges).

Ranges opened and closed by a stack on one thread are properly nested, so the parent of a range is
exact, not a guess: after sorting a thread's ranges by (start ascending, end descending), the parent
of range i is the nearest earlier range whose end is not before i's end (a "previous greater or
equal element" on the ends). This module finds it for all ranges at once with a sparse table of
range maxima, in O(n log n) numpy operations, so that conversion runs at C speed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["break_cycles", "depths", "find_rows", "inherit", "nest", "order_by", "stab"]


def nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Return, for each interval, the index of its innermost enclosing interval on the same
    thread, or -1 when none encloses it. Identical intervals nest in input order (the earlier one
    is the parent), which is how a stack records an op that wraps another of equal duration."""
    n = len(start)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    order = np.lexsort((np.arange(n), -end, start, thread))
    ends = end[order]
    threads = thread[order]
    # First sorted position of each interval's thread: the search never crosses it.
    is_first = np.ones(n, dtype=bool)
    is_first[1:] = threads[1:] != threads[:-1]
    thread_start = np.maximum.accumulate(np.where(is_first, np.arange(n), 0))

    # Doubling search: after step k, ``pos`` is the leftmost position such that no end in
    # [pos, i) is >= ends[i], found with blocks of 2**k precomputed maxima (a sparse table).
    pos = np.arange(n)
    table = [ends]
    while (1 << len(table)) <= n:
        prev, width = table[-1], 1 << (len(table) - 1)
        table.append(np.maximum(prev[:-width], prev[width:]))
    # Only intervals whose left neighbour ends before them need to search at all.
    active = np.nonzero((pos > thread_start) & (np.concatenate(([0], ends[:-1])) < ends))[0]
    cur = pos[active] - 0
    target = ends[active]
    floor = thread_start[active]
    for k in range(len(table) - 1, -1, -1):
        width = 1 << k
        lo = cur - width
        can = lo >= floor
        if not can.any():
            continue
        block = table[k][np.clip(lo, 0, len(table[k]) - 1)]
        jump = can & (block < target)
        cur = np.where(jump, lo, cur)
    pos[active] = cur
    found = pos - 1
    sorted_parent = np.where(found >= thread_start, found, -1)
    parent[order] = np.where(sorted_parent >= 0, order[np.maximum(sorted_parent, 0)], -1)
    return parent


def stab(
    thread: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    point_thread: np.ndarray,
    point_time: np.ndarray,
) -> np.ndarray:
    """For each point, the index of the innermost interval on its thread that contains it (start
    and end included), or -1; the intervals nest as ``nest`` says. Memory stays linear in the
    intervals: the last interval on the point's thread that starts at or before it is the
    innermost candidate, and an ancestor of it is the answer when it ended before the point."""
    n = len(start)
    found = np.full(len(point_time), -1, dtype=np.int64)
    if n == 0 or len(point_time) == 0:
        return found
    parent = nest(thread, start, end)
    order = np.lexsort((np.arange(n), -end, start, thread))  # nest's order: innermost last
    threads, starts = thread[order], start[order]
    for th in np.unique(point_thread):
        lo, hi = np.searchsorted(threads, th, side="left"), np.searchsorted(threads, th, "right")
        if lo == hi:
            continue
        points = np.nonzero(point_thread == th)[0]
        at = np.searchsorted(starts[lo:hi], point_time[points], side="right") - 1
        found[points] = np.where(at >= 0, order[lo + np.maximum(at, 0)], -1)
    ended = np.nonzero(found >= 0)[0]
    ended = ended[end[found[ended]] < point_time[ended]]
    if len(ended):
        found[ended] = _nearest_open_ancestor(parent, end, found[ended], point_time[ended])
    return found


def _nearest_open_ancestor(
    parent: np.ndarray, end: np.ndarray, rows: np.ndarray, times: np.ndarray
) -> np.ndarray:
    """For each of ``rows`` (an interval that ended before its time in ``times``), its nearest
    ancestor that had not ended by then, or -1. Ends never fall going up a chain of enclosing
    intervals, so the chain's ended part is found by binary lifting: jumps of 2**k ancestors,
    the longest first, in log2(depth) passes over the rows (climbing one parent a pass took
    depth passes: up to 9 ms a step of ResNet-50's critical path on the dev machine)."""
    n = len(parent)
    top = np.where(parent >= 0, parent, n)  # n: above every root, never ended
    ends = np.append(end, np.iinfo(np.int64).max)
    up = [np.append(top, n)]
    while (up[-1][:n] < n).any():
        up.append(up[-1][up[-1]])
    at = rows
    for jump in reversed(up):  # the furthest ancestor that still ended before the time
        further = jump[at]
        at = np.where(ends[further] < times, further, at)
    found = up[0][at]
    return np.where(found < n, found, -1)


def depths(parent: np.ndarray) -> np.ndarray:
    """Depth of each node in a forest given by parent indices (-1 for roots). By pointer
    jumping: each round, a node adds the depth its ancestor has reached and jumps to that
    ancestor's ancestor, so a tree of depth d takes log2(d) rounds, not d passes over it.
    Parents that form a cycle (stored data the checks let through) are read as roots, as
    ``break_cycles`` says, rather than climbed for ever."""
    depth = (parent >= 0).astype(np.int32)  # edges counted up to ``jump``
    jump = parent.astype(np.int64, copy=True)
    alive = np.nonzero(jump >= 0)[0]
    rounds = len(parent).bit_length()  # 2**rounds ancestors up is past the root of any chain
    while len(alive):
        if rounds == 0:  # still climbing: some parents form a cycle
            return depths(break_cycles(parent)[0])
        rounds -= 1
        up = jump[alive]
        depth[alive] += depth[up]  # both read before either is written: one round
        jump[alive] = jump[up]
        alive = alive[jump[alive] >= 0]
    return depth


def break_cycles(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``parent`` with each node on a cycle made a root, those nodes in ascending order): a
    node that is its own parent, or its parent's ancestor, has no root to reach. Their
    descendants keep their parents. By pointer jumping: after log2(n) + 1 rounds a node that
    still has an ancestor is on a cycle or below one, and the ancestor it reached is on the
    cycle; the reached ancestors of a cycle's nodes are the cycle's nodes, shifted along it."""
    jump = parent.astype(np.int64, copy=True)
    alive = np.nonzero(jump >= 0)[0]
    for _ in range(len(parent).bit_length()):
        if not len(alive):
            return parent, np.zeros(0, dtype=np.int64)
        jump[alive] = jump[jump[alive]]
        alive = alive[jump[alive] >= 0]
    on_cycle = np.unique(jump[alive])
    if not len(on_cycle):
        return parent, on_cycle
    broken = parent.copy()
    broken[on_cycle] = -1
    return broken, on_cycle


def inherit(
    values: np.ndarray, parent: np.ndarray, depth: np.ndarray, missing: int = -1
) -> np.ndarray:
    """Fill each ``missing`` entry with its nearest ancestor's value, top-down."""
    out = values.copy()
    for level in range(1, int(depth.max(initial=0)) + 1):
        rows = np.nonzero((depth == level) & (out == missing))[0]
        if len(rows):
            out[rows] = out[parent[rows]]
    return out


def find_rows(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query, the row of ``keys`` holding the same value (the first, in row order),
    -1 where none does: an id join (correlation ids, span ids, structural keys) in numpy.

    Both sides are sorted with numpy's default sort, not its stable one (five times faster on
    1M 64-bit keys), the first row of equal keys taken by a minimum over their run; and the
    queries are searched in sorted order (a binary search that starts where the last ended:
    fifteen times faster than in random order)."""
    if len(keys) == 0:
        return np.full(len(queries), -1, dtype=np.int64)
    order = np.argsort(keys)
    ordered = keys[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    runs = np.nonzero(first)[0]
    earliest = np.minimum.reduceat(order, runs)  # each run of equal keys: its first row
    asked = np.argsort(queries)
    slot = np.empty(len(queries), dtype=np.int64)
    slot[asked] = np.searchsorted(ordered, queries[asked])
    slot = np.minimum(slot, len(order) - 1)
    run = np.cumsum(first) - 1
    return np.where(ordered[slot] == queries, earliest[run[slot]], -1).astype(np.int64)


def order_by(major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """``np.lexsort((minor, major))`` for two integer keys: the rows by ``major``, then
    ``minor``, ties in row order. Where both keys' ranges fit one int64 it is a single stable
    argsort of the combined key, five times faster than lexsort's two passes on a step's host
    spans (the replay sorts each step's anew for every cost its fit tries); else (or for keys
    that are not integers) lexsort."""
    if not len(major):
        return np.zeros(0, dtype=np.int64)
    if major.dtype.kind not in "iu" or minor.dtype.kind not in "iu":
        return np.lexsort((minor, major))
    major = major.astype(np.int64, copy=False)
    minor = minor.astype(np.int64, copy=False)
    low_major, low_minor = int(major.min()), int(minor.min())
    width = int(minor.max()) - low_minor + 1
    if (int(major.max()) - low_major + 1) * width >= 1 << 62:
        return np.lexsort((minor, major))
    return np.argsort((major - low_major) * width + (minor - low_minor), kind="stable")
