"""A campaign job's summary reports the replayed, untraced step and its GPU figures on the
replayed timeline, as ``xsp analyze`` does; a job measured by one traced run says so (issue 52,
item 1). Figures from the committed ResNet-50 b64 training store (H200: M, MF and MFLG)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from tests.fixtures import fixture_table, write_run
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.reconstruction.reconstruct import reconstruct
from xsp.analysis.tables.kernels import temporal_breakdown, union_length
from xsp.campaign.summary import summarize

ROOT = Path(__file__).resolve().parents[1]
R50 = ROOT / "benchmarks/data/replay-h200/r50-b64-train"


def _replayed_busy_pct(store: MeasurementStore) -> list[float]:
    """Each replayed step's GPU busy share, worked out from the reconstruction's spans: the
    union of its GPU activities within the step, over the step."""
    spans, _ = reconstruct(store)
    steps = spans.filter(pc.equal(spans["kind"], "step")).to_pydict()
    gpu = spans.filter(pc.equal(spans["level"], "gpu")).to_pydict()
    iteration = np.asarray(gpu["iteration"])
    start = np.asarray(gpu["start_ns"], dtype=np.int64)
    end = start + np.asarray(gpu["dur_ns"], dtype=np.int64)
    shares = []
    for it, first, dur in zip(steps["iteration"], steps["start_ns"], steps["dur_ns"], strict=True):
        mine = iteration == it
        busy = union_length(
            np.clip(start[mine], first, first + dur), np.clip(end[mine], first, first + dur)
        )
        shares.append(100.0 * busy / dur)
    return shares


def test_a_jobs_step_and_gpu_busy_come_from_the_replayed_step() -> None:
    """Was: M's median step (33.877 ms) as the latency, and the traced G run's busy time over
    it (91.9%), two timelines mixed; now the replayed step (32.923 ms, the one ``xsp analyze``
    prints) and each replayed step's busy share, median 94.5%."""
    summary = summarize(R50)
    assert summary["step_source"] == "replayed" and summary["gpu_timeline"] == "replayed"
    assert summary["latency_ms"] == pytest.approx(32.923, abs=5e-4)
    assert summary["measured_latency_ms"] == pytest.approx(33.877, abs=5e-4)  # M's, kept
    assert summary["throughput_per_s"] == pytest.approx(64 / 0.032923, rel=1e-4)  # 1,943.9
    assert summary["step_ms"]["MFLG"] == pytest.approx(43.719, abs=5e-4)  # traced, by name
    shares = _replayed_busy_pct(MeasurementStore(R50))
    assert len(shares) == 20
    assert summary["gpu_busy_pct"] == pytest.approx(statistics.median(shares))
    assert summary["gpu_busy_pct"] == pytest.approx(94.455, abs=5e-3)
    assert summary["bound"] == "compute-bound"
    # the traced G run's own busy share, which the summary no longer reads
    traced = [r["busy_pct"] for r in temporal_breakdown(MeasurementStore(R50)).to_pylist()]
    assert max(traced) < 81 < summary["gpu_busy_pct"]


def _traced_job(tmp_path: Path) -> dict[str, Any]:
    """A job measured by one MFLG run (ResNet-18 training on a GPU): nothing to replay."""
    write_run(tmp_path / "run", "MFLG", fixture_table("resnet18_train_mflg_cuda", "MFLG"))
    summary = summarize(tmp_path / "run")
    return {
        "job": "torchvision-resnet18__train__b2",
        "model": "torchvision:resnet18",
        "mode": "train",
        "batch_size": 2,
        "status": "ok",
        "wall_s": 1.0,
        "summary": summary,
    }


def test_a_job_with_one_traced_run_says_its_figures_are_traced(tmp_path: Path) -> None:
    from xsp.campaign.files import from_dict
    from xsp.campaign.report import write_campaign_report
    from xsp.campaign.store import CampaignStore

    record = _traced_job(tmp_path)
    summary = record["summary"]
    assert summary["step_source"] == "traced" and summary["gpu_timeline"] == "traced"
    assert summary["latency_ms"] == summary["measured_latency_ms"] == summary["step_ms"]["MFLG"]
    spec = from_dict(
        {
            "campaign": {"device": "cuda", "batch_sizes": [2], "level_sets": ["MFLG"]},
            "models": {"names": ["torchvision:resnet18"]},
        }
    )
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    store.save(record)  # type: ignore[arg-type]
    out = tmp_path / "report.html"
    write_campaign_report(store, out, run_reports=False)
    page = out.read_text()
    # the per-model table's latency, throughput and GPU busy, and the jobs table's GPU busy
    assert page.count("<span class='meta'>(traced)</span>") == 3 + 1
    assert "<td>traced</td>" in page  # the jobs table's "Step from", beside its latency
    assert "replayed, untraced step" in page


def test_campaign_diff_compares_the_measured_steps_its_verdict_needs(tmp_path: Path) -> None:
    """A diff's verdict bootstraps M's steps, so its medians are M's too (the replayed step is a
    model of it): from results alone, ``measured_latency_ms``; a record from before has only
    ``latency_ms``, M's median then."""
    import json
    import shutil

    from xsp.campaign.diff import campaign_diff
    from xsp.campaign.store import CampaignStore

    job = "torchvision-resnet50__train__b64"
    sides = {"a": {"latency_ms": 32.923, "measured_latency_ms": 33.877}, "b": {"latency_ms": 30.0}}
    for side, summary in sides.items():
        (tmp_path / side / "jobs").mkdir(parents=True)
        shutil.copy(ROOT / "benchmarks/results/campaign-h200/campaign.json", tmp_path / side)
        record = {"job": job, "model": "torchvision:resnet50", "mode": "train", "batch_size": 64}
        record.update(status="ok", summary=summary)
        (tmp_path / side / "jobs" / f"{job}.json").write_text(json.dumps(record))
    (row,) = campaign_diff(CampaignStore(tmp_path / "a"), CampaignStore(tmp_path / "b")).to_pylist()
    assert (row["before_ms"], row["after_ms"]) == (33.877, 30.0)
    assert row["change_ms"] == pytest.approx(-3.877) and row["samples"] == "medians"
