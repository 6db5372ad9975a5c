"""Raw level records: what each level drains after the measured window, before conversion.

Plain typed containers with no torch import, so that conversion, fixtures, benchmarks and the
analyses can use them anywhere. Strings are interned (int codes into a table of distinct values)
and numbers sit in ``array`` buffers, which numpy reads without copying.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "BACKWARD_PREFIX",
    "BASIC",
    "DEFAULT_DOMAIN",
    "FIELDS",
    "GPM_METRICS",
    "LOADER_SETTINGS",
    "LOADER_SETTINGS_MARK",
    "MODULE_RANGE_PREFIX",
    "STEP_RANGE_PREFIX",
    "ApiRecords",
    "ExternGraph",
    "FrameworkRecords",
    "GpuRecords",
    "GraphNodes",
    "Interned",
    "MemoryRecords",
    "ModuleInfo",
    "MonitorSamples",
    "RangeRecords",
    "StepRecords",
    "loader_range_name",
]

# Profiler range names that levels M and F open around iterations and module calls.
MODULE_RANGE_PREFIX = "xsp::module::"
STEP_RANGE_PREFIX = "xsp::step::"
# What level F appends to a DataLoader batch's range name: `` [workers=4, pin_memory=True]``
# (``loader_range_name`` writes it, ``LOADER_SETTINGS`` reads it back).
LOADER_SETTINGS_MARK = " [workers="
LOADER_SETTINGS = re.compile(re.escape(LOADER_SETTINGS_MARK) + r"(\d+), pin_memory=(True|False)\]$")


def loader_range_name(name: str, workers: int, pinned: bool) -> str:
    return f"{name}{LOADER_SETTINGS_MARK}{workers}, pin_memory={pinned}]"


# The range PyTorch's autograd engine opens around each backward node.
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "

# Record kinds of levels L and G.
API_RUNTIME, API_DRIVER = 0, 1
#: NVTX domain of ranges in the default domain: PyTorch's own operator ranges (level F on CUDA).
DEFAULT_DOMAIN = ""
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2


@dataclass
class StepRecords:
    """Raw model-level records: one row per measured iteration. ``app_parents``: iteration ->
    (trace id, span id) of the application's OpenTelemetry span it began in, where it did."""

    iteration: list[int] = field(default_factory=list)
    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    app_parents: dict[int, tuple[bytes, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModuleInfo:
    """Static facts about one nn.Module, gathered once at its first call."""

    path: str
    type: str
    params: int
    source: str


class Interned:
    """A column of strings kept as int32 codes into a list of distinct values: the form arrow
    calls a dictionary array, so conversion never touches a Python string per row."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.codes = array("i")
        self.values: list[str] = []
        self._index: dict[str, int] = {}
        for value in values:
            self.append(value)

    def append(self, value: str) -> None:
        code = self._index.get(value)
        if code is None:
            code = self._index[value] = len(self.values)
            self.values.append(value)
        self.codes.append(code)

    @classmethod
    def from_codes(cls, codes: Any, values: list[str]) -> Interned:
        """A column from int32 codes (anything with ``tobytes``) into distinct ``values``."""
        column = cls()
        column.codes.frombytes(codes.astype("int32").tobytes())
        column.values = list(values)
        column._index = {v: i for i, v in enumerate(column.values)}
        return column

    def __len__(self) -> int:
        return len(self.codes)

    def to_list(self) -> list[str]:
        return [self.values[c] for c in self.codes]


def _int64s() -> array[int]:
    return array("q")


@dataclass
class MemoryRecords:
    """Allocator events (level F): each allocation (``bytes`` > 0) and free (< 0) with the
    allocator's total allocated after it, on the device it happened on (``device_type``: c10's
    DeviceType, 0 CPU, 1 CUDA)."""

    time_ns: array[int] = field(default_factory=_int64s)
    thread: array[int] = field(default_factory=_int64s)
    bytes: array[int] = field(default_factory=_int64s)
    total_allocated: array[int] = field(default_factory=_int64s)
    device_type: array[int] = field(default_factory=_int64s)
    device_index: array[int] = field(default_factory=_int64s)


class ExternGraph(NamedTuple):
    """One compiled graph's extern calls: the dynamo compile id of its frame (``"1/0"``, as
    ``Torch-Compiled Region: 1/0`` names its runs; ``""`` unknown), its phase, and per call
    in order its op's name (``aten::mm``) and the module paths of the FX nodes it was built
    from."""

    compile_id: str
    phase: str
    calls: list[tuple[str, list[str]]]


@dataclass
class FrameworkRecords:
    """Raw framework-level records, one entry per profiler event, plus the module tables."""

    name: Interned = field(default_factory=Interned)
    start_ns: array[int] = field(default_factory=_int64s)
    end_ns: array[int] = field(default_factory=_int64s)
    thread: array[int] = field(default_factory=_int64s)
    fwd_thread: array[int] = field(default_factory=_int64s)
    seq_nr: array[int] = field(default_factory=_int64s)
    input_shapes: Interned = field(default_factory=Interned)
    input_dtypes: Interned = field(default_factory=Interned)
    #: The Python line that called each op (``file:line function``; "" where none was recorded:
    #: a row that is not an op, an op of a thread without Python, an iteration without shapes).
    op_source: Interned = field(default_factory=Interned)
    #: The id the op callback pushed to CUPTI as external correlation id; 0 for non-ops.
    external_id: array[int] = field(default_factory=_int64s)
    modules: list[ModuleInfo] = field(default_factory=list)
    # Per module call, indexed by the <call> number in the range name: module index, and the
    # shapes of the tensors in its arguments and output (``[[2,3],[4]]``).
    call_module: list[int] = field(default_factory=list)
    call_input_shapes: list[str | None] = field(default_factory=list)
    call_output_shapes: dict[int, str] = field(default_factory=dict)
    memory: MemoryRecords = field(default_factory=MemoryRecords)
    #: Compiled kernels' source modules by inductor's provenance: ``"<phase> <kernel name>"``
    #: -> per definition, in call order, the module paths of its nodes.
    kernel_sources: dict[str, list[list[str]]] = field(default_factory=dict)
    graph_nodes: GraphNodes = field(default_factory=lambda: GraphNodes())
    #: Per compiled graph, its phase and extern-kernel calls (library work the generated code
    #: calls as aten ops): ``xsp.tracer.capture.hooks.inductor``.
    extern_calls: list[ExternGraph] = field(default_factory=list)


@dataclass
class GraphNodes:
    """CUDA graph nodes made while recording, by CUPTI node id: the op that made each (its
    name), that op's module (an index into ``FrameworkRecords.modules``, -1 none) and phase (a
    ``schema.PHASE_*``, "" unknown), and the call it was made in. A node cloned at
    instantiation maps to its original."""

    op: dict[int, str] = field(default_factory=dict)
    module: dict[int, int] = field(default_factory=dict)
    phase: dict[int, str] = field(default_factory=dict)
    cloned_from: dict[int, int] = field(default_factory=dict)
    #: the outermost op the node's op ran in (the aten op a compiled graph's wrapper called,
    #: ``aten::convolution``) and that op's instance, ``(capture << 32) | op number``
    call: dict[int, str] = field(default_factory=dict)
    instance: dict[int, int] = field(default_factory=dict)

    def origin(self, node: int) -> int | None:
        """The node a (possibly cloned) node was first made as, if its making was recorded
        with an op or a module (instantiation makes each clone as a node of its own, with
        neither); None otherwise."""
        seen = 0
        while node in self.cloned_from and seen < 64:
            node, seen = self.cloned_from[node], seen + 1
        recorded = node in self.op and (self.op[node] or self.module[node] >= 0)
        return node if recorded else None


@dataclass
class RangeRecords:
    """Host-side ranges from outside the profiler: NVTX ranges that CUPTI recorded (PyTorch's
    operators in the default domain, cuBLAS/cuDNN calls in theirs) or oneDNN primitive runs.
    ``thread`` is the OS thread id; ``detail`` is free text (oneDNN's problem description)."""

    domain: Interned = field(default_factory=Interned)
    name: Interned = field(default_factory=Interned)
    start_ns: array[int] = field(default_factory=_int64s)
    end_ns: array[int] = field(default_factory=_int64s)
    thread: array[int] = field(default_factory=_int64s)
    detail: Interned = field(default_factory=Interned)


@dataclass
class ApiRecords:
    """CUDA runtime/driver API calls (``thread`` is the OS thread id) and the library calls
    around them (cuBLAS/cuDNN NVTX ranges on CUDA, oneDNN primitives on CPU)."""

    kind: array[int] = field(default_factory=lambda: array("b"))
    name: Interned = field(default_factory=Interned)
    start_ns: array[int] = field(default_factory=_int64s)
    end_ns: array[int] = field(default_factory=_int64s)
    correlation: array[int] = field(default_factory=_int64s)
    thread: array[int] = field(default_factory=_int64s)
    #: The op's external correlation id (``FrameworkRecords.external_id``); 0: none recorded.
    external_id: array[int] = field(default_factory=_int64s)
    #: The CUDA stream and event a call names (CUPTI's synchronization and event records: a
    #: stream, event or context sync, a stream's wait on an event, an event record); -1: none.
    stream: array[int] = field(default_factory=_int64s)
    event: array[int] = field(default_factory=_int64s)
    library: RangeRecords = field(default_factory=RangeRecords)


@dataclass
class GpuRecords:
    """Kernels, memcpys and memsets as the GPU ran them."""

    kind: array[int] = field(default_factory=lambda: array("b"))
    name: Interned = field(default_factory=Interned)  # mangled kernel name, or "Memcpy HtoD"...
    start_ns: array[int] = field(default_factory=_int64s)
    end_ns: array[int] = field(default_factory=_int64s)
    correlation: array[int] = field(default_factory=_int64s)
    device: array[int] = field(default_factory=_int64s)
    stream: array[int] = field(default_factory=_int64s)
    grid: Interned = field(default_factory=Interned)  # "[x,y,z]", "" for copies
    block: Interned = field(default_factory=Interned)
    registers: array[int] = field(default_factory=_int64s)
    shared_memory: array[int] = field(default_factory=_int64s)  # static + dynamic bytes
    bytes: array[int] = field(default_factory=_int64s)  # copies and sets
    copy_kind: Interned = field(default_factory=Interned)
    #: The CUDA graph node a kernel replays (CUPTI's node id), 0 for a kernel launched itself.
    graph_node: array[int] = field(default_factory=_int64s)
    dropped: int = 0


# -- GPU monitor samples (capture: xsp.tracer.capture.monitor) ------------------------------

#: NVML's basic readings, one value per sample.
BASIC = (
    "power_w",
    "energy_j",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "clock_event_reasons",
    "memory_used_bytes",
    "utilization_pct",
)
#: GPM metric name -> NVML constant name.
GPM_METRICS = {
    "sm_active_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "graphics_active_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "tensor_active_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp32_active_pct": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active_pct": "NVML_GPM_METRIC_FP16_UTIL",
    "pcie_tx_mb_per_s": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "pcie_rx_mb_per_s": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
}
FIELDS = BASIC + tuple(GPM_METRICS)


@dataclass
class MonitorSamples:
    """One row per sample; GPM values describe the window since the previous sample."""

    time_ns: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=lambda: {f: [] for f in FIELDS})
    unavailable: str | None = None
    gpm_unavailable: str | None = None
