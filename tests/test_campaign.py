"""Campaigns on CPU: the file format, resuming after a kill, failures as results, the Ray
executor on a local Ray, the campaign store's SQL and the comparative report."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaign.executor import run_local
from campaign.spec import CampaignSpec, from_dict, load
from campaign.store import CampaignStore
from tracer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["torchvision:squeezenet1_1", "torchvision:shufflenet_v2_x0_5", "torchvision:mnasnet0_5"]


def _toml(path: Path, models: list[str], batches: tuple[int, ...] = (1, 2)) -> Path:
    names = ", ".join(f'"{m}"' for m in models)
    path.write_text(
        f"""[campaign]
name = "test"
device = "cpu"
batch_sizes = {list(batches)}
level_sets = ["M"]
iterations = 1
warmup = 0
[models]
names = [{names}]
"""
    )
    return path


def _run_on_cpu(
    tmp_path: Path,
    models: list[str],
    batch_sizes: list[int],
    level_sets: list[str],
    iterations: int = 1,
    warmup: int = 0,
) -> tuple[CampaignSpec, CampaignStore, list[dict]]:
    """A campaign run in this process by the local executor; (spec, store, job records)."""
    section = {"device": "cpu", "batch_sizes": batch_sizes, "level_sets": level_sets}
    section.update(iterations=iterations, warmup=warmup)
    spec = from_dict({"campaign": section, "models": {"names": models}})
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    records: list[dict] = []
    run_local(spec, store, spec.jobs(), records.append)
    return spec, store, records


def _xsp(*args: str, **kwargs) -> subprocess.Popen:  # type: ignore[no-untyped-def, type-arg]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "xsp", *args], env=env, text=True, start_new_session=True, **kwargs
    )


def test_campaign_files_expand_into_jobs_and_bad_ones_name_the_problem(tmp_path: Path) -> None:
    spec = load(ROOT / "campaigns" / "smoke.toml")
    assert spec.device == "cpu" and len(spec.jobs()) == 6
    assert spec.jobs()[0].id == "torchvision-squeezenet1_1__infer__b1"
    default = load(ROOT / "campaigns" / "default.toml")
    assert len(default.models) >= 65 and sorted(default.batch_sizes) == [1, 16, 64]
    assert default.level_sets == ["M", "MF", "MFLG"]
    selected = from_dict({"models": {"select": [{"source": "transformers", "task": "seq2seq"}]}})
    assert selected.models == ["transformers:t5", "transformers:bart"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[campaign]\nbatch_size = [1]\n[models]\nnames = ["torchvision:resnet18"]\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: unknown \[campaign\] keys \['batch_size'\]"):
        load(bad)
    bad.write_text("[campaign\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load(bad)


def test_a_killed_campaign_resumes_without_redoing_finished_jobs(tmp_path: Path) -> None:
    campaign_file = _toml(tmp_path / "c.toml", SMALL)
    out = tmp_path / "C"
    first = _xsp(
        "campaign",
        "run",
        str(campaign_file),
        "--out",
        str(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(list((out / "jobs").glob("*.json"))) < 2:
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)  # midway: the driver and its level-set processes
    first.wait()
    finished = {p.name: json.loads(p.read_text()) for p in (out / "jobs").glob("*.json")}
    assert 2 <= len(finished) < 6
    second = _xsp(
        "campaign",
        "run",
        str(campaign_file),
        "--out",
        str(out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output
    assert f"{len(finished)} done, running {6 - len(finished)}" in output
    results = {p.name: json.loads(p.read_text()) for p in (out / "jobs").glob("*.json")}
    assert len(results) == 6 and all(r["status"] == "ok" for r in results.values())
    for name, record in finished.items():  # untouched by the rerun
        assert results[name]["started"] == record["started"]
    con = CampaignStore(out).connect()
    per_model = con.sql(
        "SELECT model, count(*) AS n, min(latency_ms) > 0 AS timed FROM jobs GROUP BY model"
    ).fetchall()
    assert sorted(per_model) == sorted((m, 2, True) for m in SMALL)
    steps = con.sql("SELECT count(*) FROM spans WHERE kind = 'step'").fetchall()
    assert steps == [(6,)]
    query = _xsp(
        "campaign",
        "sql",
        str(out),
        "SELECT model, batch_size FROM jobs ORDER BY 1, 2",
        "--csv",
        stdout=subprocess.PIPE,
    )
    rows = query.communicate(timeout=120)[0].splitlines()
    assert rows == ["model,batch_size", *(f"{m},{b}" for m in sorted(SMALL) for b in (1, 2))]


def test_failures_are_recorded_with_their_reason_and_the_campaign_moves_on(
    tmp_path: Path,
) -> None:
    spec, store, records = _run_on_cpu(
        tmp_path, ["torchvision:nosuchnet", "timm:nosuchnet"], [1], ["M"], warmup=0
    )
    assert len(records) == 2
    for record in records:
        assert record["status"] == "failed" and record["reason"] == "unsupported"
        assert "unknown model" in record["error"]
    assert {j.id for j in store.pending(spec.jobs())} == {j.id for j in spec.jobs()}  # retried


def test_jobs_in_a_lane_overlap_but_never_measure_while_another_job_runs(tmp_path: Path) -> None:
    spec, store, records = _run_on_cpu(
        tmp_path,
        ["torchvision:squeezenet1_1", "torchvision:nosuchnet"],
        [1, 2],
        ["M", "MF"],
        iterations=2,
        warmup=1,
    )
    assert sorted(r["status"] for r in records) == ["failed", "failed", "ok", "ok"]
    runs = []  # run.json of every level-set run, in job order
    for job in spec.jobs():
        manifest = store.run_dir(job) / "manifest.json"
        if manifest.exists():
            for entry in json.loads(manifest.read_text())["runs"]:
                runs.append(
                    json.loads((store.run_dir(job) / entry["levels"] / "run.json").read_text())
                )
    assert len(runs) == 4
    # each run after the first started ahead of its turn: it has a "ready" mark, where it
    # waited; its levels came on only once the run before had finished
    assert ["ready" in run["phases_ns"] for run in runs] == [False, True, True, True]
    for before, after in itertools.pairwise(runs):
        assert after["phases_ns"]["levels_on"] > before["finished_ns"]


def test_ray_executor_runs_the_campaign_on_a_local_ray_and_the_report_links_each_run(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray")
    from campaign.executor import run_ray
    from campaign.report import write_campaign_report

    spec = load(_toml(tmp_path / "c.toml", ["torchvision:squeezenet1_1"], (1, 2)))
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    records: list[dict] = []
    run_ray(spec, store, spec.jobs(), lambda r: (store.save(r), records.append(r)))
    assert sorted(r["job"] for r in records) == sorted(j.id for j in spec.jobs())
    assert all(r["status"] == "ok" and r["host"] for r in records), records
    for job in spec.jobs():  # the runs came back from the workers into the campaign store
        assert (store.run_dir(job) / "M" / "run.json").exists()
    report = tmp_path / "C" / "report.html"
    assert write_campaign_report(store, report) == 2
    page = report.read_text()
    assert "runs/torchvision-squeezenet1_1__infer__b1/report.html" in page
    assert (store.run_dir(spec.jobs()[0]) / "report.html").exists()
    assert "Batch scaling" in page and "optimal batch" in page
