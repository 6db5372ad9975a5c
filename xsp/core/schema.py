"""The xsp span schema: the one place that names levels, columns, attributes and units.

The tracer writes spans with these columns, the collector and the analyses read them, and the
OTLP encoder maps each column to its attribute key. Adding a column here (a later level's kernel
grid, say) is all it takes for every writer, reader and exporter to carry it.

Times are integers in nanoseconds since the Unix epoch (CLOCK_REALTIME, the clock CUPTI uses too);
durations are nanoseconds. Column names carry their unit (``start_ns``, ``dur_ns``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from xsp.core import levels as level_table

__all__ = [
    "ATTRIBUTE_COLUMNS",
    "ATTR_COLLECTIVE",
    "ATTR_COLLECTIVE_BYTES",
    "ATTR_CORRELATION_ID",
    "ATTR_CUDA_EVENT",
    "ATTR_DATA_MEMORY",
    "ATTR_DATA_WORKERS",
    "ATTR_GPU_BLOCK",
    "ATTR_GPU_BYTES",
    "ATTR_GPU_COPY_KIND",
    "ATTR_GPU_DEVICE",
    "ATTR_GPU_GRID",
    "ATTR_GPU_REGISTERS",
    "ATTR_GPU_SHARED_MEMORY",
    "ATTR_GPU_STREAM",
    "ATTR_GRAPH_NODE",
    "ATTR_GRAPH_OP",
    "ATTR_INPUT_DTYPES",
    "ATTR_INPUT_SHAPES",
    "ATTR_ITERATION",
    "ATTR_KERNEL_NAME",
    "ATTR_KIND",
    "ATTR_LAYER_GPU_NS",
    "ATTR_LEVEL",
    "ATTR_LIBRARY",
    "ATTR_LIBRARY_DETAIL",
    "ATTR_MODULE_PARAMS",
    "ATTR_MODULE_PATH",
    "ATTR_MODULE_TYPE",
    "ATTR_OP_NAME",
    "ATTR_OUTPUT_SHAPES",
    "ATTR_PHASE",
    "ATTR_RANK",
    "ATTR_SEQ_NR",
    "ATTR_SOURCE",
    "ATTR_THREAD_ID",
    "ATTR_VIEW_ADDED",
    "ATTR_VIEW_STORED_PARENT",
    "ATTR_WORLD_SIZE",
    "CALIBRATION_PARTS",
    "COLUMNS",
    "COUNTER_LEVEL_SET",
    "COUNTER_SUMMARIES",
    "EVENT_TYPE",
    "ITERATION_SPAN_NAME",
    "KIND_BACKWARD",
    "KIND_COLLECTIVE",
    "KIND_DATA_LOADING",
    "KIND_DRIVER",
    "KIND_ITERATION",
    "KIND_KERNEL",
    "KIND_LIBRARY_CALL",
    "KIND_MEMCPY",
    "KIND_MEMSET",
    "KIND_MODULE",
    "KIND_OP",
    "KIND_OPTIMIZER",
    "KIND_RUNTIME",
    "KIND_STEP",
    "LEVEL_BY_LETTER",
    "LEVEL_FRAMEWORK",
    "LEVEL_GPU",
    "LEVEL_LIBRARY",
    "LEVEL_MODEL",
    "LEVEL_ORDER",
    "LINK_TYPE",
    "MONITOR_SUMMARIES",
    "OTLP_COLUMNS",
    "PHASE_BACKWARD",
    "PHASE_DATA",
    "PHASE_FORWARD",
    "PHASE_HOST",
    "PHASE_OPTIMIZER",
    "RANK_ID_SHIFT",
    "REQUIRED_COLUMNS",
    "RES_BATCH_SIZE",
    "RES_CUDA_VERSION",
    "RES_DEVICE",
    "RES_DEVICE_NAME",
    "RES_FIXES",
    "RES_HOST_HEAP",
    "RES_HOST_NAME",
    "RES_JAEGER_HOST_KEY",
    "RES_LEVELS",
    "RES_MEASUREMENT_ID",
    "RES_MEMORY_FORMAT",
    "RES_MODE",
    "RES_PYTHON_VERSION",
    "RES_RANK",
    "RES_RECONSTRUCTED",
    "RES_RECONSTRUCTED_FROM",
    "RES_RUN_ID",
    "RES_SERVICE_BASE",
    "RES_SERVICE_NAME",
    "RES_TORCH_VERSION",
    "RES_WORKLOAD",
    "RES_WORLD_SIZE",
    "RES_XSP_VERSION",
    "SERVICE_NAME",
    "SPAN_SCHEMA",
    "STEP_SPAN_NAME",
    "STORE_FORMAT",
    "Column",
    "iteration_root_id",
    "rank_span_id_base",
    "trace_id_for",
    "trace_ids_for",
]

#: Format tag written into every run's ``run.json``; readers refuse other majors.
STORE_FORMAT: Final = "xsp-run/1"
#: run.json's ``switch_on_ms`` parts that are F's calibration probes (built and warmed up with the
#: levels off; timed in pairs of F off and on once they are on): the manifest's phases count them
#: apart from the rest of switching the levels on.
CALIBRATION_PARTS: Final = ("calibration, levels off", "calibration, levels on")

# Level names, in stack order, and the letters used in level sets ("MF", "MFLG"; a level set is
# parsed into an ``xsp.core.levelset.LevelSet``): read from the table of levels.
LEVEL_BY_LETTER: Final = level_table.LEVEL_BY_LETTER
LEVEL_ORDER: Final = level_table.LEVEL_ORDER
LEVEL_MODEL: Final = level_table.level("M").name
LEVEL_FRAMEWORK: Final = level_table.level("F").name
LEVEL_LIBRARY: Final = level_table.level("L").name
LEVEL_GPU: Final = level_table.level("G").name
#: The hardware-counter level's set (opt-in): H runs alone with M, under Nsight Compute, which
#: replays every kernel of the measured iterations to read its counters. Its durations are
#: discarded; its counter values join the other runs' kernels by structure (iteration, kernel
#: name, ordinal), so it never mixes with the levels whose timing it would distort.
COUNTER_LEVEL_SET: Final = level_table.alone_level_set(level_table.level("H"))

# Span kinds (attribute xsp.kind): what a span stands for inside its level.
KIND_STEP: Final = "step"  # model level: one iteration (of one rank, in a multi-rank job)
KIND_ITERATION: Final = "iteration"  # model level: a multi-rank iteration, every rank's step
#: The stored names of a trace's root (on the wire it takes the trace's title: ``trace_title``)
STEP_SPAN_NAME: Final = "step"
ITERATION_SPAN_NAME: Final = "iteration"
KIND_MODULE: Final = "module"  # framework: an nn.Module forward call
KIND_OP: Final = "op"  # framework: an aten operator or other profiler range
KIND_BACKWARD: Final = "backward"  # framework: an autograd node run during backward
KIND_OPTIMIZER: Final = "optimizer"  # framework: optimizer.step / zero_grad
KIND_DATA_LOADING: Final = "data_loading"  # framework: a DataLoader handing out one batch
KIND_COLLECTIVE: Final = "collective"  # framework: a c10d collective call or its backend's work
KIND_LIBRARY_CALL: Final = "library_call"  # library: a cuBLAS/cuDNN/oneDNN call
KIND_RUNTIME: Final = "runtime"  # library: a CUDA runtime API call
KIND_DRIVER: Final = "driver"  # library: a CUDA driver API call
KIND_KERNEL: Final = "kernel"  # gpu: a kernel execution
KIND_MEMCPY: Final = "memcpy"  # gpu: a copy
KIND_MEMSET: Final = "memset"  # gpu: a memset

PHASE_FORWARD: Final = "forward"
PHASE_BACKWARD: Final = "backward"
PHASE_OPTIMIZER: Final = "optimizer"
PHASE_DATA: Final = "data"  # loading the next batch
#: host work between the step's phases: the batch's copy to the device before the first layer
#: call, syncs (``loss.item()``) and logging after the optimizer step
PHASE_HOST: Final = "host"

# Attribute keys: the public contract, documented in the README.
ATTR_LEVEL: Final = "xsp.level"
ATTR_ITERATION: Final = "xsp.iteration"
ATTR_KIND: Final = "xsp.kind"
ATTR_MODULE_PATH: Final = "xsp.module.path"
ATTR_MODULE_TYPE: Final = "xsp.module.type"
ATTR_MODULE_PARAMS: Final = "xsp.module.params"
ATTR_OP_NAME: Final = "xsp.op.name"
ATTR_INPUT_SHAPES: Final = "xsp.input.shapes"
ATTR_INPUT_DTYPES: Final = "xsp.input.dtypes"
ATTR_OUTPUT_SHAPES: Final = "xsp.output.shapes"
ATTR_SOURCE: Final = "xsp.source"
ATTR_PHASE: Final = "xsp.phase"
ATTR_SEQ_NR: Final = "xsp.autograd.seq"
ATTR_THREAD_ID: Final = "thread.id"
ATTR_LIBRARY: Final = "xsp.library.name"
ATTR_LIBRARY_DETAIL: Final = "xsp.library.detail"
ATTR_CORRELATION_ID: Final = "xsp.cuda.correlation_id"
ATTR_GPU_DEVICE: Final = "xsp.gpu.device"
ATTR_GPU_STREAM: Final = "xsp.gpu.stream"
ATTR_GPU_GRID: Final = "xsp.gpu.grid"
ATTR_GPU_BLOCK: Final = "xsp.gpu.block"
ATTR_GPU_REGISTERS: Final = "xsp.gpu.registers_per_thread"
ATTR_GPU_SHARED_MEMORY: Final = "xsp.gpu.shared_memory_bytes"
ATTR_GPU_BYTES: Final = "xsp.gpu.bytes"
ATTR_GPU_COPY_KIND: Final = "xsp.gpu.copy_kind"
#: A kernel replayed from a CUDA graph: its graph node (CUPTI's id), and the op that made the
#: node when the graph was captured (the kernel's layer and phase are that op's)
ATTR_GRAPH_NODE: Final = "xsp.cuda.graph_node"
#: A CUDA call that names an event (an event record, a stream's wait on it, its sync): its id
#: (``gpu_stream`` on such a call is the stream it names)
ATTR_CUDA_EVENT: Final = "xsp.cuda.event_id"
ATTR_GRAPH_OP: Final = "xsp.cuda.graph_op"
ATTR_RANK: Final = "xsp.rank"
ATTR_WORLD_SIZE: Final = "xsp.world_size"
ATTR_DATA_WORKERS: Final = "xsp.data.workers"
ATTR_DATA_MEMORY: Final = "xsp.data.memory"
ATTR_COLLECTIVE: Final = "xsp.collective.name"
ATTR_COLLECTIVE_BYTES: Final = "xsp.collective.bytes"
#: On a reconstruction's layer (module) spans: the GPU time of the layer's kernels in the
#: iteration, forward and backward (every call of the layer), from the G run
ATTR_LAYER_GPU_NS: Final = "xsp.layer.gpu_ns"
# Attributes of the layout sent to trace viewers only (xsp.tracer.export.view), never stored: the
# decoder undoes what they mark.
#: A kernel's full name where the span's name is its short form (xsp.tracer.export.kernel_names)
ATTR_KERNEL_NAME: Final = "xsp.kernel.name"
#: true on a span the viewer layout added (a layer's backward span); the decoder drops it
ATTR_VIEW_ADDED: Final = "xsp.view.added"
#: the stored parent (16 hex digits) of a span the viewer layout moved under an added span
ATTR_VIEW_STORED_PARENT: Final = "xsp.view.stored_parent"

# Resource attribute keys.
RES_SERVICE_NAME: Final = "service.name"
RES_HOST_NAME: Final = "host.name"
RES_RUN_ID: Final = "xsp.run.id"
RES_MEASUREMENT_ID: Final = "xsp.measurement.id"
RES_WORKLOAD: Final = "xsp.workload"
RES_LEVELS: Final = "xsp.levels"
RES_DEVICE: Final = "xsp.device"
RES_DEVICE_NAME: Final = "xsp.device.name"
RES_MODE: Final = "xsp.mode"
RES_BATCH_SIZE: Final = "xsp.batch_size"
RES_MEMORY_FORMAT: Final = "xsp.memory_format"
#: How the level-set process's C heap was set (xsp.tracer.run.heap): "steady", "user", ...
RES_HOST_HEAP: Final = "xsp.host.heap"
RES_FIXES: Final = "xsp.fixes"  # the fixes applied without editing the program (comma-separated)
RES_TORCH_VERSION: Final = "xsp.torch.version"
RES_CUDA_VERSION: Final = "xsp.cuda.version"
RES_PYTHON_VERSION: Final = "xsp.python.version"
RES_XSP_VERSION: Final = "xsp.version"
RES_RANK: Final = "xsp.rank"  # a rank process's own resource
RES_WORLD_SIZE: Final = "xsp.world_size"  # a multi-rank job's level-set run and its ranks
RES_RECONSTRUCTED: Final = "xsp.reconstructed"  # true on a leveled reconstruction
RES_RECONSTRUCTED_FROM: Final = "xsp.reconstructed.from"  # its level sets, "M,MF,MFLG"
#: Jaeger's host key for its clock-skew adjuster (its v1 API reads no other); see xsp.core.otlp.
RES_JAEGER_HOST_KEY: Final = "ip"
#: On a level's own resource (service "<service>.<level>", xsp.tracer.export.view): the run's
#: own service name, which the decoder puts back.
RES_SERVICE_BASE: Final = "xsp.service.base"

SERVICE_NAME: Final = "xsp"


#: GPU monitor metrics summarized onto each model span (see xsp.tracer.capture.monitor).
MONITOR_SUMMARIES: Final = (
    "power_w",
    "sm_clock_mhz",
    "utilization_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
    "memory_used_bytes",
)

#: Hardware counters joined onto reconstructed kernel spans from the counter run (level H):
#: column name and attribute suffix (``xsp.hw.<name>``). Null on every other span.
COUNTER_SUMMARIES: Final = (
    ("flops", pa.float64()),  # floating-point operations, every precision, tensor cores included
    ("flops_precision", pa.dictionary(pa.int32(), pa.string())),  # the precision of most of them
    ("dram_read_bytes", pa.float64()),
    ("dram_write_bytes", pa.float64()),
    ("l2_bytes", pa.float64()),
    ("occupancy_pct", pa.float64()),  # achieved: active warps against the SM's maximum
    ("sm_throughput_pct", pa.float64()),  # of peak, as Nsight Compute's speed of light says
    ("memory_throughput_pct", pa.float64()),
)


@dataclass(frozen=True)
class Column:
    """One span column: its arrow type and, for attribute columns, the OTLP attribute key."""

    name: str
    type: pa.DataType
    attribute: str | None = None


_STR = pa.string()
_DICT = pa.dictionary(pa.int32(), pa.string())
#: An OTLP span event and link (attributes as OTLP/JSON text: xsp.core.otlp.json_values).
EVENT_TYPE: Final = pa.struct(
    [
        ("time_ns", pa.int64()),
        ("name", _STR),
        ("attributes", _STR),
        ("dropped_attributes_count", pa.uint32()),
    ]
)
LINK_TYPE: Final = pa.struct(
    [
        ("trace_id", pa.binary(16)),
        ("span_id", pa.uint64()),
        ("trace_state", _STR),
        ("flags", pa.uint32()),
        ("attributes", _STR),
        ("dropped_attributes_count", pa.uint32()),
    ]
)

#: Identity and timing columns, then attribute columns. Nullable attribute columns are left
#: null where they do not apply (an op has no module type).
COLUMNS: Final[tuple[Column, ...]] = (
    Column("trace_id", pa.binary(16)),
    Column("span_id", pa.uint64()),
    Column("parent_span_id", pa.uint64()),  # 0 for the root
    Column("name", _DICT),
    Column("start_ns", pa.int64()),
    Column("dur_ns", pa.int64()),
    Column("status_message", _STR),  # null when the span ended normally
    # A model span whose iteration began inside a recording OpenTelemetry span of the traced
    # application: that span's id, its parent on the wire (the row's trace id is that span's);
    # null for xsp's own roots (xsp.tracer.capture.hooks.context). parent_span_id stays 0.
    Column("remote_parent_span_id", pa.uint64()),
    # An OpenTelemetry span link: a reconstruction's root links the request's span that the
    # model span it was rebuilt from ran in (the reconstruction keeps its own trace ids).
    Column("link_trace_id", pa.binary(16)),
    Column("link_span_id", pa.uint64()),
    Column("level", _DICT, ATTR_LEVEL),
    Column("iteration", pa.int32(), ATTR_ITERATION),
    # multi-rank jobs: the rank on every span of a rank, the world size on its step and the root
    Column("rank", pa.int32(), ATTR_RANK),
    Column("world_size", pa.int32(), ATTR_WORLD_SIZE),
    Column("kind", _DICT, ATTR_KIND),
    Column("phase", _DICT, ATTR_PHASE),
    Column("thread_id", pa.int64(), ATTR_THREAD_ID),
    Column("module_path", _DICT, ATTR_MODULE_PATH),
    Column("module_type", _DICT, ATTR_MODULE_TYPE),
    Column("module_params", pa.int64(), ATTR_MODULE_PARAMS),
    Column("op_name", _DICT, ATTR_OP_NAME),
    Column("input_shapes", _DICT, ATTR_INPUT_SHAPES),
    Column("input_dtypes", _DICT, ATTR_INPUT_DTYPES),
    Column("output_shapes", _DICT, ATTR_OUTPUT_SHAPES),
    Column("source", _DICT, ATTR_SOURCE),
    Column("seq_nr", pa.int64(), ATTR_SEQ_NR),
    Column("library", _DICT, ATTR_LIBRARY),  # cuBLAS, cuBLASLt, cuDNN, oneDNN
    Column("library_detail", _DICT, ATTR_LIBRARY_DETAIL),  # oneDNN: impl, problem
    Column("correlation_id", pa.int64(), ATTR_CORRELATION_ID),
    Column("gpu_device", pa.int64(), ATTR_GPU_DEVICE),
    Column("gpu_stream", pa.int64(), ATTR_GPU_STREAM),
    Column("grid", _DICT, ATTR_GPU_GRID),
    Column("block", _DICT, ATTR_GPU_BLOCK),
    Column("registers_per_thread", pa.int64(), ATTR_GPU_REGISTERS),
    Column("shared_memory_bytes", pa.int64(), ATTR_GPU_SHARED_MEMORY),
    Column("bytes", pa.int64(), ATTR_GPU_BYTES),
    Column("copy_kind", _DICT, ATTR_GPU_COPY_KIND),
    Column("graph_node", pa.int64(), ATTR_GRAPH_NODE),
    Column("graph_op", _DICT, ATTR_GRAPH_OP),
    Column("cuda_event", pa.int64(), ATTR_CUDA_EVENT),
    # DataLoader batches: the loader's worker processes, and "pinned" or "pageable" batches
    Column("data_workers", pa.int32(), ATTR_DATA_WORKERS),
    Column("data_memory", _DICT, ATTR_DATA_MEMORY),
    # collectives: the operation ("allreduce", "broadcast") and the bytes of its tensors
    Column("collective", _DICT, ATTR_COLLECTIVE),
    Column("collective_bytes", pa.int64(), ATTR_COLLECTIVE_BYTES),
    Column("layer_gpu_ns", pa.int64(), ATTR_LAYER_GPU_NS),  # reconstructed layer spans only
    # GPU monitor summaries, on model spans only (means over the iteration).
    *(Column(f"gpu_{name}", pa.float64(), f"xsp.gpu.{name}") for name in MONITOR_SUMMARIES),
    # Hardware counters, on reconstructed kernel spans only (see COUNTER_SUMMARIES).
    *(Column(f"hw_{name}", type_, f"xsp.hw.{name}") for name, type_ in COUNTER_SUMMARIES),
    # The rest of OTLP, which the collector keeps for any sender and the OTLP encoders give back
    # (docs/store.md). xsp's own spans leave them null, which costs nothing at rest.
    Column("span_kind", pa.int8()),  # OTLP Span.kind; null: INTERNAL, as xsp's own
    Column("status_code", pa.int8()),  # OTLP Status.code; null: ERROR if status_message, else UNSET
    # OTLP Status.message on a status other than ERROR (an OK's description, or an UNSET's as raw
    # OTLP allows): status_message is an error's alone, which the analyses read as a failure
    Column("status_description", _STR),
    Column("trace_state", _STR),
    Column("flags", pa.uint32()),  # OTLP Span.flags; null: 0
    Column("scope_name", _DICT),  # the instrumentation scope; null: xsp's own
    Column("scope_version", _DICT),
    # the rest of the scope, as OTLP/JSON: {"attributes": [...], "droppedAttributesCount": n,
    # "schemaUrl": "..."} (ScopeSpans.schema_url); null when it has none
    Column("scope_extra", _DICT),
    # the sender's resource, a key of run.json's "resources"; null: run.json's "resource"
    Column("resource_id", _DICT),
    # the attributes no column above holds, as OTLP/JSON KeyValues, each value with its type
    Column("attributes", _STR),
    Column("events", pa.list_(EVENT_TYPE)),
    # every link, when link_trace_id / link_span_id (the first link's ids) do not say them all
    Column("links", pa.list_(LINK_TYPE)),
    Column("dropped_attributes_count", pa.uint32()),  # null: 0, as the next two
    Column("dropped_events_count", pa.uint32()),
    Column("dropped_links_count", pa.uint32()),
)

SPAN_SCHEMA: Final = pa.schema([pa.field(c.name, c.type) for c in COLUMNS])
#: The columns of OTLP's fields beyond xsp's (from ``span_kind`` on): one that a part's spans
#: leave null is written without it (readers add it back, null), so xsp's own spans pay not even
#: the ~600 bytes of footer each such column costs a part.
OTLP_COLUMNS: Final = tuple(c.name for c in COLUMNS[[c.name for c in COLUMNS].index("span_kind") :])
ATTRIBUTE_COLUMNS: Final = tuple(c for c in COLUMNS if c.attribute is not None)
REQUIRED_COLUMNS: Final = ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "dur_ns")


def trace_id_for(run_id: str, levels: str, iteration: int) -> bytes:
    """The trace id of one iteration of one level-set run: stable, so re-exports agree. The
    ranks of a multi-rank job share their level set's run id, so an iteration is one trace
    across ranks."""
    return hashlib.blake2b(f"{run_id}/{levels}/{iteration}".encode(), digest_size=16).digest()


def trace_ids_for(run_id: str, levels: str, iterations: list[int]) -> list[bytes]:
    """``trace_id_for`` of each of ``iterations`` (the native core's ``trace_ids`` computes the
    same without the interpreter lock)."""
    # the prefix hashed once, its state copied per iteration: half the time of hashing each
    # whole text (a service's exporter hashes one a request)
    prefix = hashlib.blake2b(f"{run_id}/{levels}/".encode(), digest_size=16)
    out = []
    for i in iterations:
        h = prefix.copy()
        h.update(b"%d" % i)
        out.append(h.digest())
    return out


#: Span ids of rank r start above (r + 1) << RANK_ID_SHIFT, so that the ranks of one trace never
#: share an id (each numbers its spans from 1) and ids below 1 << RANK_ID_SHIFT stay free for
#: the roots that join them; a single-rank run keeps its ids from 1.
RANK_ID_SHIFT: Final = 40


def rank_span_id_base(rank: int | None) -> int:
    """What a rank adds to its own span numbers (0 for a single-rank run)."""
    return 0 if rank is None else (rank + 1) << RANK_ID_SHIFT


def iteration_root_id(iteration: int) -> int:
    """The span id of a multi-rank iteration's root, the parent of every rank's step."""
    return iteration + 1
