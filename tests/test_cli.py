"""The command line, end to end, in subprocesses (as a user runs it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from xsp.core.store import Manifest, open_measurement

ROOT = Path(__file__).resolve().parents[1]


def xsp(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xsp", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "120"
    return env


def _traces(path: Path) -> list[list[dict]]:
    traces = []
    for line in path.read_text().splitlines():
        request = json.loads(line)
        spans = [
            s for rs in request["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
        ]
        assert len({s["traceId"] for s in spans}) == 1
        traces.append(spans)
    return traces


def _connected(spans: list[dict]) -> bool:
    by_id = {s["spanId"]: s for s in spans}
    roots = [s for s in spans if "parentSpanId" not in s]
    if len(roots) != 1:
        return False
    for span in spans:
        hops = 0
        while "parentSpanId" in span:
            if span["parentSpanId"] not in by_id or hops > len(spans):
                return False
            span = by_id[span["parentSpanId"]]
            hops += 1
    return True


def _unwrapped(text: str) -> list[str]:
    """The lines as printed before wrapping: a line indented by two spaces continues the one
    before it."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("  ") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def _attr(span: dict, key: str) -> object:
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


@pytest.mark.slow
def test_acceptance_resnet18_leveled_run_and_otlp_export(tmp_path: Path) -> None:
    out = tmp_path / "R"
    done = xsp(
        "run",
        "--model",
        "torchvision:resnet18",
        "--batch-size",
        "2",
        "--iterations",
        "3",
        "--levels",
        "M,MF",
        "--device",
        "cpu",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    assert "median ms" in done.stdout and "bytes per span" in done.stdout
    # by default the replayed step, one trace an iteration; --traced, the level sets' own
    replayed = xsp("export", str(out), "-o", str(tmp_path / "replayed.jsonl"))
    assert replayed.returncode == 0, replayed.stderr
    replayed_roots = [
        next(s for s in spans if "parentSpanId" not in s)
        for spans in _traces(tmp_path / "replayed.jsonl")
    ]
    assert [r["name"] for r in replayed_roots] == [
        "torchvision:resnet18 infer b2 · reconstructed"
    ] * 3
    traced = ("--traced", "--format", "otlp-json")
    exported = xsp("export", str(out), *traced, "-o", str(tmp_path / "o.jsonl"))
    assert exported.returncode == 0, exported.stderr
    traces = _traces(tmp_path / "o.jsonl")
    assert len(traces) == 6
    gz = tmp_path / "o.jsonl.gz"  # a .gz name is gzipped, as for the chrome format
    assert xsp("export", str(out), *traced, "-o", str(gz)).returncode == 0
    import gzip

    assert gzip.decompress(gz.read_bytes()) == (tmp_path / "o.jsonl").read_bytes()
    import torchvision

    named = {name for name, _ in torchvision.models.resnet18().named_modules()}
    by_levels: dict[str, int] = {}
    for spans in traces:
        assert _connected(spans)
        root = next(s for s in spans if "parentSpanId" not in s)
        levels = {_attr(s, "xsp.level") for s in spans}
        key = "MF" if "framework" in levels else "M"
        assert _attr(root, "xsp.level") == "model"
        # one name a level set, labelled as traced; the iteration is the root's attribute
        assert root["name"] == f"torchvision:resnet18 infer b2 · {key} (traced)"
        assert _attr(root, "xsp.iteration") is not None
        by_levels[key] = by_levels.get(key, 0) + 1
        if key == "MF":
            paths = {_attr(s, "xsp.module.path") for s in spans if _attr(s, "xsp.kind") == "module"}
            assert paths == named
            assert any(_attr(s, "xsp.op.name") == "aten::conv2d" for s in spans)
    assert by_levels == {"M": 3, "MF": 3}
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["ok", "ok"]
    analyzed = xsp("analyze", str(out), "--save-reconstruction", "--all")
    assert analyzed.returncode == 0, analyzed.stderr
    # the stored reconstruction exports like any run: one trace per iteration, MF's hierarchy
    rebuilt = xsp("export", str(out / "reconstructed"), "-o", str(tmp_path / "r.jsonl"))
    assert rebuilt.returncode == 0, rebuilt.stderr
    rebuilt_traces = _traces(tmp_path / "r.jsonl")
    assert len(rebuilt_traces) == 3
    root = next(s for s in rebuilt_traces[0] if "parentSpanId" not in s)
    assert root["name"].endswith("· reconstructed")
    assert "Layer types (A5)" in analyzed.stdout and "Conv2d" in analyzed.stdout


TRAIN_SCRIPT = """
    import sys
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)
    steps = int(sys.argv[1])
    for i in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if len(sys.argv) > 2 and i == int(sys.argv[2]):
            model(x)  # the next iteration has begun when the error hits
            raise RuntimeError("diverged at step %d" % i)
    print("trained", steps)
"""


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(TRAIN_SCRIPT))
    return path


def test_unmodified_script_gets_one_model_span_per_optimizer_step(tmp_path: Path) -> None:
    out = tmp_path / "S"
    done = xsp(
        "run",
        "--levels",
        "M,MF",
        "--iterations",
        "4",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--",
        "python",
        str(_script(tmp_path)),
        "8",  # the MF process: an untraced step before each of its 4 traced ones
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("trained 8") == 2  # the script ran once per level set
    # where the time went: the manifest's phases, and the whole from its start to its end
    from xsp.analysis.tables.summary import own_time_line, time_line

    manifest = json.loads((out / "manifest.json").read_text())
    whole = (manifest["finished_ns"] - manifest["created_ns"]) / 1e9
    assert all(r["seconds"]["total"] <= whole for r in manifest["runs"])
    # MF started while M finished (overlap) but switched its levels on only once M had exited
    runs = {run.levels: run.meta for run in open_measurement(out)}
    assert runs["M"]["finished_ns"] < runs["MF"]["phases_ns"]["levels_on"]
    said = [line for line in _unwrapped(done.stdout) if line.startswith("time: ")]
    assert said == [time_line(Manifest.from_json(manifest))]  # wrapped at 120 columns
    assert said[0].startswith(f"time: {whole:.1f} s in all; 2 level-set processes ")
    # and xsp run's own seconds outside it: its start-up before, the summary after
    own = manifest["runner_s"]
    assert 0 < own["before"] < 30 and 0 < own["after"] < 30
    assert own_time_line(Manifest.from_json(manifest)) in _unwrapped(done.stdout)
    assert own_time_line(Manifest.from_json(manifest)) == (
        f"xsp run itself: {own['before']:.1f} s before the level sets (start-up, checks), "
        f"{own['after']:.1f} s after them (summary)"
    )
    for run in open_measurement(out):
        spans = run.spans()
        kinds = spans.column("kind").to_pylist()
        assert kinds.count("step") == 4, run.levels
        assert run.meta["status"] == "ok"
        if run.levels == "MF":
            assert kinds.count("module") == 4 * 4
            paired = run.meta["interleaved"]
            assert paired["pairs"] == 4 and len(paired["untraced_ms"]) == 4


def test_a_script_that_raises_keeps_its_spans_and_fails_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "S"
    done = xsp(
        "run",
        "--levels",
        "MF",
        "--iterations",
        "10",
        "--warmup",
        "0",
        "--no-interleave",  # every step a traced one: the failing step is the fourth
        "--out",
        str(out),
        "--",
        "python",
        str(_script(tmp_path)),
        "5",
        "2",
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "RuntimeError: diverged at step 2" in last and str(out) in last
    run = open_measurement(out)[0]
    steps = [r for r in run.spans().to_pylist() if r["kind"] == "step"]
    assert [s["status_message"] for s in steps] == [
        None,
        None,
        None,
        "RuntimeError: diverged at step 2",
    ]
    assert run.meta["status"] == "error"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "torchvision:resnet1000"], "unknown model 'torchvision:resnet1000'"),
        (["--model", "torchvision:resnet18", "--levels", "M,XF"], "bad level set 'XF'"),
        (
            ["--model", "torchvision:resnet18", "--out", "/proc/xsp-cannot-write"],
            "cannot write to /proc/xsp-cannot-write",
        ),
        (["--", "bash", "train.sh"], "expects a Python command"),
        (
            ["--model", "torchvision:resnet18", "--levels", "M,MFLG", "--device", "cpu"],
            "level G records GPU work and needs --device cuda",
        ),
        (["--model", "keras:resnet50"], "unknown model source 'keras'"),
        (["--model", "timm:resnet18", "--device", "gpu"], "bad device 'gpu': use cpu or cuda"),
        (["--model", "timm:resnet18", "--iterations", "-1"], "bad iterations -1"),
    ],
)
def test_bad_input_gets_a_one_line_error_before_torch_is_imported(
    args: list[str], message: str
) -> None:
    """Refused at once: one line on stderr (no progress bar drawn first) and no torch imported
    (`python -X importtime` lists every import on stderr)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xsp", "run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert done.returncode == 2
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert lines[0].startswith("xsp: error: ")
    assert not [m for m in imported if m.split(".")[0] in ("torch", "torchvision", "timm")]


def test_summary_says_where_the_measurements_time_went() -> None:
    """The manifest's phases in one line (tests/test_analysis.py works the figures out)."""
    done = xsp("summary", "benchmarks/data/replay-h200/r50-b64-train")
    assert done.returncode == 0, done.stderr
    # at 120 columns, split after a comma: no figure apart from its unit
    assert done.stdout.splitlines()[-2:] == [
        "time: 3 level-set processes 32.7 s: start-up 25.0 s (77%), warm-up 2.2 s (7%), "
        "levels on 2.0 s (6%), traced 2.4 s (7%),",
        "  finish 0.7 s (2%), exit 0.3 s (1%)",
    ]


def test_summary_says_why_its_verdict_may_be_off() -> None:
    """The committed ResNet-50 store predates the probe of F's cost: it replays to 47.06 ms
    against M's 32.76 ms and reads host-bound, so the summary says why under its verdict; a
    store whose replay holds (+1.3% on a steady baseline) gets no such line, only the two that
    say why its replay is unchecked (recorded before interleaving, with M in one process)."""
    old = xsp("summary", "benchmarks/data/r50-b64-train")
    assert old.returncode == 0, old.stderr
    assert "host-bound" in old.stdout
    # on stdout beside the verdict they qualify, wrapped at 120 columns
    warned = [line for line in _unwrapped(old.stdout) if "recorded no calibration" in line]
    assert warned == [
        "xsp: warning: the MF run recorded no calibration (a store older than the probe): the "
        "host's times keep the tracer's cost, so the replayed step and its verdict overstate "
        "host work; record it again to read them"
    ]
    held = xsp("summary", "benchmarks/data/replay-h200/r50-b64-train")
    assert "unchecked: GPU-bound" in held.stdout, held.stdout
    said = [line.split(":")[2].strip() for line in held.stdout.splitlines() if "warning" in line]
    assert said == ["unchecked in-process", "unchecked across processes"], held.stdout


def test_analyze_sets_the_replay_against_the_f_processs_own_untraced_steps_too() -> None:
    """M's process can run at another speed than the F process's; the replay's line also gives
    the check within one process, 3.470 ms against the MF process's 3.476 ms untraced (-0.4%:
    each pair's traced iteration replayed with F's cost fitted to the other pairs; 19 steady of
    20), and M's interval over its three processes (ResNet-50 b1 inference on an H100,
    ``benchmarks/trusted_baseline.py``)."""
    done = xsp("analyze", "benchmarks/data/trusted-h100/b1-infer")
    assert done.returncode == 0, done.stderr
    line = " ".join(done.stdout.split())  # however wrapped
    assert (
        "replayed step 3.470 ms against M's 3.634 ms (-4.5%); iterations [0] not steady, left "
        "out in-process check: -0.4% against the MF process's untraced 3.476 ms (19 held-out of "
        "20 untraced/traced pairs; within 2%: yes) across processes: inside M's 95% interval "
        "3.244-5.370 ms over 3 processes (their medians 5.182, 3.631, 3.247 ms)"
    ) in line, line
    assert "warning" not in line


def test_models_lists_the_zoo_and_export_reports_a_missing_run(tmp_path: Path) -> None:
    listed = xsp("models", "--filter", "resnet18")
    assert listed.returncode == 0
    assert "torchvision:resnet18\tclassification" in listed.stdout
    assert "timm:resnet18\tclassification" in listed.stdout
    missing = xsp("export", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr


def test_live_otlp_export_from_a_run(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[ExportTraceServiceRequest] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = xsp(
            "run",
            "--levels",
            "M,MF",
            "--iterations",
            "3",
            "--warmup",
            "0",
            "--otlp-endpoint",
            f"http://127.0.0.1:{server.server_port}",
            "--out",
            str(tmp_path / "R"),
            "--",
            "python",
            str(_script(tmp_path)),
            "6",  # the MF process: an untraced step before each of its 3 traced ones
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    stored = sum(run.spans().num_rows for run in open_measurement(tmp_path / "R"))
    sent = [
        s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]
    # the layout for Jaeger adds each layer's backward span and each step's gradient
    # accumulation span (xsp.view.added), which no store keeps
    added = [s for s in sent if any(kv.key == "xsp.view.added" for kv in s.attributes)]
    assert len(sent) - len(added) == stored
    names = {f"{layer} (backward)" for layer in range(3)} | {"gradient accumulation"}
    assert added and {s.name for s in added} <= names
    levels = {
        kv.value.string_value
        for r in received
        for kv in r.resource_spans[0].resource.attributes
        if kv.key == "xsp.levels"
    }
    assert levels == {"M", "MF"}


def test_gpu_levels_without_a_gpu_fail_in_one_line() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: MFLG would run")
    done = xsp("run", "--model", "torchvision:resnet18", "--levels", "M,MFLG", "--device", "cuda")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert "--device cuda: no CUDA GPU is visible" in lines[0]


MEASUREMENT = Path(__file__).resolve().parents[1] / "benchmarks/data/r50-b64-train"


def test_analyze_json_holds_every_analysis_with_stable_keys() -> None:
    done = xsp("analyze", str(MEASUREMENT), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    rebuilt = document["reconstruction"]
    assert rebuilt["spans"] == 102_520 and rebuilt["spans_without_counterpart"] == 0
    # the replay, checked against M's median; this store predates the calibration, so the
    # host keeps F's cost (the MF run's 48 ms step) and the replay says it has none
    replay = rebuilt["replay"]
    assert replay["measured_run"] == "M"
    assert replay["measured_step_ms"] == pytest.approx(32.762, abs=0.001)
    assert replay["calibration"]["framework_ns_per_record"] is None
    assert replay["unsteady_iterations"] == [0]  # 234 ms against about 51 ms after
    assert replay["checks"] == {
        "activities_before_launch": 0,
        "activities_overlapping_on_a_stream": 0,
        "spans_outside_their_step": 0,
    }
    analyses = document["analyses"]
    assert {"suggestions", "level_sets", "kernels_by_name", "temporal_breakdown"} <= set(analyses)
    top = analyses["kernels_by_name"]["rows"][0]
    assert set(top) == {
        "kernel",
        "calls_per_iteration",
        "total_ms_per_iteration",
        "mean_us",
        "share_pct",
    }
    assert top["kernel"].startswith("void cudnn::bn_bw_1C11_kernel_new<")  # whole, not shortened
    gains = {r["rule"]: r["gain_ms_per_iteration"] for r in analyses["suggestions"]["rows"]}
    # its convolutions and most GEMMs run TF32 already: the fp32 CUDA-core kernels cover 0.2%
    assert set(gains) == {"layout-transposes"}


def test_analyze_reads_at_80_columns() -> None:
    import os

    done = subprocess.run(
        [sys.executable, "-m", "xsp", "analyze", str(MEASUREMENT), "--all", "--rows", "30"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80", "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = done.stdout
    assert "Gain (ms/iteration)" in text and "Calls per iter" in text  # words with units
    assert "<float" not in text and "<…>" in text  # template arguments elided
    assert "20 of 158 rows shown" not in text and "30 of 158 rows shown" in text  # cut rows noted


def test_analyze_says_what_the_tracers_cost_was_fitted_to() -> None:
    """ResNet-50 b64 channels_last (`r50-b64-train-cl-2`): the probe's cost replayed the MF
    process's steps 12% too slowly; the line under the replay says what was taken off instead."""
    done = xsp("analyze", "benchmarks/data/replay-h200/r50-b64-train-cl-2")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # the lines under the replay's, however wrapped
    assert "replayed step 23.625 ms against M's 23.445 ms (+0.8%)" in text
    assert (
        "F's cost taken off the host's times: 8.21 µs an op record, 3.157x the probe's (fitted to "
        "within 1% of the 23.430 ms of the F process's own untraced steps, which the probe's "
        "cost replayed to 26.319 ms)"
    ) in text


ENDS = """
    import os
    import signal
    import sys
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    if sys.argv[1] == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize(("how", "code"), [("exit", 3), ("sigterm", 128 + 15)])
def test_xsp_run_passes_the_programs_exit_code_on(tmp_path: Path, how: str, code: int) -> None:
    script = tmp_path / "ends.py"
    script.write_text(textwrap.dedent(ENDS))
    out = tmp_path / "R"
    done = xsp(
        "run", "--levels", "M", "--iterations", "2", "--warmup", "0", "--out", str(out),
        "--", "python", str(script), how,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    program = manifest["runs"][0]["program"]
    assert program == (
        {"exit_code": 3} if how == "exit" else {"signal": 15, "signal_name": "SIGTERM"}
    )
    assert json.loads((out / "M" / "run.json").read_text())["program"] == program


SLOW_IN_MF = """
    import os
    import sys
    import time
    import torch
    import xsp
    for _ in range(2):
        with xsp.iteration():
            torch.ones(4).sum()
    if xsp.current_session().levels == "MF":
        with open(sys.argv[1], "w") as marker:
            marker.write(str(os.getpid()))
        time.sleep(120)
"""


@pytest.mark.parametrize("target", ["group", "parent"])
def test_ctrl_c_stops_the_measurement_and_keeps_what_finished(tmp_path: Path, target: str) -> None:
    import os
    import signal

    from click.testing import CliRunner

    from xsp.cli import main as cli_main

    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(SLOW_IN_MF))
    marker, out = tmp_path / "mf.pid", tmp_path / "R"
    command = [sys.executable, "-m", "xsp", "run", "--levels", "M,MF", "--iterations", "2"]
    command += ["--warmup", "0", "--out", str(out), "--", "python", str(script), str(marker)]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=_env(), start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.time() + 300
    while not (marker.exists() and marker.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    child = int(marker.read_text())
    if target == "group":
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal
    else:
        os.kill(proc.pid, signal.SIGINT)  # the runner alone
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Aborted!" not in stderr and "interrupted" in stderr.strip().splitlines()[-1]
    try:
        os.kill(child, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive  # no orphan left measuring
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [(r["levels"], r["status"]) for r in manifest["runs"]] == [
        ("M", "ok"),
        ("MF", "interrupted"),
    ]
    assert json.loads((out / "MF" / "run.json").read_text())["status"] == "interrupted"
    summary = CliRunner().invoke(cli_main, ["summary", str(out)])
    assert summary.exit_code == 0, summary.output
    assert "level set MF was interrupted; left out" in " ".join(summary.stdout.split())
    analyzed = CliRunner().invoke(cli_main, ["analyze", str(out)])
    assert analyzed.exit_code == 0, analyzed.output


def _session_processes(session: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return found


def _left_behind(session: int) -> list[bytes]:
    """The command lines of the session's processes that are neither zombies nor gone, but for
    multiprocessing's resource tracker (no torch), which may take a moment more to see the end."""
    left = []
    for pid in _session_processes(session):
        with contextlib.suppress(OSError):  # gone meanwhile
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
                left.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
    return [command for command in left if b"resource_tracker" not in command]


def test_ctrl_c_stops_a_forked_level_set_and_its_fork_server(tmp_path: Path) -> None:
    """A zoo model's level sets are forked from a server that imported torch once; Ctrl-C stops
    the level set measuring, keeps its spans, and leaves neither it nor the server behind."""
    import signal

    out = tmp_path / "R"
    command = [sys.executable, "-m", "xsp", "run", "--model", "torchvision:squeezenet1_1"]
    command += ["--levels", "MF", "--iterations", "100000", "--warmup", "0", "--device", "cpu"]
    command += ["--out", str(out)]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=_env(), start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.time() + 300
    while not (out / "MF").exists() and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(6)  # measuring by now: a forked start and squeezenet's build take about 1 s
    assert len(_session_processes(proc.pid)) >= 3  # the runner, the server, the level set
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    left = _session_processes(proc.pid)
    while left and time.time() < deadline:
        time.sleep(0.2)
        left = _session_processes(proc.pid)
    assert left == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["fork_server"] is True
    assert [(r["levels"], r["status"]) for r in manifest["runs"]] == [("MF", "interrupted")]
    assert json.loads((out / "MF" / "run.json").read_text())["iterations_measured"] > 0


def test_the_fork_server_is_gone_when_xsp_run_exits(tmp_path: Path) -> None:
    """The server (torch imported) holds the runner's stdout and stderr: left to exit on its
    own after the runner, it kept a caller's pipe open for its exit. The runner kills it, so
    nothing of the run outlives the runner's own exit."""
    out = tmp_path / "R"
    command = [sys.executable, "-m", "xsp", "run", "--model", "torchvision:squeezenet1_1"]
    command += ["--levels", "M", "--iterations", "2", "--warmup", "0", "--device", "cpu"]
    command += ["--out", str(out)]
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=_env(), start_new_session=True, stdout=stdout, stderr=stderr
        )
        assert proc.wait(timeout=300) == 0, (tmp_path / "stderr").read_text()
    # a process caught mid-exit shows an empty command line: 5 s to finish exiting
    deadline = time.monotonic() + 5
    while (left := _left_behind(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    assert json.loads((out / "manifest.json").read_text())["spec"]["fork_server"] is True


INPUT_BOUND_SCRIPT = """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            time.sleep(0.010)  # 10 ms to read and decode one sample
            return torch.randn(16), torch.randn(1)

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Slow(), batch_size=4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_an_input_bound_loop_shows_its_loading_inside_the_step(tmp_path: Path) -> None:
    """An unmodified loop whose dataset takes 10 ms a sample (batch 4): the step runs from one
    optimizer step to the next, so the M step holds the ~40 ms of loading; the MF run shows it
    as data-loading spans, and the input-bound suggestion names it, measured on the untraced
    step."""
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent(INPUT_BOUND_SCRIPT))
    out = tmp_path / "I"
    done = xsp(
        "run", "--levels", "M,MF", "--iterations", "4", "--warmup", "1", "--out", str(out),
        "--", "python", str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = {r.levels: r for r in open_measurement(out)}
    steps = [r for r in runs["M"].spans().to_pylist() if r["kind"] == "step"]
    assert len(steps) == 4 and min(s["dur_ns"] for s in steps) > 40e6  # 4 samples x 10 ms
    loading = [r for r in runs["MF"].spans().to_pylist() if r["kind"] == "data_loading"]
    assert len(loading) == 4 and all(r["phase"] == "data" for r in loading)
    assert all(r["name"].startswith("enumerate(DataLoader)#") for r in loading)
    assert all("[workers=" not in r["name"] for r in loading)  # the settings are attributes
    assert {(r["data_workers"], r["data_memory"]) for r in loading} == {(0, "pageable")}
    assert min(r["dur_ns"] for r in loading) > 40e6
    analyzed = xsp("analyze", str(out), "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    rows = json.loads(analyzed.stdout)["analyses"]["suggestions"]["rows"]
    found = {r["rule"]: r for r in rows}["input-bound"]
    assert found["evidence"] == "1 DataLoader batches per iteration"
    # the reconstruction fits MF's host spans into M's shorter step: a little under 40 ms
    assert found["gain_ms_per_iteration"] > 36 and 50 < found["share_pct"] <= 100
