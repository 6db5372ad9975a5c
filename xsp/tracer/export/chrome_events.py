"""The Chrome trace event format as ``chrome`` writes it (Google's "Trace Event Format" document,
with torch.profiler's (Kineto's) document keys): complete events (``ph: "X"``), flow events
(``"s"``, ``"f"``), metadata events (``"M"``) and the document around them. Key order is the
order ``chrome`` writes, which the file's bytes follow."""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict

__all__ = [
    "ChromeTrace",
    "CompleteEvent",
    "DeviceProperties",
    "DistributedInfo",
    "FlowEndEvent",
    "FlowStartEvent",
    "GpuArgs",
    "MetadataArgs",
    "MetadataEvent",
    "RunEntry",
    "TraceEvent",
]


class CompleteEvent(TypedDict):
    """A span: ``ts`` and ``dur`` in µs; ``args`` holds Kineto's keys and every xsp attribute."""

    ph: Literal["X"]
    cat: str
    name: str
    pid: int
    tid: int
    ts: float
    dur: float
    args: dict[str, object]


class FlowStartEvent(TypedDict):
    """A flow's start, on a launch call."""

    ph: Literal["s"]
    cat: str
    name: str
    id: int
    pid: int
    tid: int
    ts: float


class FlowEndEvent(TypedDict):
    """A flow's end, bound to the enclosing slice (``bp: "e"``): the GPU activity."""

    ph: Literal["f"]
    cat: str
    name: str
    id: int
    pid: int
    tid: int
    ts: float
    bp: Literal["e"]


class MetadataArgs(TypedDict, total=False):
    """One of them: a process's or thread's name, a process's labels, a sort index."""

    name: str
    labels: str
    sort_index: int


class MetadataEvent(TypedDict):
    """A process's or thread's name, labels or sort index (``name`` says which)."""

    ph: Literal["M"]
    pid: int
    tid: int
    name: str
    args: MetadataArgs


TraceEvent: TypeAlias = CompleteEvent | FlowStartEvent | FlowEndEvent | MetadataEvent

#: Kineto's keys on a GPU activity's ``args``: device, stream, correlation id, launch dimensions
#: (a list, or the stored text where it is no JSON) and sizes.
GpuArgs = TypedDict(
    "GpuArgs",
    {
        "device": int,
        "stream": int,
        "correlation": int,
        "grid": list[int] | str,
        "block": list[int] | str,
        "registers per thread": int,
        "shared memory": int,
        "bytes": int,
    },
    total=False,
)


class DeviceProperties(TypedDict):
    id: int
    name: str


class DistributedInfo(TypedDict):
    rank: int
    world_size: int


#: A run of the export (``xspRuns``): its host ``pid`` and its resource's scalar attributes.
RunEntry: TypeAlias = dict[str, str | int | float | bool]


class ChromeTrace(TypedDict):
    """The document, metadata first (Kineto's layout)."""

    schemaVersion: int
    deviceProperties: list[DeviceProperties]
    distributedInfo: DistributedInfo
    baseTimeNanoseconds: int
    displayTimeUnit: str
    xspRuns: list[RunEntry]
    traceEvents: list[TraceEvent]
