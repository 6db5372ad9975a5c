"""The roofs a roofline sets kernels against: peak FLOP/s per precision and path (CUDA cores or
tensor cores) and DRAM bandwidth, either measured on the device by the counter run's calibration
kernels (``xsp.tracer.capture.levels.counters``) or from a datasheet table keyed by device
name. Measured roofs win where there is one; every table and chart says which it used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = ["DATASHEETS", "ROOFS", "Peaks", "datasheet", "peaks_table", "resolve"]

#: Roofs in the order tables list them: key -> what it is.
ROOFS: dict[str, str] = {
    "fp64": "FP64, CUDA cores",
    "fp64_tensor": "FP64, tensor cores",
    "fp32": "FP32, CUDA cores",
    "tf32_tensor": "TF32, tensor cores",
    "fp16": "FP16/BF16, CUDA cores",
    "fp16_tensor": "FP16, tensor cores",
    "bf16_tensor": "BF16, tensor cores",
    "fp8_tensor": "FP8, tensor cores",
    "dram": "DRAM bandwidth",
}
_T = 1e12
#: GH100 in its SXM form (H100 SXM and H200), compute only.
_GH100_SXM = {
    "fp64": 33.5 * _T,
    "fp64_tensor": 66.9 * _T,
    "fp32": 66.9 * _T,
    "tf32_tensor": 494.7 * _T,
    "fp16": 133.8 * _T,
    "fp16_tensor": 989.4 * _T,
    "bf16_tensor": 989.4 * _T,
    "fp8_tensor": 1978.9 * _T,
}
#: Dense peaks (no sparsity) from NVIDIA's datasheets and the Hopper whitepaper, FLOP/s and
#: bytes/s, matched against ``xsp.device.name`` by substring, first match wins.
DATASHEETS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {**_GH100_SXM, "dram": 4.8 * _T}),  # the H100 SXM's compute, HBM3e
    (
        "H100 PCIe",
        {
            "fp64": 25.6 * _T,
            "fp64_tensor": 51.2 * _T,
            "fp32": 51.2 * _T,
            "tf32_tensor": 378.0 * _T,
            "fp16": 102.4 * _T,
            "fp16_tensor": 756.0 * _T,
            "bf16_tensor": 756.0 * _T,
            "fp8_tensor": 1513.0 * _T,
            "dram": 2.0 * _T,
        },
    ),
    ("H100", {**_GH100_SXM, "dram": 3.35 * _T}),
    (
        "A100",
        {
            "fp64": 9.7 * _T,
            "fp64_tensor": 19.5 * _T,
            "fp32": 19.5 * _T,
            "tf32_tensor": 156.0 * _T,
            "fp16": 78.0 * _T,
            "fp16_tensor": 312.0 * _T,
            "bf16_tensor": 312.0 * _T,
            "dram": 2.039 * _T,
        },
    ),
)


@dataclass(frozen=True)
class Peaks:
    """The roofs in use: ``values`` (FLOP/s per compute roof, bytes/s for ``dram``), where each
    came from (``measured`` or ``datasheet``), and one line saying so."""

    device: str
    values: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    datasheet: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    datasheet_name: str | None = None

    @property
    def dram(self) -> float | None:
        return self.values.get("dram")

    def ridge(self, roof: str) -> float | None:
        """Arithmetic intensity (FLOP/byte) above which ``roof`` bounds a kernel, not DRAM."""
        compute, dram = self.values.get(roof), self.dram
        return compute / dram if compute and dram else None

    @property
    def summary(self) -> str:
        """One line: where the roofs come from."""
        measured = [k for k, v in self.sources.items() if v == "measured"]
        listed = [k for k, v in self.sources.items() if v == "datasheet"]
        parts = []
        if measured:
            parts.append(
                f"measured on this {self.device} by the counter run's calibration kernels: "
                + ", ".join(measured)
            )
        if listed:
            parts.append(f"from the {self.datasheet_name} datasheet table: " + ", ".join(listed))
        if not parts:
            return f"no peaks: {self.device} is not in the datasheet table and none was measured"
        return "peaks " + "; ".join(parts)


def datasheet(device: str) -> tuple[str | None, dict[str, float]]:
    """(table entry, its peaks) for a device name such as ``NVIDIA H200``."""
    for name, values in DATASHEETS:
        if name.lower() in device.lower():
            return name, dict(values)
    return None, {}


def resolve(device: str, measured: dict[str, Any] | None) -> Peaks:
    """Measured roofs where the counter run has them (positive numbers), else the datasheet's."""
    name, sheet = datasheet(device)
    taken = {
        k: float(v)
        for k, v in (measured or {}).items()
        if k in ROOFS and isinstance(v, (int, float)) and v > 0
    }
    values, sources = {}, {}
    for roof in ROOFS:
        if roof in taken:
            values[roof], sources[roof] = taken[roof], "measured"
        elif roof in sheet:
            values[roof], sources[roof] = sheet[roof], "datasheet"
    return Peaks(device, values, sources, sheet, taken, name)


def peaks_table(peaks: Peaks) -> pa.Table:
    """roof, what, unit (TFLOP/s or TB/s), datasheet, measured, used, source."""
    rows = []
    for roof, what in ROOFS.items():
        if roof not in peaks.datasheet and roof not in peaks.measured:
            continue
        rows.append(
            {
                "roof": roof,
                "what": what,
                "unit": "TB/s" if roof == "dram" else "TFLOP/s",
                "datasheet": _tera(peaks.datasheet.get(roof)),
                "measured": _tera(peaks.measured.get(roof)),
                "used": _tera(peaks.values.get(roof)),
                "source": peaks.sources.get(roof),
            }
        )
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("roof", pa.string()),
                ("what", pa.string()),
                ("unit", pa.string()),
                ("datasheet", pa.float64()),
                ("measured", pa.float64()),
                ("used", pa.float64()),
                ("source", pa.string()),
            ]
        ),
    )


def _tera(value: float | None) -> float | None:
    return value / _T if value else None
