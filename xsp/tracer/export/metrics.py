"""GPU monitor samples -> OpenTelemetry metrics (OTLP), named after the ``hw.*`` semantic
conventions where one exists (utilization, memory usage, power, energy) and ``xsp.gpu.*`` for the
rest (the GPM metrics: SM active, occupancy, tensor active...). One data point per sample, stamped
with the sample's time; GPM values describe the window since the previous sample.

``xsp export RUN --format otlp-metrics-json`` writes them (OTLP JSON, one line per run), which
any OTLP collector's file receiver takes; ``xsp push`` sends traces only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2

from xsp.core.otlp.attributes import key_values
from xsp.core.records import MonitorSamples
from xsp.tracer.export.metrics_json import MetricsJson

__all__ = ["METRICS", "encode_metrics", "metrics_to_json"]

#: monitor field -> (metric name, unit, scale to the unit, attributes, monotonic sum?)
METRICS: dict[str, tuple[str, str, float, dict[str, str], bool]] = {
    "utilization_pct": ("hw.gpu.utilization", "1", 0.01, {"hw.gpu.task": "general"}, False),
    "memory_used_bytes": ("hw.gpu.memory.usage", "By", 1.0, {}, False),
    "power_w": ("hw.power", "W", 1.0, {"hw.type": "gpu"}, False),
    "energy_j": ("hw.energy", "J", 1.0, {"hw.type": "gpu"}, True),
    "sm_clock_mhz": ("xsp.gpu.clock.sm", "MHz", 1.0, {}, False),
    "memory_clock_mhz": ("xsp.gpu.clock.memory", "MHz", 1.0, {}, False),
    "clock_event_reasons": ("xsp.gpu.clock_event_reasons", "1", 1.0, {}, False),
    "sm_active_pct": ("xsp.gpu.sm_active", "1", 0.01, {}, False),
    "sm_occupancy_pct": ("xsp.gpu.sm_occupancy", "1", 0.01, {}, False),
    "graphics_active_pct": ("xsp.gpu.graphics_active", "1", 0.01, {}, False),
    "tensor_active_pct": ("xsp.gpu.tensor_active", "1", 0.01, {}, False),
    "dram_bw_pct": ("xsp.gpu.dram_bandwidth_utilization", "1", 0.01, {}, False),
    "fp32_active_pct": ("xsp.gpu.fp32_active", "1", 0.01, {}, False),
    "fp16_active_pct": ("xsp.gpu.fp16_active", "1", 0.01, {}, False),
    "pcie_tx_mb_per_s": ("xsp.gpu.pcie.transmit_rate", "MBy/s", 1.0, {}, False),
    "pcie_rx_mb_per_s": ("xsp.gpu.pcie.receive_rate", "MBy/s", 1.0, {}, False),
}


def encode_metrics(
    samples: MonitorSamples, resource: Mapping[str, object], device_index: int = 0
) -> ExportMetricsServiceRequest:
    """One request holding every sampled series that has at least one value."""
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    resource_metrics.resource.attributes.extend(key_values(resource))
    scope = resource_metrics.scope_metrics.add()
    scope.scope.name = "xsp.monitor"
    start = samples.time_ns[0] if samples.time_ns else 0
    for field, (name, unit, scale, attributes, monotonic) in METRICS.items():
        values = samples.values.get(field, [])
        points = [(t, v) for t, v in zip(samples.time_ns, values, strict=False) if v is not None]
        if not points:
            continue
        metric = scope.metrics.add(name=name, unit=unit)
        if monotonic:
            metric.sum.is_monotonic = True
            metric.sum.aggregation_temporality = (
                metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
            )
            data_points = metric.sum.data_points
        else:
            data_points = metric.gauge.data_points
        labels = key_values({"hw.id": f"gpu{device_index}", **attributes})
        for time_ns, value in points:
            point = data_points.add(time_unix_nano=time_ns, as_double=float(value) * scale)
            if monotonic:
                point.start_time_unix_nano = start
            point.attributes.extend(labels)
    return request


def metrics_to_json(request: ExportMetricsServiceRequest) -> MetricsJson:
    """The OTLP/JSON form (the file exporter's line format)."""
    return cast(MetricsJson, json_format.MessageToDict(request))
