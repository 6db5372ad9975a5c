"""Nsight Compute's per-kernel counters -> the counter table of a hardware-counter run (level H).

Pure functions, no torch and no subprocess: the runner (``xsp.tracer.run.ncu``) starts ``ncu``
and imports its report as CSV; this module says which metrics to ask for, reads that CSV, and
derives the quantities the analyses use. The table, one row per profiled kernel::

    iteration, ordinal            measured iteration (-1: outside every iteration) and launch
                                  order inside it (ncu profiles kernels one at a time, in order)
    kernel, grid, block, ncu_id   demangled name, launch shape ([x,y,z]), ncu's result id
    flops_fp64 ... flops_fp8      floating-point operations by precision, tensor cores included
    tensor_flops, flops           the tensor-core share, and the total
    dram_read_bytes, dram_write_bytes, l2_bytes
    occupancy_pct, sm_throughput_pct, memory_throughput_pct, ncu_duration_ns
    <metric names>                every counter ncu reported, in base units, as read

FLOPs (algorithm notes):

1. CUDA cores: Nsight Compute's thread-level instruction counts per precision,
   ``sm__sass_thread_inst_executed_op_{d,f,h}{add,mul,fma}_pred_on.sum``, an FMA counting two
   operations and an add or multiply one (the convention of Nsight Compute's own roofline).
   Half-precision instructions of both kinds (fp16 and bf16 on CUDA cores) count as fp16: the
   counters do not tell them apart.
2. Tensor cores: ``sm__ops_path_tensor_src_<precision>...``, which count floating-point
   operations (two per multiply-accumulate): a bf16 GEMM of M·N·K reports 2·M·N·K there and no
   fp32 FMAs at all, so counting FMAs alone would call it zero work. ``TENSOR_FLOPS_PER_OP``
   is checked on the H200 by ``benchmarks/counter_calibration.py``.
3. A quantity's metric may be named differently across ncu versions (newer ones split the tensor
   counters by sparsity): each part of a quantity lists alternatives, and the first one whose
   metrics the device offers (when profiling) or the CSV holds (when reading) is taken.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from xsp.core.counter_names import DERIVED, PRECISIONS
from xsp.core.records import STEP_RANGE_PREFIX

__all__ = [
    "LEAN_OMITS",
    "QUANTITIES",
    "RANGE_COLUMNS",
    "TENSOR_FLOPS_PER_OP",
    "CounterCsv",
    "derive",
    "parse_metric_names",
    "pass_counts",
    "read_raw_csv",
    "requested_metrics",
]

#: Floating-point operations per counted tensor-path operation (ncu counts each multiply and
#: each add of a multiply-accumulate; a GEMM of M·N·K counts 2·M·N·K).
TENSOR_FLOPS_PER_OP = 1.0

#: The columns the parser reads besides metrics (``ncu --csv --page raw``).
ID_COLUMN, NAME_COLUMN = "ID", "Kernel Name"
GRID_COLUMN, BLOCK_COLUMN = "Grid Size", "Block Size"
#: NVTX columns: start/end ranges (process-wide, so the autograd thread's backward kernels are
#: inside them too) and push/pop ranges (per thread).
RANGE_COLUMNS = ("Id:Domain:Start/Stop_Range", "thread Domain:Push/Pop_Range")
_ITERATION = re.compile(re.escape(STEP_RANGE_PREFIX) + r"(\d+)")

#: Unit prefixes ncu may print (decimal, as ncu uses them: "16.896 Kbyte/block" is 16,896).
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3}


def _sass(op: str) -> tuple[tuple[str, ...], ...]:
    return (
        (f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum",),
        (f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",),
    )


def _tensor(path: str) -> tuple[tuple[str, ...], ...]:
    base = f"sm__ops_path_tensor_src_{path}"
    return ((f"{base}.sum",), (f"{base}_sparsity_off.sum", f"{base}_sparsity_on.sum"))


#: Quantity -> its parts (summed); each part lists alternatives, each a group of metrics summed.
QUANTITIES: dict[str, tuple[tuple[tuple[str, ...], ...], ...]] = {
    "ncu_duration_ns": ((("gpu__time_duration.sum",),),),
    "dram_read_bytes": ((("dram__bytes_read.sum",),),),
    "dram_write_bytes": ((("dram__bytes_write.sum",),),),
    "l2_bytes": ((("lts__t_bytes.sum",),),),
    "occupancy_pct": ((("sm__warps_active.avg.pct_of_peak_sustained_active",),),),
    "sm_throughput_pct": ((("sm__throughput.avg.pct_of_peak_sustained_elapsed",),),),
    "memory_throughput_pct": (
        (("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),),
    ),
    **{f"inst_{op}": (_sass(op),) for p in "dfh" for op in (f"{p}add", f"{p}mul", f"{p}fma")},
    "tensor_fp64_ops": ((("sm__ops_path_tensor_src_fp64.sum",), *_tensor("fp64_dst_fp64")),),
    "tensor_tf32_ops": (_tensor("tf32_dst_fp32"),),
    "tensor_bf16_ops": (_tensor("bf16_dst_fp32"),),
    "tensor_fp16_ops": (_tensor("fp16_dst_fp32"), _tensor("fp16_dst_fp16")),
    "tensor_fp8_ops": (  # one part: an aggregate where there is one, else its parts
        (
            ("sm__ops_path_tensor_src_fp8.sum",),
            (
                "sm__ops_path_tensor_src_fp8_dst_fp16.sum",
                "sm__ops_path_tensor_src_fp8_dst_fp32.sum",
            ),
            ("sm__ops_path_tensor_src_fp8_dst_fp32.sum",),
            ("sm__ops_path_tensor_src_fp8_sparsity_off.sum",),
        ),
    ),
}


#: Left out of the ``lean`` metric set: breakdown metrics whose many sub-metrics take the most
#: replay passes.
LEAN_OMITS = ("sm_throughput_pct", "memory_throughput_pct")


def requested_metrics(
    available: Iterable[str] | None = None, lean: bool = False
) -> tuple[list[str], list[str]]:
    """(metrics to ask ncu for, quantity parts the device offers no metric for). ``available``
    holds the base names the device offers (``ncu --query-metrics``); None takes each part's
    first alternative. ``lean`` leaves out ``LEAN_OMITS``."""
    known = None if available is None else set(available)
    chosen: list[str] = []
    missing: list[str] = []
    for quantity, parts in QUANTITIES.items():
        if lean and quantity in LEAN_OMITS:
            continue
        for index, alternatives in enumerate(parts):
            pick = next(
                (
                    group
                    for group in alternatives
                    if known is None or all(_base(m) in known for m in group)
                ),
                None,
            )
            if pick is None:
                missing.append(quantity if len(parts) == 1 else f"{quantity}[{index}]")
            else:
                chosen.extend(m for m in pick if m not in chosen)
    return chosen, missing


def _base(metric: str) -> str:
    """``dram__bytes_read.sum`` -> ``dram__bytes_read`` (what ``--query-metrics`` lists)."""
    return metric.split(".", 1)[0]


def parse_metric_names(query_output: str) -> set[str]:
    """The base metric names in ``ncu --query-metrics`` output (its first column)."""
    names = set()
    for line in query_output.splitlines():
        token = line.strip().split(" ", 1)[0]
        if "__" in token and re.fullmatch(r"[a-z0-9_]+", token):
            names.add(token)
    return names


@dataclass(frozen=True)
class CounterCsv:
    """A parsed ``ncu --csv --page raw`` export: the counter table and what it could not read."""

    table: pa.Table
    #: metrics in the CSV (their base units), kernels outside every measured iteration, cells
    #: that were not numbers, and whether iterations came from NVTX ranges
    metrics: list[str]
    outside_iterations: int
    unreadable_cells: int
    iterations_from_ranges: bool


def read_raw_csv(text: str, iterations: int | None = None) -> CounterCsv:
    """Parse ``ncu --import REP --csv --page raw``: a header row, a units row (its first cell
    empty), then one row per profiled kernel. Lines before the header (ncu's ``==PROF==``
    messages) are skipped. A kernel's iteration is read from the ``xsp::step::N`` start/end
    range around it; without NVTX columns, a run of one measured iteration (``iterations``
    == 1) puts every kernel in iteration 0. Units are scaled to base units (bytes,
    nanoseconds); numbers may carry thousands separators."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f'"{ID_COLUMN}"')), None)
    if start is None:
        return CounterCsv(_empty(), [], 0, 0, False)
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    if len(rows) > 1 and rows[1][:1] == [""]:  # the units row
        units, data = rows[1], rows[2:]
    else:
        units, data = [""] * len(header), rows[1:]
    column = {name: index for index, name in enumerate(header)}
    range_cols = [i for i, name in enumerate(header) if name.startswith(RANGE_COLUMNS)]
    metric_cols = [(i, name) for i, name in enumerate(header) if "__" in name]
    raw: dict[str, list[float | None]] = {name: [] for _, name in metric_cols}
    bad: dict[str, int] = dict.fromkeys(raw, 0)
    kernels, grids, blocks, ids, iteration = [], [], [], [], []
    ranged = False
    for row in data:
        if len(row) < len(header):
            continue
        kernels.append(row[column[NAME_COLUMN]] if NAME_COLUMN in column else "")
        grids.append(_shape(row[column[GRID_COLUMN]]) if GRID_COLUMN in column else None)
        blocks.append(_shape(row[column[BLOCK_COLUMN]]) if BLOCK_COLUMN in column else None)
        ids.append(_int(row[column[ID_COLUMN]]))
        found = None
        for i in range_cols:
            match = _ITERATION.search(row[i])
            if match:
                found = int(match.group(1))
                ranged = True
                break
        iteration.append(found)
        for i, name in metric_cols:
            value = _number(row[i], units[i] if i < len(units) else "")
            if value is None and row[i].strip() not in ("", "n/a", "N/A"):
                bad[name] += 1
            raw[name].append(value)
    # columns with no number at all (device names, launch attributes as text) are not counters
    values = {name: v for name, v in raw.items() if any(x is not None for x in v)}
    unreadable = sum(bad[name] for name in values)
    if not ranged and iterations == 1:
        iteration = [0] * len(iteration)
    its = [-1 if it is None else it for it in iteration]
    ordinal = _ordinals(its)
    columns: dict[str, pa.Array] = {
        "iteration": pa.array(its, pa.int32()),
        "ordinal": pa.array(ordinal, pa.int32()),
        "kernel": pa.array(kernels, pa.string()),
        "grid": pa.array(grids, pa.string()),
        "block": pa.array(blocks, pa.string()),
        "ncu_id": pa.array(ids, pa.int64()),
    }
    derived = derive(values, len(kernels))
    columns.update({name: pa.array(derived[name], pa.float64()) for name in DERIVED})
    columns.update({name: pa.array(v, pa.float64()) for name, v in values.items()})
    table = pa.table(columns)
    return CounterCsv(
        table,
        list(values),
        sum(1 for it in its if it < 0),
        unreadable,
        ranged,
    )


def derive(
    metrics: Mapping[str, Sequence[float | None]], rows: int
) -> dict[str, list[float | None]]:
    """The derived columns (``DERIVED``) from raw metric columns, row by row. A quantity none
    of whose metrics is present is null; FLOPs of a precision whose counters are all absent are
    null, not zero."""
    quantity = {name: _quantity(metrics, parts, rows) for name, parts in QUANTITIES.items()}
    out: dict[str, list[float | None]] = {}
    for precision, (prefix, tensor) in PRECISIONS.items():
        terms: list[tuple[list[float | None], float]] = []
        if prefix:
            terms += [
                (quantity[f"inst_{prefix}add"], 1.0),
                (quantity[f"inst_{prefix}mul"], 1.0),
                (quantity[f"inst_{prefix}fma"], 2.0),
            ]
        if tensor:
            terms.append((quantity[tensor], TENSOR_FLOPS_PER_OP))
        out[f"flops_{precision}"] = _weighted(terms, rows)
    tensor_terms = [(quantity[t], TENSOR_FLOPS_PER_OP) for _, t in PRECISIONS.values() if t]
    out["tensor_flops"] = _weighted(tensor_terms, rows)
    out["flops"] = _weighted([(out[f"flops_{p}"], 1.0) for p in PRECISIONS], rows)
    for name in DERIVED:
        if name not in out:
            out[name] = quantity[name]
    return out


def _quantity(
    metrics: Mapping[str, Sequence[float | None]],
    parts: tuple[tuple[tuple[str, ...], ...], ...],
    rows: int,
) -> list[float | None]:
    total: list[float | None] = [None] * rows
    for alternatives in parts:
        group = next((g for g in alternatives if all(m in metrics for m in g)), None)
        if group is None:
            continue
        for r in range(rows):
            cells = [metrics[m][r] for m in group]
            if any(c is not None for c in cells):
                total[r] = (total[r] or 0.0) + sum(c or 0.0 for c in cells)
    return total


def _weighted(terms: list[tuple[list[float | None], float]], rows: int) -> list[float | None]:
    out: list[float | None] = [None] * rows
    for values, factor in terms:
        for r in range(rows):
            if values[r] is not None:
                out[r] = (out[r] or 0.0) + factor * float(values[r] or 0.0)
    return out


def _ordinals(iterations: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    out = []
    for it in iterations:
        out.append(seen.get(it, 0))
        seen[it] = out[-1] + 1
    return out


def _number(text: str, unit: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    unit = unit.strip()
    if unit in _TIME:
        return value * _TIME[unit]
    if unit.endswith(("byte", "byte/s")) or unit.endswith("bytes"):
        return value * _SCALE.get(unit.split("byte", 1)[0], 1.0)
    return value


def _int(text: str) -> int | None:
    try:
        return int(text.strip().replace(",", ""))
    except ValueError:
        return None


def _shape(text: str) -> str | None:
    """``(128, 1, 1)`` -> ``[128,1,1]``, the G run's launch-shape format."""
    numbers = re.findall(r"\d+", text)
    return f"[{','.join(numbers)}]" if numbers else None


def _empty() -> pa.Table:
    return pa.table(
        {
            "iteration": pa.array([], pa.int32()),
            "ordinal": pa.array([], pa.int32()),
            "kernel": pa.array([], pa.string()),
            "grid": pa.array([], pa.string()),
            "block": pa.array([], pa.string()),
            "ncu_id": pa.array([], pa.int64()),
            **{name: pa.array([], pa.float64()) for name in DERIVED},
        }
    )


def pass_counts(log: str) -> list[int]:
    """Replay passes per profiled kernel, from ncu's log (``==PROF== Profiling "k": 0%....
    100% - 9 passes``)."""
    return [int(m) for m in re.findall(r"- (\d+) pass(?:es)?", log)]
