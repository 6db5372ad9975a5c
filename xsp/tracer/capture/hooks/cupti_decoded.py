"""What the native core's ``cupti_decode`` returns (``xsp/tracer/native/capture.cpp``), as
types: CUPTI's records of a run or batch, column-wise, each numeric column the bytes of a native
array (``np.frombuffer`` reads it) and each string column codes into its list of values."""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = [
    "ApiColumns",
    "DecodedCupti",
    "ExternalIds",
    "GpuColumns",
    "MarkerColumns",
    "NamedObjects",
]


class ApiColumns(TypedDict):
    """CUDA runtime and driver calls."""

    kind: bytes  # int8: runtime or driver
    name: bytes  # int32 codes into names
    names: list[str]
    start_ns: bytes  # int64, CUPTI's clock (a batch's: Unix-epoch already)
    end_ns: bytes
    correlation: bytes  # int64
    thread: bytes  # int64 OS thread ids


class GpuColumns(TypedDict):
    """Kernels (kind 0), copies (1) and sets (2); int64 columns unless said."""

    kind: bytes  # int8
    name: bytes  # int32 codes into names
    names: list[str]
    start_ns: bytes
    end_ns: bytes
    correlation: bytes
    device: bytes
    stream: bytes
    grid: bytes  # int32 triples
    block: bytes  # int32 triples
    registers: bytes
    shared_memory: bytes
    bytes: bytes
    copy_kind: bytes  # int8
    graph_node: bytes


class MarkerColumns(TypedDict):
    """NVTX ranges (end 0: left open)."""

    domain: bytes  # int32 codes into domains
    domains: list[str]
    name: bytes  # int32 codes into names
    names: list[str]
    start_ns: bytes
    end_ns: bytes
    thread: bytes


class ExternalIds(TypedDict):
    """Each API call's external correlation id: the op it ran in."""

    correlation: bytes
    external: bytes


class NamedObjects(TypedDict):
    """The stream and event that a synchronization, wait or event record names."""

    correlation: bytes
    type: bytes
    stream: bytes
    event: bytes


class DecodedCupti(TypedDict):
    gpu: GpuColumns
    api: ApiColumns
    markers: MarkerColumns
    external: ExternalIds
    named: NotRequired[NamedObjects]  # absent from cores built before they were kept
    counts: dict[str, int | str]  # buffer and record counts; graph_nodes_unrecorded: why
