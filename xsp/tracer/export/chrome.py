"""Spans -> Chrome trace event JSON in torch.profiler's (Kineto's) conventions, which Perfetto
(ui.perfetto.dev), chrome://tracing, TensorBoard's profiler plugin and Holistic Trace Analysis read.

Layout, as Kineto writes it, plus what xsp has that torch.profiler lacks:

1. Each level-set run is a host process (pid: the run's OS pid where it recorded one) with one
   track (tid) per thread; its model spans (``ProfilerStep#N``) sit on the main thread. The run's
   GPU work sits in its own process per device, pid = device index as Kineto has it, one track
   per CUDA stream (tid = stream). Later runs of a multi-run export take the next free pids, and
   every process is named after its run's level set, so runs stay apart. The ranks of a
   multi-rank job are processes of their own (``split_ranks``: one run per rank, pid = the
   rank's OS pid, named with its rank), without the iteration roots that join them in OTLP.
2. Categories (``cat``) are torch.profiler's: ``user_annotation`` (steps, optimizer calls),
   ``cpu_op`` (aten ops, autograd nodes), ``python_function`` (nn.Module calls, as with
   ``with_modules``), ``cuda_runtime``, ``cuda_driver``, ``kernel``, ``gpu_memcpy``,
   ``gpu_memset``; library calls (cuBLAS, cuDNN, oneDNN), which torch.profiler does not see, are
   ``library``.
3. ``args`` carry Kineto's keys (``correlation`` on launches and GPU activities, ``External id``:
   the enclosing framework span's number, ``device`` and ``stream`` on GPU activities, grid,
   block, registers, shared memory, bytes) and every xsp attribute under its ``xsp.*`` key.
4. Every GPU activity whose launch call is in the run gets a flow pair, Kineto style: ``ph: "s"``
   on the launch and ``ph: "f"`` with ``bp: "e"`` on the activity, ``cat: "ac2g"``, ``id`` = the
   correlation id (plus ``run << 32`` past the first run: CUPTI restarts its ids in each run).
5. Times are microseconds relative to the earliest span of the export (the base is in the
   document's ``baseTimeNanoseconds``, as Kineto records it), whole by default: each span's
   start and end offsets are rounded to the nearest microsecond and its duration is their
   difference. Rounding every boundary alike keeps the order of any two boundaries (a span
   that ended before the next began still does; a nested one stays nested) and is unbiased,
   where Holistic Trace Analysis, given fractions, rounds each start up and each end down (a
   span of less than 1 us gets a negative duration and its breakdown asserts). With
   ``exact_ns`` they are exact decimals of the nanosecond offsets instead (``ts * 1000 +
   baseTimeNanoseconds`` is the span's ``start_ns``), for Perfetto.
6. The document's metadata has ``schemaVersion``, ``distributedInfo`` (rank 0: one process made
   the trace; HTA wants a rank per file), ``deviceProperties`` and ``xspRuns`` (each run's
   resource and host pid). Files ending in ``.gz`` are gzip-compressed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from xsp.core import schema, store
from xsp.tracer.export.chrome_events import (
    ChromeTrace,
    CompleteEvent,
    FlowEndEvent,
    FlowStartEvent,
    GpuArgs,
    MetadataEvent,
    RunEntry,
    TraceEvent,
)

__all__ = [
    "CATEGORY_BY_KIND",
    "CATEGORY_BY_LEVEL",
    "FLOW_CATEGORY",
    "FLOW_ID_RUN_SHIFT",
    "GPU_PID_STRIDE",
    "HOST_PID_FALLBACK",
    "LAUNCH_KINDS",
    "OVERLAP_TID_STRIDE",
    "RES_PROCESS_PID",
    "STEP_NAME",
    "chrome_trace",
    "split_ranks",
    "write_chrome_trace",
]

#: ``cat`` of each span kind (torch.profiler's names where it has the kind).
CATEGORY_BY_KIND: Final = {
    schema.KIND_STEP: "user_annotation",
    schema.KIND_MODULE: "python_function",
    schema.KIND_OP: "cpu_op",
    schema.KIND_BACKWARD: "cpu_op",
    schema.KIND_OPTIMIZER: "user_annotation",
    schema.KIND_COLLECTIVE: "cpu_op",  # as Kineto records c10d's ops
    schema.KIND_LIBRARY_CALL: "library",
    schema.KIND_RUNTIME: "cuda_runtime",
    schema.KIND_DRIVER: "cuda_driver",
    schema.KIND_KERNEL: "kernel",
    schema.KIND_MEMCPY: "gpu_memcpy",
    schema.KIND_MEMSET: "gpu_memset",
}
#: ``cat`` of a span whose kind is missing or new, by level.
CATEGORY_BY_LEVEL: Final = {
    schema.LEVEL_MODEL: "user_annotation",
    schema.LEVEL_FRAMEWORK: "cpu_op",
    schema.LEVEL_LIBRARY: "library",
    schema.LEVEL_GPU: "kernel",
}
FLOW_CATEGORY: Final = "ac2g"  # Kineto's async CPU-to-GPU flow
LAUNCH_KINDS: Final = (schema.KIND_RUNTIME, schema.KIND_DRIVER)
STEP_NAME: Final = "ProfilerStep#{}"
HOST_PID_FALLBACK: Final = 1000  # a run that recorded no process.pid
GPU_PID_STRIDE: Final = 100  # run k's device d wants pid k * stride + d
FLOW_ID_RUN_SHIFT: Final = 32
#: An activity that starts before the one before it on its stream has ended (programmatic
#: dependent launch on Hopper, clock calibration: up to 4.5 µs in one ResNet-50 run) goes to an
#: extra track of that stream, tid = stream + k * this: Perfetto's JSON importer drops a complete
#: event that overlaps another on its track without nesting in it.
OVERLAP_TID_STRIDE: Final = 1 << 20
RES_PROCESS_PID: Final = "process.pid"  # OpenTelemetry's resource key, set by the child runner


def split_ranks(
    resource: Mapping[str, object], table: pa.Table, pids: Mapping[int, int] | None = None
) -> list[tuple[dict[str, object], pa.Table]]:
    """A multi-rank run as one run per rank (its rank and, from ``pids``, its OS pid in the
    resource), the iteration roots left out; a single-rank run as it is."""
    ranks = pc.unique(table.column("rank").drop_null()).to_pylist()
    if not ranks:
        return [(dict(resource), table)]
    out = []
    for rank in sorted(ranks):
        part: dict[str, object] = {**resource, schema.RES_RANK: rank}
        part.pop(RES_PROCESS_PID, None)
        if pids and rank in pids:
            part[RES_PROCESS_PID] = pids[rank]
        out.append((part, table.filter(pc.equal(table.column("rank"), rank))))
    return out


def chrome_trace(
    runs: Iterable[tuple[Mapping[str, object], pa.Table]], exact_ns: bool = False
) -> ChromeTrace:
    """The trace document (metadata and ``traceEvents``) of one or more level-set runs; times in
    whole microseconds, or with ``exact_ns`` exact to the nanosecond (module notes, 5)."""
    runs = [(resource, table) for resource, table in runs]
    starts = [pc.min(t.column("start_ns")).as_py() for _, t in runs if t.num_rows]
    base = min(starts) if starts else 0
    pids: set[int] = set()
    events: list[TraceEvent] = []
    devices: dict[int, str] = {}
    run_meta: list[RunEntry] = []
    for index, (resource, table) in enumerate(runs):
        run = _RunExport(index, resource, table, base, pids, exact_ns)
        events.extend(run.events())
        for device in run.gpu_pids:
            devices.setdefault(device, str(resource.get(schema.RES_DEVICE_NAME, "")))
        run_meta.append({"pid": run.host_pid, **_scalars(resource)})
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": name} for d, name in sorted(devices.items())],
        "distributedInfo": {"rank": 0, "world_size": 1},
        "baseTimeNanoseconds": base,
        "displayTimeUnit": "ms",
        "xspRuns": run_meta,
        "traceEvents": events,
    }


def write_chrome_trace(
    path: Path, runs: Iterable[tuple[Mapping[str, object], pa.Table]], exact_ns: bool = False
) -> int:
    """Write every run into one trace file (``chrome_trace``); returns the number of span
    (``ph: "X"``) events.

    The metadata comes first, spaced as Kineto spaces it (HTA finds a file's rank by matching
    ``"rank": N`` line by line), then one event per line."""
    document = chrome_trace(runs, exact_ns)
    events = document["traceEvents"]
    metadata = {key: value for key, value in document.items() if key != "traceEvents"}
    head = json.dumps(metadata)[:-1]  # without the closing brace
    body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
    text = f'{head},\n"traceEvents": [\n{body}\n]}}\n'
    with store.open_output(Path(path)) as handle:
        handle.write(text)
    return sum(1 for e in events if e["ph"] == "X")


class _RunExport:
    """The events of one run: its processes, tracks, spans and flows."""

    def __init__(
        self,
        index: int,
        resource: Mapping[str, object],
        table: pa.Table,
        base_ns: int,
        pids: set[int],
        exact_ns: bool = False,
    ) -> None:
        self.index, self.base_ns, self.exact_ns = index, base_ns, exact_ns
        self.cols = table.to_pydict()
        self.rows = table.num_rows
        levels, workload = resource.get(schema.RES_LEVELS, "?"), resource.get(schema.RES_WORKLOAD)
        rank = resource.get(schema.RES_RANK)
        if rank is not None:
            levels = f"{levels} · rank {rank}"
        self.label = f"xsp {levels} · {workload}" if workload else f"xsp {levels}"
        os_pid = resource.get(RES_PROCESS_PID)
        if isinstance(os_pid, int):  # Linux: the main thread's tid is the process id
            self.main_tid, self.host_pid = os_pid, _claim(pids, os_pid)
        else:
            self.main_tid, self.host_pid = self._first_thread(), _claim(pids, HOST_PID_FALLBACK)
        devices = {
            d or 0
            for d, level in zip(self.cols["gpu_device"], self.cols["level"], strict=True)
            if level == schema.LEVEL_GPU
        }
        self.gpu_pids = {d: _claim(pids, index * GPU_PID_STRIDE + d) for d in sorted(devices)}
        self.external = self._external_ids()

    def events(self) -> list[TraceEvent]:
        c = self.cols
        attributes = [(col.name, str(col.attribute)) for col in schema.ATTRIBUTE_COLUMNS]
        host_threads: set[int] = {self.main_tid}
        streams: set[tuple[int, int]] = set()
        launches: dict[int, tuple[int, int]] = {}  # correlation id -> (tid, start_ns)
        spans: list[CompleteEvent] = []
        gpu_rows = []
        gpu_tid = self._gpu_tracks()
        for row in range(self.rows):
            level, kind = c["level"][row], c["kind"][row]
            args: dict[str, object] = {
                key: c[column][row] for column, key in attributes if c[column][row] is not None
            }
            name = c["name"][row]
            if kind == schema.KIND_STEP:
                args["xsp.name"] = name
                name = STEP_NAME.format(c["iteration"][row])
            if self.external.get(row) is not None:
                args["External id"] = self.external[row]
            if level == schema.LEVEL_GPU:
                device, stream = c["gpu_device"][row] or 0, c["gpu_stream"][row] or 0
                pid, tid = self.gpu_pids[device], gpu_tid[row]
                streams.add((device, tid))
                args.update(_gpu_args(c, row, device, stream))
                gpu_rows.append(row)
            else:
                pid = self.host_pid
                tid = c["thread_id"][row] or self.main_tid
                host_threads.add(tid)
                correlation = c["correlation_id"][row]
                if correlation is not None:
                    args["correlation"] = correlation
                    if kind in LAUNCH_KINDS:
                        launches[correlation] = (tid, c["start_ns"][row])
                if c["seq_nr"][row] is not None:
                    args["Sequence number"] = c["seq_nr"][row]
            spans.append(
                {
                    "ph": "X",
                    "cat": CATEGORY_BY_KIND.get(kind) or CATEGORY_BY_LEVEL.get(level, level),
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": self._us(c["start_ns"][row]),
                    "dur": self._dur_us(c["start_ns"][row], c["dur_ns"][row]),
                    "args": args,
                }
            )
        flows: list[FlowStartEvent | FlowEndEvent] = []
        for row in gpu_rows:
            correlation = c["correlation_id"][row]
            if correlation not in launches:
                continue
            launch_tid, launch_ns = launches[correlation]
            flow_id = (self.index << FLOW_ID_RUN_SHIFT) + correlation
            flows.append(
                {
                    "ph": "s",
                    "cat": FLOW_CATEGORY,
                    "name": FLOW_CATEGORY,
                    "id": flow_id,
                    "pid": self.host_pid,
                    "tid": launch_tid,
                    "ts": self._us(launch_ns),
                }
            )
            flows.append(
                {
                    "ph": "f",
                    "cat": FLOW_CATEGORY,
                    "name": FLOW_CATEGORY,
                    "id": flow_id,
                    "pid": self.gpu_pids[c["gpu_device"][row] or 0],
                    "tid": gpu_tid[row],
                    "ts": self._us(c["start_ns"][row]),
                    "bp": "e",
                }
            )
        return [*self._metadata(host_threads, streams), *spans, *flows]

    def _metadata(self, threads: set[int], streams: set[tuple[int, int]]) -> list[MetadataEvent]:
        sort_base = self.index * GPU_PID_STRIDE
        out = _process(self.host_pid, self.label, "CPU", sort_base)
        for tid in sorted(threads):
            suffix = " (main)" if tid == self.main_tid else ""
            out += _thread(self.host_pid, tid, f"thread {tid}{suffix}", tid)
        for device, pid in self.gpu_pids.items():
            out += _process(
                pid, f"{self.label} · GPU {device}", f"GPU {device}", sort_base + 1 + device
            )
        for device, tid in sorted(streams):
            stream, extra = tid % OVERLAP_TID_STRIDE, tid // OVERLAP_TID_STRIDE
            name = f"stream {stream}" + (f" (overlap {extra})" if extra else "")
            out += _thread(self.gpu_pids[device], tid, name, tid)
        return out

    def _gpu_tracks(self) -> dict[int, int]:
        """Each GPU row's track: its stream, or an extra track of it for an activity that
        overlaps one still running on the stream (``OVERLAP_TID_STRIDE``)."""
        c = self.cols
        rows = [r for r in range(self.rows) if c["level"][r] == schema.LEVEL_GPU]
        rows.sort(
            key=lambda r: (c["gpu_device"][r] or 0, c["gpu_stream"][r] or 0, c["start_ns"][r])
        )
        tracks: dict[int, int] = {}
        ends: dict[tuple[int, int], list[int]] = {}  # (device, stream) -> each track's last end
        for row in rows:
            stream = c["gpu_stream"][row] or 0
            lanes = ends.setdefault((c["gpu_device"][row] or 0, stream), [])
            start, end = c["start_ns"][row], c["start_ns"][row] + c["dur_ns"][row]
            extra = next((k for k, last in enumerate(lanes) if last <= start), len(lanes))
            if extra == len(lanes):
                lanes.append(end)
            lanes[extra] = end
            tracks[row] = stream + extra * OVERLAP_TID_STRIDE
        return tracks

    def _us(self, ns: int) -> float:
        if not self.exact_ns:  # the nearest whole microsecond (module notes, 5)
            return (ns - self.base_ns + 500) // 1000
        # An integer number of ns over 1000 prints as the exact 3-decimal value: offsets stay far
        # below 2**53 ns, and the shortest repr of the nearest double is that decimal.
        return (ns - self.base_ns) / 1e3

    def _dur_us(self, start_ns: int, dur_ns: int) -> float:
        if not self.exact_ns:
            return self._us(start_ns + dur_ns) - self._us(start_ns)
        return dur_ns / 1e3

    def _first_thread(self) -> int:
        threads = [t for t in self.cols["thread_id"] if t is not None]
        return threads[0] if threads else 0

    def _external_ids(self) -> dict[int, int | None]:
        """Row -> External id: framework spans are numbered in table order; library and GPU spans
        take their nearest framework ancestor's number (as Kineto gives a launch and its kernel
        the id of the op that made them); model spans have none."""
        c = self.cols
        by_span = {span: row for row, span in enumerate(c["span_id"])}
        numbered = [r for r in range(self.rows) if c["level"][r] == schema.LEVEL_FRAMEWORK]
        ext: dict[int, int | None] = {row: n for n, row in enumerate(numbered, start=1)}
        for row in range(self.rows):
            path = []
            at: int | None = row
            while at is not None and at not in ext:
                path.append(at)
                parent = c["parent_span_id"][at]
                at = by_span.get(parent) if parent else None
                if at is not None and c["level"][at] == schema.LEVEL_MODEL:
                    at = None
                if len(path) > self.rows:  # a cycle of parent ids: no framework span above
                    at = None
            found = ext[at] if at is not None else None
            for p in path:
                ext[p] = found
        return ext


def _gpu_args(c: dict[str, list[Any]], row: int, device: int, stream: int) -> GpuArgs:
    """Kineto's keys for one GPU activity."""
    args: GpuArgs = {"device": device, "stream": stream}
    if c["correlation_id"][row] is not None:
        args["correlation"] = c["correlation_id"][row]
    if c["grid"][row]:
        args["grid"] = _dimensions(c["grid"][row])
    if c["block"][row]:
        args["block"] = _dimensions(c["block"][row])
    if c["registers_per_thread"][row] is not None:
        args["registers per thread"] = c["registers_per_thread"][row]
    if c["shared_memory_bytes"][row] is not None:
        args["shared memory"] = c["shared_memory_bytes"][row]
    if c["bytes"][row] is not None:
        args["bytes"] = c["bytes"][row]
    return args


def _dimensions(text: str) -> list[int] | str:
    """A launch's grid or block as Kineto writes it (``[x, y, z]``); the text where it is no
    JSON."""
    try:
        dimensions: list[int] = json.loads(text)
    except ValueError:
        return text
    return dimensions


def _process(pid: int, name: str, labels: str, sort_index: int) -> list[MetadataEvent]:
    return [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_labels", "args": {"labels": labels}},
        {
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "name": "process_sort_index",
            "args": {"sort_index": sort_index},
        },
    ]


def _thread(pid: int, tid: int, name: str, sort_index: int) -> list[MetadataEvent]:
    return [
        {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
        {
            "ph": "M",
            "pid": pid,
            "tid": tid,
            "name": "thread_sort_index",
            "args": {"sort_index": sort_index},
        },
    ]


def _claim(pids: set[int], want: int) -> int:
    """``want``, or the next pid above it that no process of the export has."""
    while want in pids:
        want += 1
    pids.add(want)
    return want


def _scalars(resource: Mapping[str, object]) -> RunEntry:
    return {k: v for k, v in resource.items() if isinstance(v, (str, int, float, bool))}
