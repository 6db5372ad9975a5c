"""The OTLP/JSON metrics documents that ``metrics`` writes, as types: the messages of
``opentelemetry/proto/metrics/v1`` under protobuf's JSON mapping as ``MessageToDict`` applies it
by default (lowerCamelCase keys, 64-bit integers as strings, enums by name, defaults left out).
Only the fields xsp's monitor metrics use: gauges and cumulative sums of doubles."""

from __future__ import annotations

from typing import TypedDict

from xsp.core.otlp.json_types import KeyValueJson, ResourceJson, ScopeJson

__all__ = [
    "GaugeJson",
    "MetricJson",
    "MetricsJson",
    "NumberDataPointJson",
    "ResourceMetricsJson",
    "ScopeMetricsJson",
    "SumJson",
]


class NumberDataPointJson(TypedDict, total=False):
    attributes: list[KeyValueJson]
    startTimeUnixNano: str
    timeUnixNano: str
    asDouble: float


class GaugeJson(TypedDict, total=False):
    dataPoints: list[NumberDataPointJson]


class SumJson(TypedDict, total=False):
    dataPoints: list[NumberDataPointJson]
    aggregationTemporality: str  # the enum's name: AGGREGATION_TEMPORALITY_CUMULATIVE
    isMonotonic: bool


class MetricJson(TypedDict, total=False):
    name: str
    unit: str
    gauge: GaugeJson
    sum: SumJson


class ScopeMetricsJson(TypedDict, total=False):
    scope: ScopeJson
    metrics: list[MetricJson]


class ResourceMetricsJson(TypedDict, total=False):
    resource: ResourceJson
    scopeMetrics: list[ScopeMetricsJson]


class MetricsJson(TypedDict, total=False):
    """An ExportMetricsServiceRequest: one line of ``--format otlp-metrics-json``."""

    resourceMetrics: list[ResourceMetricsJson]
