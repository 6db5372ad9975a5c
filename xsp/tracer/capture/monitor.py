"""The GPU monitor: an NVML sampling thread that runs with any level set, cheaply.

Every ``interval_s`` (at least 100 ms: GPM windows shorter than that are noise) it reads power,
energy, SM and memory clocks, clock-event (throttle) reasons, memory used and NVML's plain
utilization, and on Hopper the GPM metrics between this sample and the last: SM active (DCGM
SMACT), SM occupancy (SMOCC), graphics active (GRACT), tensor active, DRAM bandwidth, FP32/FP16
and PCIe traffic. Plain "GPU utilization" is the share of time any kernel ran; SM active and
occupancy say how much of the GPU those kernels used, which is why both are kept.

Without NVML (a CPU run) or without GPM (pre-Hopper GPUs) the monitor says so and carries on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from typing import Any

from xsp.core.records import FIELDS, GPM_METRICS, MonitorSamples

__all__ = ["MIN_INTERVAL_S", "GpuMonitor"]

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1


class GpuMonitor:
    def __init__(self, device_index: int = 0, interval_s: float = MIN_INTERVAL_S) -> None:
        self.interval_s = max(interval_s, MIN_INTERVAL_S)
        self.device_index = device_index
        self.samples = MonitorSamples()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._gpm: list[Any] = []
        self._started_ns = 0

    def start(self) -> str | None:
        """Start sampling; return why not, when NVML is missing (and carry on)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, no device...
            self.samples.unavailable = f"NVML is not available, so the GPU monitor is off: {exc}"
            log.warning("xsp: %s", self.samples.unavailable)
            return self.samples.unavailable
        self._nvml = pynvml
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(self._handle)
            if not support.isSupportedDevice:
                raise RuntimeError("this GPU has no GPM (Hopper or newer needed)")
            self._gpm = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(self._handle, self._gpm[0])
        except Exception as exc:
            self.samples.gpm_unavailable = f"GPM metrics are off: {exc}"
            log.info("xsp: %s", self.samples.gpm_unavailable)
            self._gpm = []
        self._started_ns = time.time_ns()
        self._thread = threading.Thread(target=self._run, name="xsp-monitor", daemon=True)
        self._thread.start()
        return None

    def stop(self) -> MonitorSamples:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            # Close the last window, unless it is too short to mean anything (GPM divides by it).
            last = self.samples.time_ns[-1] if self.samples.time_ns else self._started_ns
            if time.time_ns() - last >= self.interval_s * 1e9 / 2:
                self._sample()
        if self._nvml is not None:
            for sample in self._gpm:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlGpmSampleFree(sample)
            self._nvml.nvmlShutdown()
            self._nvml = None
        return self.samples

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nvml, handle = self._nvml, self._handle
        row: dict[str, float | None] = dict.fromkeys(FIELDS)
        readers = {
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "energy_j": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3,
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "memory_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "clock_event_reasons": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
            "memory_used_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used,
            "utilization_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
        }
        for name, read in readers.items():
            try:
                row[name] = float(read())
            except Exception:
                row[name] = None
        if self._gpm:
            row.update(self._gpm_window())
        self.samples.time_ns.append(time.time_ns())
        for name in FIELDS:
            self.samples.values[name].append(row[name])

    def _gpm_window(self) -> dict[str, float | None]:
        nvml = self._nvml
        previous, current = self._gpm
        try:
            nvml.nvmlGpmSampleGet(self._handle, current)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for i, constant in enumerate(GPM_METRICS.values()):
                request.metrics[i].metricId = getattr(nvml, constant)
            nvml.nvmlGpmMetricsGet(request)
            out = {}
            for i, name in enumerate(GPM_METRICS):
                value = request.metrics[i].value
                ok = request.metrics[i].nvmlReturn == 0 and not math.isnan(value)
                out[name] = value if ok else None
        except Exception as exc:
            if self.samples.gpm_unavailable is None:
                self.samples.gpm_unavailable = f"GPM read failed: {exc}"
            out = dict.fromkeys(GPM_METRICS)
        self._gpm = [current, previous]
        return out
