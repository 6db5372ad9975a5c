from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from xsp.analysis.measurement.matching import roots
from xsp.core.intervals import (
    break_cycles,
    depths,
    find_rows,
    inherit,
    nest,
    order_by,
    stab,
)


def _stack_nesting(thread, start, end):  # type: ignore[no-untyped-def]
    """Reference: replay the ranges through a stack, thread by thread."""
    order = sorted(range(len(start)), key=lambda i: (thread[i], start[i], -end[i], i))
    parent = [-1] * len(start)
    stack: list[int] = []
    previous = None
    for i in order:
        if previous is not None and thread[i] != thread[previous]:
            stack = []
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
        previous = i
    return parent


def _random_ranges(rng: random.Random, limit: int):  # type: ignore[no-untyped-def]
    thread, start, end = [], [], []

    def fill(lo: int, hi: int, depth: int, tid: int) -> None:
        t = lo
        while t < hi and len(start) < limit:
            length = rng.randint(0, hi - t)
            if length == 0:
                return
            thread.append(tid), start.append(t), end.append(t + length)
            if depth < 6 and rng.random() < 0.6:
                fill(t, t + length, depth + 1, tid)
            t += length + rng.randint(0, 3)

    for tid in range(3):
        fill(0, 10_000, 0, tid)
    return np.array(thread), np.array(start), np.array(end)


def test_nesting_matches_a_stack_replay_on_random_ranges() -> None:
    rng = random.Random(7)
    for _ in range(200):
        thread, start, end = _random_ranges(rng, rng.randint(1, 150))
        perm = np.random.default_rng(rng.randint(0, 10**6)).permutation(len(start))
        thread, start, end = thread[perm], start[perm], end[perm]
        assert nest(thread, start, end).tolist() == _stack_nesting(thread, start, end)


def test_nesting_cases_worked_by_hand() -> None:
    # 0 [0,100] contains 1 [10,50] which contains 2 [10,50] (same bounds: the first is parent);
    # 3 [50,60] starts where 1 ends and is a sibling of 1; 4 is on another thread.
    thread = np.array([1, 1, 1, 1, 2])
    start = np.array([0, 10, 10, 50, 20])
    end = np.array([100, 50, 50, 60, 30])
    parent = nest(thread, start, end)
    assert parent.tolist() == [-1, 0, 1, 0, -1]
    depth = depths(parent)
    assert depth.tolist() == [0, 1, 2, 1, 0]
    values = np.array([7, -1, -1, 9, -1])
    assert inherit(values, parent, depth).tolist() == [7, 7, 7, 9, -1]
    assert nest(np.array([]), np.array([]), np.array([])).tolist() == []


def test_points_land_in_the_innermost_interval_of_their_thread() -> None:
    # thread 1: op 0 [0, 100] holds op 1 [10, 40] and op 2 [50, 60]; thread 2: op 3 [0, 100]
    thread = np.array([1, 1, 1, 2])
    start = np.array([0, 10, 50, 0])
    end = np.array([100, 40, 60, 100])
    point_thread = np.array([1, 1, 1, 1, 1, 2, 3, 1, 1])
    point_time = np.array([5, 10, 40, 45, 55, 55, 55, 100, 101])
    # 45 lies after op 1 ended: its ancestor op 0 holds it; thread 3 has no interval; 101 is
    # after every interval; both ends of an interval belong to it
    assert stab(thread, start, end, point_thread, point_time).tolist() == [
        0,
        1,
        1,
        0,
        2,
        3,
        -1,
        0,
        -1,
    ]


def test_stabbing_points_agrees_with_nesting_them_as_empty_intervals() -> None:
    rng = random.Random(7)
    for _ in range(50):
        thread, start, end = _random_ranges(rng, 80)
        times = np.array([rng.randint(0, 10_000) for _ in range(40)])
        threads = np.array([rng.choice([0, 1, 2]) for _ in range(40)])
        both = nest(
            np.concatenate([thread, threads]),
            np.concatenate([start, times]),
            np.concatenate([end, times]),
        )
        expected = both[len(start) :].copy()
        for k in range(len(expected)):  # a point nested in an equal point: walk up to a range
            while expected[k] >= len(start):
                expected[k] = both[expected[k]]
        assert stab(thread, start, end, threads, times).tolist() == expected.tolist()


def test_a_point_past_the_ends_of_a_deep_chain_lands_in_the_deepest_open_ancestor() -> None:
    """A chain of 64 intervals, each inside the one before (interval i spans [i, 1000 - 10 i]),
    on two threads: a point at t lies in every interval with i <= t <= 1000 - 10 i, and the
    innermost is the largest such i, however many ended intervals it climbs past (the climb
    jumps by powers of two)."""
    depth = 64
    start = np.tile(np.arange(depth), 2)
    end = np.tile(1000 - 10 * np.arange(depth), 2)
    thread = np.repeat([0, 1], depth)
    times = np.arange(0, 1010, 7)
    points = np.concatenate([times, times])
    point_thread = np.repeat([0, 1], len(times))
    expected = []
    for t, th in zip(points.tolist(), point_thread.tolist(), strict=True):
        inside = [i for i in range(depth) if i <= t <= 1000 - 10 * i]
        expected.append(th * depth + max(inside) if inside else -1)
    assert stab(thread, start, end, point_thread, points).tolist() == expected
    assert expected[times.tolist().index(504)] == 49  # past the 14 that ended: [49, 510]
    assert expected[times.tolist().index(700)] == 30 and expected[-1] == -1  # [30, 700]; none


def test_order_by_sorts_as_lexsort_does_ties_in_row_order_and_any_range() -> None:
    """Rows by the major key, then the minor, equal pairs in row order: lexsort's order, whether
    the keys' ranges fit one combined int64 key (times in ns within a step, negative minors) or
    not (epoch nanoseconds against a minor of 2**40, which falls back to lexsort), and for float
    keys, which a combined integer key would truncate (0.1 and 0.2 both 0)."""
    rng = np.random.default_rng(3)
    for low, high in ((0, 50), (-(10**6), 10**6), (1_700_000_000 * 10**9, 1_700_000_001 * 10**9)):
        major = rng.integers(low, high, 2000)
        minor = rng.integers(-(2**40), 2**40, 2000) if low > 10**12 else rng.integers(-5, 5, 2000)
        assert order_by(major, minor).tolist() == np.lexsort((minor, major)).tolist()
    major, minor = np.array([3, 1, 3, 1, 2]), np.array([0, 7, 0, -7, 1])
    assert order_by(major, minor).tolist() == [3, 1, 4, 0, 2]  # rows 0 and 2 tie: row order
    assert order_by(major, minor + 0.5).tolist() == [3, 1, 4, 0, 2]  # floats: lexsort itself
    assert order_by(major, np.array([0.2, 0, 0.1, 0, 0])).tolist() == [1, 3, 4, 2, 0]
    assert order_by(np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []


def _random_forest(rng: np.random.Generator, n: int) -> np.ndarray:
    """Parent rows of a random forest, rows in no particular order (a child may come first)."""
    order = rng.permutation(n)
    parent = np.full(n, -1, dtype=np.int64)
    for k in range(1, n):
        if rng.random() < 0.9:  # else a new root
            parent[order[k]] = order[rng.integers(max(0, k - 20), k)]
    return parent


def test_depths_and_inheritance_match_a_walk_up_each_row() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        parent = _random_forest(rng, int(rng.integers(0, 400)))
        values = np.where(rng.random(len(parent)) < 0.1, rng.integers(0, 9, len(parent)), -1)
        walked_depth, walked_value = [], []
        for row in range(len(parent)):
            depth, up, value = 0, parent[row], values[row]
            while up >= 0:
                depth += 1
                value = values[up] if value == -1 else value
                up = parent[up]
            walked_depth.append(depth)
            walked_value.append(value)
        depth = depths(parent)
        assert depth.tolist() == walked_depth
        assert inherit(values, parent, depth).tolist() == walked_value


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail with TimeoutError where the block runs longer (a walk that loops for ever)."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_parent_cycles_are_read_as_roots() -> None:
    # 0 <- 1; 2 is its own parent, 3 its child; 4 <-> 5, 6 a child of 5, 7 of 6; 8 -> 9 -> 10 -> 8
    parent = np.array([-1, 0, 2, 2, 5, 4, 5, 6, 9, 10, 8])
    with within(1.0):
        broken, on_cycle = break_cycles(parent)
        depth = depths(parent)
        root = roots(parent)
    assert on_cycle.tolist() == [2, 4, 5, 8, 9, 10]
    assert broken.tolist() == [-1, 0, -1, 2, -1, -1, 5, 6, -1, -1, -1]
    assert depth.tolist() == [0, 1, 0, 1, 0, 0, 1, 2, 0, 0, 0]
    assert root.tolist() == [0, 0, 2, 2, 4, 5, 5, 5, 8, 9, 10]
    forest = np.array([-1, 0, 1, -1, 3])
    assert break_cycles(forest)[0] is forest and not len(break_cycles(forest)[1])


def test_find_rows_gives_the_first_row_of_a_repeated_key() -> None:
    rng = np.random.default_rng(5)
    for _ in range(100):
        keys = rng.integers(0, 50, int(rng.integers(0, 300))).astype(np.uint64)
        queries = rng.integers(0, 60, int(rng.integers(0, 300))).astype(np.uint64)
        first: dict[int, int] = {}
        for row, key in enumerate(keys.tolist()):
            first.setdefault(key, row)
        assert find_rows(keys, queries).tolist() == [first.get(q, -1) for q in queries.tolist()]
