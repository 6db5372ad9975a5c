"""The step's dependency graph (``xsp.analysis.replay``, steps 1 and 2): the deep run's spans as
arrays, the edges the replay follows (launches, stream order, event waits, syncs, collectives)
and the device-side delays the deep run measured, built once per store and never written to."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from xsp.analysis.measurement.matching import keyed, tree_depths
from xsp.analysis.measurement.store import MeasurementStore, text_in, texts
from xsp.analysis.replay.causes import span_causes
from xsp.analysis.replay.collectives import Collectives, find_collectives, nccl_kernels
from xsp.analysis.replay.host_timeline import Calibration, host_timeline, owning_steps
from xsp.core import schema
from xsp.core.columns import numbers

__all__ = ["RECORD_CALLS", "SYNC_CALLS", "WAIT_CALLS", "Graph", "Named", "build_graph", "with_cost"]

#: CUDA calls that block the host until GPU work has ended (a blocking copy waits for its own copy
#: and the work queued before it; a stream or event sync for the work of the stream or event it
#: names, where level L recorded it, else for every stream).
SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoD_v2",
        "cuMemcpy",
    }
)
#: A stream's wait on an event (the cross-stream edge: the waiting stream's later work starts
#: once the work queued on the event's stream before its record has ended), and the record.
WAIT_CALLS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"})
RECORD_CALLS = frozenset(
    {
        "cudaEventRecord",
        "cudaEventRecordWithFlags",
        "cuEventRecord",
        "cuEventRecord_ptsz",
        "cuEventRecordWithFlags",
        "cuEventRecordWithFlags_ptsz",
    }
)


@dataclass(frozen=True)
class Named:
    """What level L's CUDA calls name (-1: nothing): the stream a sync, stream wait or event
    record names, and its event; which calls are waits and which are records."""

    stream: np.ndarray
    event: np.ndarray
    is_wait: np.ndarray
    is_record: np.ndarray


@dataclass(frozen=True)
class Graph:
    """What every replay of a store shares (steps 1 and 2): the deep run's spans as arrays, each
    step's rows and the measured device delays; built once per store, never written to: the
    replay and each what-if copy what they edit."""

    deep_index: int
    deep: pa.Table
    parent: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    warped_start: np.ndarray
    warped_end: np.ndarray
    calibration: Calibration
    is_call: np.ndarray  # CUDA runtime and driver calls (what launches an activity)
    gpu: np.ndarray
    is_sync: np.ndarray
    steps: np.ndarray
    owner: np.ndarray
    members: list[np.ndarray]  # each step's rows
    base: np.ndarray
    causes: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    lane: np.ndarray  # each activity's (device, stream) as a number (-1: not an activity)
    named: Named
    latency: np.ndarray
    gap: np.ndarray
    iteration: np.ndarray
    collectives: Collectives  # collectives across ranks (gloo's, NCCL's), the host's waits


def with_cost(store: MeasurementStore, graph: Graph, factor: float) -> Graph:
    """``graph`` with the host's times under the probe's cost times ``factor``."""
    if factor == 1.0:  # only the host's times change with the cost
        return graph
    scaled = graph.calibration.scaled(factor, "fitted")
    _, warped_start, warped_end, _ = host_timeline(store, scaled)
    return replace(graph, warped_start=warped_start, warped_end=warped_end)


def build_graph(store: MeasurementStore) -> Graph:
    """The graph with the host timeline under the probe's cost (as checked)."""
    deep_index, warped_start, warped_end, calib = host_timeline(store)
    deep, _, parent = keyed(store, deep_index)
    start = numbers(deep.column("start_ns")).astype(np.int64, copy=False)
    dur = numbers(deep.column("dur_ns")).astype(np.int64, copy=False)
    level = texts(deep.column("level"))
    kind = texts(deep.column("kind"))
    names = deep.column("name")
    gpu = level == schema.LEVEL_GPU
    is_sync = (level == schema.LEVEL_LIBRARY) & text_in(names, SYNC_CALLS)
    steps = np.nonzero(kind == schema.KIND_STEP)[0]
    owner = owning_steps(parent, kind)  # a multi-rank iteration's ranks: a step each
    base = _sync_base(start, dur, parent, owner, gpu, is_sync)
    communicating = nccl_kernels(names, gpu)  # NCCL's kernels: communication
    depth = tree_depths(store, deep_index)
    causes = span_causes(parent, depth, kind, gpu, is_sync, communicating)
    device = numbers(deep.column("gpu_device"), null=-1).astype(np.int64, copy=False)
    stream = numbers(deep.column("gpu_stream"), null=-1).astype(np.int64, copy=False)
    library = level == schema.LEVEL_LIBRARY
    named = Named(
        stream=np.where(library, stream, -1),
        event=numbers(deep.column("cuda_event"), null=-1).astype(np.int64, copy=False)
        if "cuda_event" in deep.column_names
        else np.full(len(start), -1, dtype=np.int64),
        is_wait=library & text_in(names, WAIT_CALLS),
        is_record=library & text_in(names, RECORD_CALLS),
    )
    held = _measured_holds(start, dur, parent, owner, gpu, named, stream)
    latency, gap = _device_delays(
        start, dur, parent, kind, gpu, is_sync, owner, device, stream, held
    )
    lane = np.full(len(start), -1, dtype=np.int64)
    act = np.nonzero(gpu)[0]
    if len(act):
        pairs = np.stack([device[act], stream[act]], axis=1)
        lane[act] = np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], steps)
    ends = np.searchsorted(owner[order], steps, side="right")
    return Graph(
        deep_index=deep_index,
        deep=deep,
        parent=parent,
        start=start,
        dur=dur,
        warped_start=warped_start,
        warped_end=warped_end,
        calibration=calib,
        is_call=text_in(deep.column("kind"), (schema.KIND_RUNTIME, schema.KIND_DRIVER)),
        gpu=gpu,
        is_sync=is_sync,
        steps=steps,
        owner=owner,
        members=[order[lo:hi] for lo, hi in zip(bounds, ends, strict=True)],
        base=base,
        causes=causes,
        device=device,
        stream=stream,
        lane=lane,
        named=named,
        latency=latency,
        gap=gap,
        iteration=numbers(deep.column("iteration"), null=-1).astype(np.int64, copy=False),
        collectives=find_collectives(deep, parent, depth, owner, start, dur, gpu, communicating),
    )


def _device_delays(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    kind: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
    owner: np.ndarray,
    device: np.ndarray,
    stream: np.ndarray,
    held: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each activity's device-side delays, as the deep run measured them: its latency (from its
    launch to its start, where it waited for the launch) and its dispatch gap (from the end of the
    one before it on its stream, or of another stream's work it waited for through an event,
    ``held``, where it was queued behind that). An activity measured one way
    takes the median of the other way's. A GPU runs back-to-back kernels about a microsecond
    apart; ResNet-50's ~560 queued kernels a step add up to 0.7 ms. A negative gap (programmatic
    dependent launch lets a kernel start before the one before it ends) is taken as none, as a
    stream's activities do not overlap in the replay."""
    latency = np.zeros(len(start), dtype=np.int64)
    gap = np.zeros(len(start), dtype=np.int64)
    act = np.nonzero(gpu)[0]
    if not len(act):
        return latency, gap
    order = act[np.lexsort((start[act], stream[act], device[act], owner[act]))]
    launcher = np.maximum(parent[order], 0)
    by_call = (parent[order] >= 0) & np.isin(
        kind[launcher], (schema.KIND_RUNTIME, schema.KIND_DRIVER)
    )
    # as the replay launches it: at a call's end, at a blocking copy's start
    launched = np.where(
        by_call & ~is_sync[launcher], start[launcher] + dur[launcher], start[launcher]
    )
    ends = start[order] + dur[order]
    same = (
        (owner[order][1:] == owner[order][:-1])
        & (device[order][1:] == device[order][:-1])
        & (stream[order][1:] == stream[order][:-1])
    )
    prev_end = np.concatenate(([-1], np.where(same, ends[:-1], -1)))
    prev_end = np.maximum(prev_end, held[order])  # an event wait held it: not a dispatch gap
    queued = (prev_end >= 0) & (prev_end > launched)
    own_gap = np.maximum(start[order] - prev_end, 0)
    own_latency = np.maximum(start[order] - launched, 0)
    timed = ~queued & by_call
    median_gap = int(np.median(own_gap[queued])) if queued.any() else 0
    median_latency = int(np.median(own_latency[timed])) if timed.any() else 0
    gap[order] = np.where(queued, own_gap, median_gap)
    latency[order] = np.where(timed, own_latency, median_latency)
    return latency, gap


def _measured_holds(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    owner: np.ndarray,
    gpu: np.ndarray,
    named: Named,
    stream: np.ndarray,
) -> np.ndarray:
    """For the first activity a stream's wait on an event holds (the next one launched on the
    waiting stream after the wait), when the work it waited for ended in the deep run: the last
    activity queued on the event's stream before the event's last record; -1 elsewhere."""
    held = np.full(len(start), -1, dtype=np.int64)
    waits = np.nonzero(named.is_wait & (named.event >= 0) & (named.stream >= 0))[0]
    if not len(waits):
        return held
    records = np.nonzero(named.is_record & (named.event >= 0) & (named.stream >= 0))[0]
    act = np.nonzero(gpu)[0]
    launcher = parent[act]
    launched = np.where(
        launcher >= 0, start[np.maximum(launcher, 0)] + dur[np.maximum(launcher, 0)], start[act]
    )
    lanes: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (step, stream) -> by launch
    keys = np.stack([owner[act], stream[act]], axis=1)
    for key in {tuple(k) for k in keys.tolist()}:
        mine = np.nonzero((keys[:, 0] == key[0]) & (keys[:, 1] == key[1]))[0]
        mine = mine[np.argsort(launched[mine], kind="stable")]
        lanes[key] = (act[mine], launched[mine])
    by_event: dict[tuple[int, int], list[int]] = {}
    for r in records[np.argsort(start[records], kind="stable")].tolist():
        by_event.setdefault((int(owner[r]), int(named.event[r])), []).append(r)
    for w in waits.tolist():
        earlier = [
            r for r in by_event.get((int(owner[w]), int(named.event[w])), []) if start[r] < start[w]
        ]
        if not earlier:
            continue
        record = earlier[-1]
        rows, times = lanes.get((int(owner[w]), int(named.stream[record])), (act[:0], launched[:0]))
        queued = rows[times <= start[record]]
        rows, times = lanes.get((int(owner[w]), int(named.stream[w])), (act[:0], launched[:0]))
        after = np.searchsorted(times, start[w] + dur[w], side="left")
        if not len(queued) or after >= len(rows):
            continue
        first = int(rows[after])
        held[first] = max(int(held[first]), int((start[queued] + dur[queued]).max()))
    return held


def _sync_base(
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    owner: np.ndarray,
    gpu: np.ndarray,
    is_sync: np.ndarray,
) -> np.ndarray:
    """What each sync took after the GPU work before it had ended (measured in the deep run):
    the sync's own cost, which the replay keeps while it recomputes the wait."""
    base = np.zeros(len(start), dtype=np.int64)
    syncs = np.nonzero(is_sync)[0]
    if not len(syncs):
        return base
    act = np.nonzero(gpu)[0]
    act_end = start[act] + dur[act]
    act_owner = owner[act]
    act_launch = np.where(parent[act] >= 0, start[np.maximum(parent[act], 0)], start[act])
    for s in syncs:
        before = (act_owner == owner[s]) & (act_launch <= start[s] + dur[s])
        done = int(act_end[before].max()) if before.any() else int(start[s])
        base[s] = int(np.clip(start[s] + dur[s] - max(done, int(start[s])), 0, dur[s]))
    return base
