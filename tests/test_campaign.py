"""Campaigns on CPU: the file format, resuming after a kill, failures as results, the Ray
executor on a local Ray, the campaign store's SQL and the comparative report."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from xsp.campaign.executor import run_local
from xsp.campaign.files import from_dict, load
from xsp.campaign.spec import CampaignSpec
from xsp.campaign.store import CampaignStore
from xsp.core.errors import ConfigError, DeviceError, WorkloadError

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["torchvision:squeezenet1_1", "torchvision:shufflenet_v2_x0_5", "torchvision:mnasnet0_5"]


def _toml(
    path: Path, models: list[str], batches: tuple[int, ...] = (1, 2), iterations: int = 1
) -> Path:
    names = ", ".join(f'"{m}"' for m in models)
    path.write_text(
        f"""[campaign]
name = "test"
device = "cpu"
batch_sizes = {list(batches)}
level_sets = ["M"]
iterations = {iterations}
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
    # TOML's types are kept: a string or a bool where a number belongs is refused, not converted
    models = {"names": ["torchvision:resnet18"]}
    for campaign, message in (
        ({"iterations": "two"}, "bad iterations 'two': give an integer"),
        ({"iterations": 2.7}, "bad iterations 2.7: give an integer"),
        ({"batch_sizes": 1}, r"bad batch_sizes 1: give a list of integers"),
        ({"batch_sizes": [True]}, r"bad batch_sizes \[True\]: give a list of integers"),
        ({"batch_sizes": ["1"]}, r"bad batch_sizes \['1'\]: give a list of integers"),
        ({"modes": "train"}, "bad modes 'train': give a list of strings"),
    ):
        with pytest.raises(ConfigError, match=message):
            from_dict({"campaign": campaign, "models": models})
    twice = from_dict({"campaign": {"batch_sizes": [1, 1, 16]}, "models": models})
    assert [job.batch_size for job in twice.jobs()] == [1, 16]  # each job once


def test_a_killed_campaign_resumes_without_redoing_finished_jobs(tmp_path: Path) -> None:
    # jobs long enough (30 iterations) that the kill lands midway: at one iteration each, the
    # campaign could end between two looks at its records
    campaign_file = _toml(tmp_path / "c.toml", SMALL, iterations=30)
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
        time.sleep(0.05)
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
    assert steps == [(6 * 30,)]  # six jobs, 30 measured iterations each
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
    # the README's queries run on a campaign none of whose jobs measured anything
    for record in records:
        store.save(record)  # as `xsp campaign run` does when each job ends
    con = store.connect()
    rows = con.sql("SELECT model, batch_size, latency_ms FROM jobs ORDER BY 1").fetchall()
    assert rows == [("timm:nosuchnet", 1, None), ("torchvision:nosuchnet", 1, None)]
    assert con.sql("SELECT count(*) FROM spans WHERE kind = 'step'").fetchall() == [(0,)]


def test_an_error_is_classified_by_its_type_and_a_level_sets_output_by_its_text() -> None:
    """Raised in this process (refused before the job ran): its type says the reason. A level
    set runs in a process of its own, whose failure arrives as text (stderr, run.json)."""
    from xsp.campaign.jobs import classify_error, classify_output

    assert classify_error(WorkloadError("bad model name 'resnet'")) == "unsupported"
    assert classify_error(DeviceError("--device cuda: no CUDA GPU is visible")) == "device"
    assert classify_error(ConfigError("bad --iterations 0: must be at least 1")) == "failed"
    assert classify_output("torch.OutOfMemoryError: CUDA out of memory.") == "out-of-memory"
    assert classify_output("xsp.core.errors.WorkloadError: cannot build x") == "unsupported"
    assert classify_output("level set MF: exit -11") == "failed"


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
    # each job's M after the first started ahead of its turn: it has a "ready" mark, where it
    # waited; MF ran next in M's process (XSP_SHARE_PROCESS); no levels came on before the
    # run before had finished
    assert ["ready" in run["phases_ns"] for run in runs] == [False, False, True, False]
    for before, after in itertools.pairwise(runs):
        assert after["phases_ns"]["levels_on"] > before["finished_ns"]


def test_a_committed_attempt_replaces_the_run_directory_whole(tmp_path: Path) -> None:
    # a Ray job writes aside and commits once: a later attempt's commit replaces an earlier
    # one's run directory as a whole, and leaves nothing of it behind
    store = CampaignStore(tmp_path / "C")
    job = from_dict({"models": {"names": ["torchvision:resnet18"]}}).jobs()[0]
    first = store.stage(job, "host-1-aaaaaa")
    (first / "M").mkdir()
    (first / "M" / "old.parquet").write_text("first")
    store.commit(job, first)
    second = store.stage(job, "host-2-bbbbbb")
    (second / "M").mkdir()
    (second / "M" / "new.parquet").write_text("second")
    assert [p.name for p in store.attempts(job)] == ["host-2-bbbbbb"]
    store.commit(job, second)
    assert [p.name for p in store.run_dir(job).rglob("*")] == ["M", "new.parquet"]
    assert store.attempts(job) == []
    store.clear_staging(job)
    assert not (store.staging_dir / job.id).exists()


def test_ray_executor_runs_the_campaign_on_a_local_ray_and_the_report_links_each_run(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray")
    from xsp.campaign.ray_executor import run_ray
    from xsp.campaign.report import write_campaign_report

    spec = load(_toml(tmp_path / "c.toml", ["torchvision:squeezenet1_1"], (1, 2)))
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    records: list[dict] = []
    run_ray(spec, store, spec.jobs(), lambda r: (store.save(r), records.append(r)))
    assert sorted(r["job"] for r in records) == sorted(j.id for j in spec.jobs())
    assert all(r["status"] == "ok" and r["host"] and r["attempt"] == 1 for r in records), records
    for job in spec.jobs():  # each worker put its run in the campaign store; nothing left aside
        assert (store.run_dir(job) / "M" / "run.json").exists()
    assert not list(store.staging_dir.glob("*/*"))
    report = tmp_path / "C" / "report.html"
    assert write_campaign_report(store, report) == 2
    page = report.read_text()
    assert "href='reports/torchvision-squeezenet1_1__infer__b1.html'" in page
    assert (tmp_path / "C" / "reports" / f"{spec.jobs()[0].id}.html").exists()
    assert not (store.run_dir(spec.jobs()[0]) / "report.html").exists()  # runs hold runs only
    assert "Batch scaling" in page and "Optimal batch" in page


# -- the comparative report, from job records alone ------------------------------------------
H200 = ROOT / "benchmarks" / "results" / "campaign-h200"


class _Page(HTMLParser):
    """The report's outline: section ids in order, where the first table and the first figure
    start, and each table's header and body rows as cell texts (with each cell's attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.first: dict[str, int] = {}  # "table" / "figure" -> number of sections seen before
        self.tables: dict[str, dict[str, list[list[tuple[str, dict[str, str | None]]]]]] = {}
        self._table: str | None = None
        self._part = ""
        self._cell: list[str] | None = None
        self._attrs: dict[str, str | None] = {}
        self.titles: list[str] = []  # title= of spans inside table cells

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section":
            self.sections.append(str(found.get("id")))
        elif tag == "table":
            self.first.setdefault("table", len(self.sections))
            self._table = str(found.get("id"))
            self.tables[self._table] = {"thead": [], "tbody": []}
        elif tag == "div" and "plotly-graph-div" in str(found.get("class")):
            self.first.setdefault("figure", len(self.sections))
        elif tag in ("thead", "tbody"):
            self._part = tag
        elif tag == "tr" and self._table:
            self.tables[self._table][self._part].append([])
        elif tag in ("td", "th") and self._table:
            self._cell, self._attrs = [], found
        elif tag == "span" and self._cell is not None and found.get("title"):
            self.titles.append(str(found["title"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][self._part][-1].append(("".join(self._cell), self._attrs))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _outline(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def _job(
    model: str, batch: int, latency_ms: float | None, busy: float | None = None, **summary: Any
) -> dict[str, Any]:
    """A job record as a campaign writes it; the summary's figures follow from the arguments."""
    record: dict[str, Any] = {"job": f"{model.replace(':', '-')}__infer__b{batch}"}
    record["model"] = model
    record.update(mode="infer", batch_size=batch, wall_s=9.0)
    if latency_ms is None:
        return {**record, "status": "failed", "reason": "unsupported", "error": "unknown model"}
    bound = "compute-bound" if busy and busy >= 80 else "launch-bound"
    record["status"] = "ok"
    record["summary"] = {
        "latency_ms": latency_ms,
        "throughput_per_s": batch / (latency_ms / 1e3),
        "step_ms": {"M": latency_ms, "MF": 2 * latency_ms},
        "gpu_busy_pct": busy,
        "median_kernel_us": 2.0 * batch,
        "bound": bound,
        "suggestions": ["launch-bound"] if bound == "launch-bound" else [],
        **summary,
    }
    return record


CUTLASS = (
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nhwc_align4>"
    "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nhwc_align4::Params)"
)
SMALL_CAMPAIGN = [
    _job("torchvision:resnet50", 1, 5.0, 20.0),
    _job(
        "torchvision:resnet50",
        16,
        8.0,
        90.0,
        conv_share_pct=48.0,
        top_kernels=[[CUTLASS, 40.0]],
        top_layer_types=[["Conv2d", 48.0], ["BatchNorm2d", 37.0]],
    ),
    _job("torchvision:resnet18", 1, 2.0, 10.0),
    _job("torchvision:resnet18", 16, 4.0, 85.0, conv_share_pct=50.0),
    _job("transformers:bert", 1, 10.0, 85.0),
    _job("transformers:bert", 16, 20.0, 95.0, conv_share_pct=0.0),
    _job("torchvision:nosuchnet", 1, None),
    _job("torchvision:nosuchnet", 16, None),
]


def _small_report(tmp_path: Path) -> str:
    from xsp.campaign.report import write_campaign_report

    models = sorted({r["model"] for r in SMALL_CAMPAIGN})
    spec = from_dict(
        {
            "campaign": {"device": "cuda", "batch_sizes": [1, 16], "level_sets": ["M", "MF"]},
            "models": {"names": models},
        }
    )
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    for record in SMALL_CAMPAIGN:
        store.save(record)
    out = tmp_path / "report.html"
    assert write_campaign_report(store, out, run_reports=False) == len(SMALL_CAMPAIGN)
    return out.read_text()


def test_campaign_report_leads_with_findings_then_one_row_per_model_then_every_job(
    tmp_path: Path,
) -> None:
    page = _small_report(tmp_path)
    outline = _outline(page)
    assert outline.sections == ["findings", "figures", "scaling", "per-model", "jobs"]
    assert outline.first == {"figure": 2, "table": 4}  # no table, no chart before the findings
    assert page.index("<h1>") < page.index("<section id='findings'>")
    findings = re.sub(r"<[^>]+>", "", page[: page.index("<section id='figures'>")])
    # 3 workloads ran; at batch 1 resnet50 (20% busy) and resnet18 (10%) are launch-bound and
    # bert (85%) compute-bound; at 16 all three are above 80%
    assert "6 of 8 jobs ok: 4 workloads × batch 1, 16. Failed: unsupported (2)" in findings
    assert "launch-bound: 2 of 3 at batch 1, 0 of 3 at 16" in findings
    assert "compute-bound: 1 at batch 1, 3 at 16" in findings
    assert "Compute-bound already at batch 1: bert." in findings
    # throughput at 16: 16 / 8 ms = 2,000, 16 / 4 ms = 4,000, 16 / 20 ms = 800 items/s
    assert "Best throughput: batch 16 for 3 of 3 workloads." in findings
    assert "at batch 16 from 800 items/s (bert) to 4,000 (resnet18)" in findings
    assert "highest resnet18 50%, resnet50 48%, bert 0%; none in 1 (bert)" in findings
    assert "MF 2.00× at batch 1, 2.00× at 16" in findings  # every MF step is twice its M step

    per_model = outline.tables["per-model-table"]
    top, bottom = (
        [text for text, _ in row] for row in per_model["thead"]
    )  # group headings over batch sizes
    assert top[:6] == [
        "Model",
        "Family",
        "Latency (ms)",
        "Throughput (items/s)",
        "GPU busy (%)",
        "Bound",
    ]
    assert bottom == ["batch 1", "batch 16"] * 4
    rows = {row[0][0]: [text for text, _ in row] for row in per_model["tbody"]}
    assert list(rows) == [  # family by family: ResNets, then text encoders, then the unknown
        "torchvision:resnet18",
        "torchvision:resnet50",
        "transformers:bert",
        "torchvision:nosuchnet",
    ]
    assert rows["torchvision:resnet50"][:10] == [
        "torchvision:resnet50",
        "ResNet and ResNeXt",
        "5",  # latency at b1, b16: integers without decimals
        "8",
        "200",  # throughput: 1 / 5 ms, 16 / 8 ms
        "2,000",
        "20",
        "90",
        "launch",
        "compute",
    ]
    assert rows["torchvision:nosuchnet"][1:4] == ["Other torchvision", "", ""]
    assert rows["torchvision:nosuchnet"][8:10] == ["failed", "failed"]

    jobs = outline.tables["jobs-table"]
    assert len(jobs["tbody"]) == len(SMALL_CAMPAIGN)
    headers = [text.strip() for text, _ in jobs["thead"][0]]
    assert headers[:7] == [
        "Model",
        "Mode",
        "Batch",
        "Status",
        "Latency (ms)",
        "Step from",  # replayed, M or traced (tests/test_campaign_summary.py)
        "Throughput (items/s)",
    ]
    assert all(attrs.get("data-col") == str(i) for i, (_, attrs) in enumerate(jobs["thead"][0]))
    first = [text for text, _ in jobs["tbody"][0]]
    assert first[:7] == ["torchvision:nosuchnet", "infer", "1", "failed: unsupported", "", "", ""]
    kernels = [row[-1][0] for row in jobs["tbody"]]
    assert "cutlass::Kernel<…> 40%" in kernels
    assert outline.titles == [CUTLASS]  # the whole name on hover
    assert page.rindex("</table>") > page.index("<section id='jobs'>")  # nothing after the jobs
    assert "<input type='search' data-filter='jobs-table'" in page
    assert not re.search(r">\d+\.\d*0<", page)  # no trailing zeros such as 20.000
    assert "<script src" not in page.lower()  # self-contained: plotly.js is inline


def test_batch_scaling_is_drawn_as_small_multiples_one_panel_per_family() -> None:
    from xsp.campaign import compare
    from xsp.campaign.report import plot_scaling

    rows = compare.per_model(SMALL_CAMPAIGN)
    figure = plot_scaling(rows, [1, 16], compare.display_names(SMALL_CAMPAIGN))
    panels: dict[tuple[str, str], list[str]] = {(t.xaxis, t.yaxis): [] for t in figure.data}
    for trace in figure.data:
        panels[(trace.xaxis, trace.yaxis)].append(trace.name)
    assert list(panels.values()) == [["resnet18", "resnet50"], ["bert"]]
    assert [a.text for a in figure.layout.annotations] == [
        "ResNet and ResNeXt",
        "Text encoders (BERT-like)",
    ]
    assert list(figure.data[0].y) == [500.0, 4000.0]  # 1 / 2 ms, 16 / 4 ms


def test_the_h200_campaign_report_has_one_row_per_model_and_a_panel_per_family(
    tmp_path: Path,
) -> None:
    from xsp.campaign import compare
    from xsp.campaign.report import plot_scaling, write_campaign_report

    store = CampaignStore(H200)
    out = tmp_path / "report.html"
    assert write_campaign_report(store, out, run_reports=False) == 210
    outline = _outline(out.read_text())
    assert outline.sections[0] == "findings" and outline.sections[-1] == "jobs"
    assert len(outline.tables["per-model-table"]["tbody"]) == 70
    assert len(outline.tables["jobs-table"]["tbody"]) == 210
    findings = out.read_text().split("<section id='figures'>")[0]
    # FINDINGS.md's hand count: launch-bound 61, 30 and 4 of 70 models at batch 1, 16 and 64
    assert "launch-bound: 61 of 70 at batch 1, 30 of 70 at 16, 4 of 70 at 64" in findings
    assert "batch 64 for 69 of 70 workloads; albert (batch 16)" in findings
    results = store.results()
    figure = plot_scaling(compare.per_model(results), [1, 16, 64], compare.display_names(results))
    per_panel = Counter(t.xaxis for t in figure.data)
    assert len(per_panel) == 12 and sum(per_panel.values()) == 70 and max(per_panel.values()) <= 11


def test_kernel_names_shorten_numbers_drop_needless_decimals_and_models_find_families() -> None:
    from xsp.analysis.figures.present import short_kernel
    from xsp.campaign.names import family
    from xsp.campaign.report import number

    assert short_kernel(CUTLASS) == "cutlass::Kernel<…>"
    assert short_kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8") == (
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8"
    )
    # as a job summary keeps it: cut at 80 characters, inside a template
    cut = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, floa"
    assert short_kernel(cut) == "at::native::vectorized_layer_norm_kernel<…>"
    assert short_kernel("x" * 70) == "x" * 59 + "…"  # no boundary: cut at the limit
    # a long untemplated name ends after a boundary, never inside a word
    wgrad = "sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
    assert short_kernel(wgrad) == "sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_…"
    assert short_kernel("void f<a<b>, c>(int)", limit=80) == "f<…>"
    assert [number(v) for v in (20, 20.0, 19.9996, 3.2141, 4978.04, 0.0173, None)] == [
        "20",
        "20",
        "20",
        "3.21",
        "4,978",
        "0.02",
        "",
    ]
    assert family("timm:cspresnet50") == family("torchvision:resnet50") == "ResNet and ResNeXt"
    assert family("transformers:distilbert") == "Text encoders (BERT-like)"
    assert family("timm:levit_128") == family("transformers:vit") == "Vision transformers"
    assert family("torchvision:mobilenet_v3_small") == "Mobile CNNs"
    assert family("torchvision:nosuchnet") == "Other torchvision"


def test_a_campaign_whose_jobs_all_failed_exits_1_and_says_how_many(tmp_path: Path) -> None:
    campaign_file = _toml(tmp_path / "c.toml", ["torchvision:nosuchnet"], batches=(1, 2))
    done = _xsp(
        "campaign", "run", str(campaign_file), "--out", str(tmp_path / "C"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, stderr = done.communicate(timeout=300)
    assert done.returncode == 1, stderr
    assert "2 of 2 jobs failed" in stderr.strip().splitlines()[-1]


def test_a_campaign_logged_to_a_file_says_each_job_as_it_ends(tmp_path: Path) -> None:
    """No terminal, no bar to watch: one line per finished job, with how far the campaign is,
    the job's wall time and each level-set process's seconds from its record."""
    import json

    from xsp.campaign.summary import job_line

    record = {
        "job": "timm-x__infer__b1",
        "status": "ok",
        "wall_s": 3.44,
        "seconds_by_level_set": {"M": {"total": 1.02}, "MF": {"total": 1.66}},
    }
    assert job_line(record, 12, 105, 41.3) == (
        "[12/105 41 s] timm-x__infer__b1 ok 3.4 s: M 1.0 s, MF 1.7 s"
    )
    campaign_file = _toml(tmp_path / "c.toml", ["torchvision:squeezenet1_1"], batches=(1, 2))
    out = tmp_path / "C"
    done = _xsp(
        "campaign", "run", str(campaign_file), "--out", str(out),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, stderr = done.communicate(timeout=300)
    assert done.returncode == 0, stderr
    said = [line for line in stderr.splitlines() if line.startswith("[")]  # with the bar
    assert [line.split("]")[0].split()[0] for line in said] == ["[1/2", "[2/2"]
    for line in said:
        job = line.split("] ")[1].split()[0]
        stored = json.loads((out / "jobs" / f"{job}.json").read_text())
        assert line.endswith(job_line(stored, 0, 0, 0).split("] ", 1)[1])
        assert ": M " in line


def test_a_level_set_past_the_time_limit_is_killed_and_the_job_recorded_as_timeout(
    tmp_path: Path,
) -> None:
    section = {"device": "cpu", "batch_sizes": [1], "level_sets": ["M"], "iterations": 100_000}
    section.update(warmup=0, timeout_s=1)
    spec = from_dict({"campaign": section, "models": {"names": ["torchvision:squeezenet1_1"]}})
    store = CampaignStore(tmp_path / "C")
    store.begin(spec)
    records: list[dict] = []
    started = time.monotonic()
    run_local(spec, store, spec.jobs(), records.append)
    assert time.monotonic() - started < 60  # 100,000 iterations would take far longer
    assert records[0]["status"] == "timeout" and records[0]["reason"] == "timeout"
    assert "timed out after 1 s" in records[0]["error"]
    assert [j.id for j in store.pending(spec.jobs())] == [spec.jobs()[0].id]  # retried


def test_a_partial_or_failed_run_is_not_a_successful_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.campaign.jobs import run_job
    from xsp.core.store import ManifestRun, Status
    from xsp.tracer.run.manifest import LeveledResult

    reasons = ("a sink failed: refused",)
    runs = (
        ManifestRun(levels="M", status=Status.OK),
        ManifestRun(levels="MF", status=Status.PARTIAL, status_reasons=reasons),
    )
    fake = LeveledResult(tmp_path / "R", "m", runs)
    monkeypatch.setattr("xsp.tracer.run.runner.run_leveled", lambda *a, **k: fake)
    spec = from_dict({"campaign": {"device": "cpu"}, "models": {"names": ["torchvision:resnet18"]}})
    record = run_job(spec, spec.jobs()[0], tmp_path / "R")
    assert record["status"] == "partial" and "a sink failed: refused" in record["error"]
    assert [r["status"] for r in record["runs"]] == ["ok", "partial"]
    fake.runs = (
        runs[0],
        dataclasses.replace(
            runs[1], status=Status.ERROR, error="conversion failed: RuntimeError: forced"
        ),
    )
    record = run_job(spec, spec.jobs()[0], tmp_path / "R")
    assert record["status"] == "failed" and "conversion failed" in record["error"]


def test_ctrl_c_puts_the_running_job_away_as_interrupted_and_a_rerun_redoes_it(
    tmp_path: Path,
) -> None:
    import json
    import signal
    import time

    campaign_file = tmp_path / "slow.toml"
    campaign_file.write_text(
        '[campaign]\nname = "slow"\ndevice = "cpu"\nbatch_sizes = [1]\nlevel_sets = ["M", "MF"]\n'
        'iterations = 100000\nwarmup = 0\n[models]\nnames = ["torchvision:squeezenet1_1"]\n'
    )
    out = tmp_path / "C"
    done = _xsp(
        "campaign", "run", str(campaign_file), "--out", str(out),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    job = "torchvision-squeezenet1_1__infer__b1"
    run_json = out / "runs" / job / "M" / "run.json"
    deadline = time.time() + 240
    while time.time() < deadline and not (
        run_json.exists() and json.loads(run_json.read_text()).get("status") == "running"
    ):
        time.sleep(0.2)
    time.sleep(2)  # measuring
    done.send_signal(signal.SIGINT)  # the campaign process alone: its lanes are threads
    _, stderr = done.communicate(timeout=180)
    assert done.returncode == 130, stderr
    manifest = json.loads((out / "runs" / job / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert json.loads(run_json.read_text())["status"] == "interrupted"  # never left "running"
    record = json.loads((out / "jobs" / f"{job}.json").read_text())
    assert record["status"] == "interrupted"
    assert CampaignStore(out).pending(load(campaign_file).jobs())[0].id == job  # rerun redoes it


def test_campaign_sql_reads_job_records_with_nested_and_empty_fields(tmp_path: Path) -> None:
    # a job's per-level-set entries hold nulls and empty lists, which pyarrow types as null
    store = CampaignStore(tmp_path / "C")
    store.jobs_dir.mkdir(parents=True)
    runs = [{"cupti": None, "levels": "M", "status_reasons": []}, {"cupti": None, "levels": "MF"}]
    summary = {"latency_ms": 2.5, "gpu_busy_pct": None}
    store.save(
        {
            "job": "j",
            "model": "m",
            "batch_size": 1,
            "status": "ok",
            "runs": runs,
            "summary": summary,
        }
    )
    rows = (
        store.connect().sql("SELECT job, latency_ms, gpu_busy_pct, len(runs) FROM jobs").fetchall()
    )
    assert rows == [("j", 2.5, None, 2)]


def test_a_resumed_job_first_kills_the_level_set_processes_its_killed_campaign_left(
    tmp_path: Path,
) -> None:
    """A level-set process with a time limit has its own process group, which a SIGKILL to the
    campaign's group misses: left running, it wrote into the run directory its rerun was
    writing ("level M recorded nothing"). Only a process that started just before its run did
    is the run's: a pid that does not match is left alone."""
    from xsp.campaign.jobs import stop_stale_processes

    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        for levels, pid, status, later_s in [
            ("M", orphan.pid, "running", 0.5),  # started 0.5 s after its process: the run's
            ("MF", other.pid, "running", 1000.0),  # its process is no run's of this job
            ("MFLG", other.pid, "ok", 0.5),  # a finished run's pid
        ]:
            (tmp_path / levels).mkdir()
            meta = {
                "status": status,
                "started_ns": int((time.time() + later_s) * 1e9),
                "resource": {"process.pid": pid},
            }
            (tmp_path / levels / "run.json").write_text(json.dumps(meta))
        assert stop_stale_processes(tmp_path) == [orphan.pid]
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for process in (orphan, other):
            process.kill()
            process.wait()
