"""Collectives as edges of the replay across ranks (``xsp.analysis.replay``, step 1's last edge).

A collective on a rank ends once every rank has arrived, plus its own transfer. Each rank of an
iteration is a step of its own in the replay; the collectives join them:

- **Arrival** is the rank's c10d call (``c10d::allreduce_``), as ``collective_skew`` has it; the
  k-th call of an iteration is the same collective on every rank.
- **Work** is the backend's range that holds the transfer, gloo's (``gloo:all_reduce``, on its own
  thread), paired with its call as the framework conversion pairs them (the k-th work range of an
  operation with the k-th call). It ends at ``max(last arrival, its own start) + transfer``, where
  the transfer is what the deep run measured after the last rank arrived.
- **Waits.** A host thread waits for its rank's work where it sat idle when the work ended: the
  untraced gap before the span it resumed with (DDP's reducer after backward; the op that reads a
  synchronous all-reduce's result). The replay treats that gap as a sync on the works its thread
  called before it, keeping the time it took after the last of them ended (waking up).
- **NCCL** (a G run): the work is the collective's kernel (the first NCCL kernel under its c10d
  call), and a rank arrives when that kernel starts on its GPU, where it spins until every rank's
  has: it ends at ``max(last arrival, its own start) + transfer``. Streams wait for it through the
  events c10d records, as for any kernel. (Checked on a hand-worked store only: no machine with
  two GPUs was lent yet.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.store import text_matches, texts
from xsp.core import collectives, schema
from xsp.core.columns import numbers
from xsp.core.intervals import inherit

__all__ = [
    "GPU_WORK_PREFIX",
    "HOST_WORK_PREFIXES",
    "CollectiveWait",
    "Collectives",
    "find_collectives",
    "nccl_kernels",
    "no_collectives",
]

#: The backends whose work range is the transfer itself, on the host.
HOST_WORK_PREFIXES = ("gloo:",)
#: NCCL's kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_...`` in older
#: releases): the transfer on the GPU, spinning there until every rank's kernel has started.
GPU_WORK_PREFIX = "nccl"


@dataclass(frozen=True)
class CollectiveWait:
    """A host thread's wait for its rank's collectives: the untraced gap from the end of
    ``after`` (-1: the step's start) to the start of ``resume``, awaiting ``works`` (indices into
    ``Collectives.work``); ``wake_ns`` is what it took after the last of them ended, kept in the
    replay as a sync's own cost."""

    after: int
    resume: int
    works: np.ndarray
    wake_ns: int


@dataclass(frozen=True)
class Collectives:
    """The deep run's collectives: each work range (row) with its call, the collective across
    ranks it belongs to (``group``: -1 where one rank alone has it) and its measured transfer
    and wait; each step's waits for them."""

    work: np.ndarray
    call: np.ndarray
    on_gpu: np.ndarray  # the work is an NCCL kernel (arriving at its own start), not gloo's range
    group: np.ndarray
    transfer_ns: np.ndarray
    wait_ns: np.ndarray
    waits: dict[int, list[CollectiveWait]]  # step row -> its threads' waits, by resume time
    most_in_a_step: int  # works of the step with the most

    @property
    def linked(self) -> bool:
        """Whether any collective spans two ranks or more (else the steps replay alone)."""
        return bool((self.group >= 0).any())

    def last_arrivals(self, arrival: np.ndarray) -> np.ndarray:
        """Each work's last arrival across its ranks given each work's own (its call's start; an
        NCCL kernel's own start), indexed like ``work``; a work of no group keeps its own."""
        arrival = arrival.astype(np.int64, copy=True)
        grouped = self.group >= 0
        if grouped.any():
            last = np.full(int(self.group.max()) + 1, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(last, self.group[grouped], arrival[grouped])
            arrival[grouped] = last[self.group[grouped]]
        return arrival


def no_collectives() -> Collectives:
    empty = np.zeros(0, dtype=np.int64)
    return Collectives(empty, empty, empty.astype(bool), empty, empty, empty, {}, 0)


def nccl_kernels(names: pa.ChunkedArray, gpu: np.ndarray) -> np.ndarray:
    """Which rows are NCCL's kernels (the G run's activities named ``nccl...``)."""
    return gpu & text_matches(names, partial(pc.starts_with, pattern=GPU_WORK_PREFIX))


def find_collectives(
    deep: pa.Table,
    parent: np.ndarray,
    depth: np.ndarray,
    owner: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    gpu: np.ndarray,
    nccl: np.ndarray,
) -> Collectives:
    """The collectives of the deep run (its rows, raw times; ``nccl``: its NCCL kernels),
    matched across the ranks of each iteration, with each step's waits for them."""
    kind = texts(deep.column("kind"))
    is_collective = kind == schema.KIND_COLLECTIVE
    if not is_collective.any() or "rank" not in deep.column_names:
        return no_collectives()
    names = deep.column("name")

    def starting(*prefixes: str) -> np.ndarray:
        found = np.zeros(len(kind), dtype=bool)
        for prefix in prefixes:
            found |= text_matches(names, partial(pc.starts_with, pattern=prefix))
        return is_collective & found

    is_call, is_work = starting(collectives.CALL_PREFIX), starting(*HOST_WORK_PREFIXES)
    iteration = numbers(deep.column("iteration"), null=-1).astype(np.int64, copy=False)
    operation = np.full(len(kind), "", dtype=object)
    rows = np.nonzero(is_collective)[0]
    operation[rows] = [collectives.operation(str(n)) or "" for n in texts(names.take(rows))]
    calls = _numbered(np.nonzero(is_call)[0], owner, start, operation)
    works = _numbered(np.nonzero(is_work)[0], owner, start, operation)
    by_key = {key: row for row, key in calls.items()}
    work_rows, call_rows = [], []
    for row, key in works.items():
        called = by_key.get(key)
        if called is not None:
            work_rows.append(row)
            call_rows.append(called)
    kernels, their_calls = _first_kernels(nccl, parent, depth, is_call, start)
    if not work_rows and not len(kernels):
        return no_collectives()
    work = np.concatenate((np.asarray(work_rows, np.int64), kernels))
    call = np.concatenate((np.asarray(call_rows, np.int64), their_calls))
    on_gpu = np.arange(len(work)) >= len(work_rows)
    # the same collective on every rank: the k-th call of its rank's iteration
    ordinal = _ordinals(np.nonzero(is_call)[0], owner, start)
    keys = np.stack([iteration[call], ordinal[call]], axis=1)
    _, group, count = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    group = np.where(count[group] > 1, group, -1)
    most = int(np.unique(owner[work], return_counts=True)[1].max())
    zeros = np.zeros(len(work), np.int64)
    arrival = np.where(on_gpu, start[work], start[call])
    last = Collectives(work, call, on_gpu, group, zeros, zeros, {}, most).last_arrivals(arrival)
    wait = np.clip(last - start[work], 0, dur[work])
    thread = numbers(deep.column("thread_id"), null=-1).astype(np.int64, copy=False)
    waits = _waits(work, call, ~on_gpu, owner, start, dur, gpu, thread, is_work, kind)
    return Collectives(work, call, on_gpu, group, dur[work] - wait, wait, waits, most)


def _first_kernels(
    nccl: np.ndarray, parent: np.ndarray, depth: np.ndarray, is_call: np.ndarray, start: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(each c10d call's first NCCL kernel, that call): the kernel's nearest c10d ancestor, up
    through its launch call and NCCL's own range."""
    kernels = np.nonzero(nccl)[0]
    up = inherit(np.where(is_call, np.arange(len(is_call)), -1), parent, depth)[kernels]
    found = up >= 0
    kernels, calls = kernels[found], up[found]
    by_start = np.argsort(start[kernels], kind="stable")
    kernels, calls = kernels[by_start], calls[by_start]
    _, first = np.unique(calls, return_index=True)  # each call's earliest
    return kernels[first], calls[first]


def _numbered(
    rows: np.ndarray, owner: np.ndarray, start: np.ndarray, operation: np.ndarray
) -> dict[int, tuple[int, str, int]]:
    """Each row's (step, operation, k): the k-th of its operation in its step, by start."""
    out: dict[int, tuple[int, str, int]] = {}
    seen: dict[tuple[int, str], int] = {}
    for row in rows[np.lexsort((start[rows], owner[rows]))].tolist():
        key = (int(owner[row]), str(operation[row]))
        seen[key] = seen.get(key, 0) + 1
        out[row] = (*key, seen[key])
    return out


def _ordinals(rows: np.ndarray, owner: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each call's place among its step's calls (by start); -1 elsewhere."""
    ordinal = np.full(len(owner), -1, dtype=np.int64)
    order = rows[np.lexsort((start[rows], owner[rows]))]
    first = np.concatenate(([True], owner[order][1:] != owner[order][:-1]))
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    ordinal[order] = np.arange(len(order)) - run_start
    return ordinal


def _waits(
    work: np.ndarray,
    call: np.ndarray,
    on_host: np.ndarray,
    owner: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    gpu: np.ndarray,
    thread: np.ndarray,
    is_work: np.ndarray,
    kind: np.ndarray,
) -> dict[int, list[CollectiveWait]]:
    """Each step's waits: for each work, the calling thread's gap in which it ended (the thread
    had no span open then), awaiting every work that thread called before the gap, that ended
    before the thread resumed (a range gloo closed later was not what it waited for) and that
    no earlier wait awaits (DDP's reducer waits for all its buckets at once)."""
    end = start + dur
    host = ~gpu & ~is_work & (kind != schema.KIND_STEP)
    waits: dict[int, list[CollectiveWait]] = {}
    for step in np.unique(owner[work[on_host]]).tolist():
        mine = np.nonzero((owner[work] == step) & on_host)[0]
        by_resume: dict[int, tuple[int, list[int]]] = {}
        for t in np.unique(thread[call[mine]]).tolist():
            rows = np.nonzero(host & (owner == step) & (thread == t))[0]
            rows = rows[np.argsort(start[rows], kind="stable")]
            if not len(rows):
                continue
            reach = np.maximum.accumulate(end[rows])  # the thread's busy-until, by start
            for w in mine[thread[call[mine]] == t].tolist():
                ends = int(end[work[w]])
                at = int(np.searchsorted(start[rows], ends, side="left"))
                if at >= len(rows) or (at > 0 and reach[at - 1] > ends):
                    continue  # busy when it ended, or nothing followed: no wait for it
                resume = int(rows[at])
                after = int(rows[np.argmax(end[rows[:at]])]) if at > 0 else -1
                by_resume.setdefault(resume, (after, []))
        if not by_resume:
            continue
        taken = np.zeros(len(mine), dtype=bool)
        found = []
        for resume in sorted(by_resume, key=lambda r: int(start[r])):
            after, _ = by_resume[resume]
            gap_start = int(end[after]) if after >= 0 else int(start[step])
            awaited = (
                ~taken
                & (thread[call[mine]] == thread[resume])
                & (start[call[mine]] < gap_start + 1)
                & (end[work[mine]] <= start[resume])
            )
            taken |= awaited
            rows_awaited = mine[awaited]
            if not len(rows_awaited):
                continue
            done = max(int(end[work[rows_awaited]].max()), gap_start)
            wake = int(np.clip(int(start[resume]) - done, 0, int(start[resume]) - gap_start))
            found.append(CollectiveWait(after, resume, rows_awaited, wake))
        waits[int(step)] = found
    return waits
