"""The records of the hardware-counter analyses (``xsp.analysis.tables.counters``): a joined
kernel, its counter values, and the rates, waste and roofline points computed from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

__all__ = [
    "CountedKernel",
    "CounterValues",
    "GpuKernel",
    "Rates",
    "RooflinePoint",
    "Waste",
]

#: One kernel's (or an aggregate's) counter values by ``VALUES`` name; None where not counted.
CounterValues = dict[str, float | None]


@dataclass(frozen=True)
class CountedKernel:
    """One kernel of the typical iteration: the G run's latency (median over its iterations),
    the counter values averaged over the counted iterations (all None where ``counted`` is
    False), and its share of its op's algorithmic FLOPs (``_with_algorithmic``)."""

    ordinal: int
    span_id: int
    kernel: str
    layer: str | None
    phase: str | None
    latency_ns: float
    counted: bool
    values: CounterValues
    algorithmic_flops: float | None = None
    exact_flops: float | None = None


class Rates(TypedDict):
    """Work, intensity, achieved rate, roof and bound of one kernel or aggregate."""

    work_gflop: float | None
    achieved_gflop_per_s: float | None
    arithmetic_intensity_flop_per_byte: float | None
    attainable_gflop_per_s: float | None
    precision: str | None
    roof: str | None
    bound: str | None


class Waste(TypedDict):
    """Executed against algorithmic FLOPs (``waste``)."""

    algorithmic_gflop: float | None
    executed_over_algorithmic: float | None
    tile_waste_pct: float | None


class RooflinePoint(TypedDict):
    """One point of a roofline (a kernel or a layer): ``_ROOFLINE_SCHEMA``'s columns."""

    name: str
    layer: str | None
    latency_us: float
    arithmetic_intensity_flop_per_byte: float | None
    achieved_gflop_per_s: float | None
    attainable_gflop_per_s: float | None
    of_attainable_pct: float | None
    roof: str | None
    bound: str | None


class GpuKernel(TypedDict):
    """A kernel row of the deepest run with level G (``_gpu_kernels``)."""

    span_id: int
    iteration: int
    name: str
    dur_ns: int
    module_path: str | None
    phase: str | None
    grid: str | None
    block: str | None
