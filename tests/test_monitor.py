from __future__ import annotations

from pathlib import Path

import pytest

from tracer.monitor import FIELDS, GpuMonitor, MonitorSamples, summarize


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
