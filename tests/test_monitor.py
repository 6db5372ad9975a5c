from __future__ import annotations

from pathlib import Path

import pytest

from xsp.core.records import FIELDS, MonitorSamples
from xsp.tracer.capture.monitor import GpuMonitor
from xsp.tracer.convert.monitor import summarize


def _samples(times: list[int], power: list[float | None]) -> MonitorSamples:
    samples = MonitorSamples(time_ns=times)
    samples.values = {name: [None] * len(times) for name in FIELDS}
    samples.values["power_w"] = power
    samples.values["sm_active_pct"] = [50.0, None, 70.0, 90.0]
    return samples


def test_steps_take_the_samples_inside_them_or_the_window_that_covers_them() -> None:
    samples = _samples([100, 200, 300, 400], [10.0, 20.0, 30.0, 40.0])
    out = summarize(samples, starts=[50, 310, 500], ends=[250, 320, 600])
    assert out["power_w"] == [15.0, 40.0, None]  # mean inside; next sample; none after
    assert out["sm_active_pct"] == [50.0, 90.0, None]  # a missing GPM value is skipped
    assert out["dram_bw_pct"] == [None, None, None]


def test_without_nvml_the_monitor_says_so_and_carries_on(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: NVML is there")
    monitor = GpuMonitor()
    reason = monitor.start()
    assert reason is not None and reason.startswith("NVML is not available")
    assert monitor.stop().time_ns == []


def test_real_h200_samples_summarize_onto_a_step() -> None:
    """Two samples taken during ResNet-50 training (b64, fp32) on the H200; the second closed a
    43 ms window after the run and reads idle. A step around the first sample takes its values."""
    import pyarrow.parquet as pq

    table = pq.read_table(Path(__file__).parent / "data/monitor_r50_train_b64_h200/monitor.parquet")
    columns = table.to_pydict()
    samples = MonitorSamples(time_ns=columns.pop("time_ns"))
    samples.values = {name: columns[name] for name in FIELDS}
    first = samples.time_ns[0]
    out = summarize(samples, starts=[first - 10], ends=[first + 10])
    assert out["power_w"] == [pytest.approx(191.532)]
    assert out["utilization_pct"] == [97.0]  # NVML: "a kernel was running" ...
    assert out["sm_active_pct"][0] == pytest.approx(42.8, abs=0.1)  # ... on 43% of the SMs
    assert out["sm_occupancy_pct"][0] == pytest.approx(20.3, abs=0.1)


def test_h200_samples_export_as_otlp_metrics_with_hw_gpu_names() -> None:
    import pyarrow.parquet as pq

    from xsp.tracer.export.metrics import encode_metrics, metrics_to_json

    columns = pq.read_table(
        Path(__file__).parent / "data/monitor_r50_train_b64_h200/monitor.parquet"
    ).to_pydict()
    samples = MonitorSamples(time_ns=columns.pop("time_ns"), values=columns)
    request = encode_metrics(samples, {"service.name": "xsp"}, device_index=0)
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.power", "hw.energy"} <= set(metrics)
    assert {"xsp.gpu.sm_active", "xsp.gpu.sm_occupancy", "xsp.gpu.tensor_active"} <= set(metrics)
    util = metrics["hw.gpu.utilization"].gauge.data_points
    assert len(util) == len(samples.time_ns) and all(0.0 <= p.as_double <= 1.0 for p in util)
    assert util[0].time_unix_nano == samples.time_ns[0]
    energy = metrics["hw.energy"].sum
    assert (
        energy.is_monotonic and energy.data_points[-1].as_double >= energy.data_points[0].as_double
    )
    power = metrics["hw.power"].gauge.data_points[0]
    assert {(a.key, a.value.string_value) for a in power.attributes} == {
        ("hw.id", "gpu0"),
        ("hw.type", "gpu"),
    }
    assert metrics_to_json(request)["resourceMetrics"][0]["scopeMetrics"][0]["scope"] == {
        "name": "xsp.monitor"
    }
